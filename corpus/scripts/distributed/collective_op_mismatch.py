"""Rank 0 broadcasts the best checkpoint's score while ranks 1 and 2 all-reduce their own: the collectives do not pair."""
import datetime

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
rank = dist.get_rank()
score = torch.tensor([0.5 + rank])
if rank == 0:
    dist.broadcast(score, src=0)
else:
    dist.all_reduce(score)
print(f"rank {rank}: {score.item()}", flush=True)
dist.destroy_process_group()
