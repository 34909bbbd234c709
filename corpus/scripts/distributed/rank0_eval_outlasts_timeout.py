"""Rank 0 evaluates alone after the epoch, longer than the process group's timeout; rank 1's barrier gives up."""
import datetime
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=4))
rank = dist.get_rank()
for step in range(2):
    grad = torch.ones(3)
    dist.all_reduce(grad)


def evaluate():
    time.sleep(30)  # a slow validation set, only on rank 0
    return 0.5


if rank == 0:
    print("rank 0: evaluating", flush=True)
    evaluate()
dist.barrier()
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
