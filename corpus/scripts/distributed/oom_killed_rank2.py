"""Rank 2 caches its whole shard in memory; the kernel's OOM killer takes it (emulated: the rank SIGKILLs itself)."""
import datetime
import os
import signal

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
rank = dist.get_rank()
cache = []
for step in range(3):
    if rank == 2 and step == 1:
        cache.append(torch.empty(64 * 2**20, dtype=torch.uint8))  # the growing cache
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does, without exhausting this machine
    total = torch.tensor([float(step)])
    dist.all_reduce(total)
    print(f"rank {rank} step {step} total {total.item()}", flush=True)
dist.destroy_process_group()
