"""Rank 1 materialises a pairwise-distance matrix of its whole shard on the host: the allocation fails (memory limit)."""
import datetime
import resource

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
rank = dist.get_rank()
if rank == 1:
    # The container's memory limit, for this rank only (keeps the machine safe).
    resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
n = 1000 if rank == 0 else 60000
points = torch.randn(n, 3)
distances = torch.cdist(points, points)  # n x n floats: 14 GB for rank 1's shard
mean = distances.mean().reshape(1)
dist.all_reduce(mean)
print(f"rank {rank}: mean distance {mean.item():.3f}", flush=True)
dist.destroy_process_group()
