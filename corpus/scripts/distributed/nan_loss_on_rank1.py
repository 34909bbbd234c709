"""Rank 1's shard holds a row of inf features; its loss turns NaN and the script's own check stops it."""
import datetime

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Linear(5, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(4):
    x, y = torch.randn(8, 5), torch.randn(8, 1)
    if rank == 1 and step == 2:
        x[3] = float("inf")  # a corrupt record in rank 1's shard
    loss = nn.functional.mse_loss(model(x), y)
    if not torch.isfinite(loss):
        raise FloatingPointError(f"loss is {loss.item()} at step {step} on rank {rank}")
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"rank {rank} step {step} loss {loss.item():.3f}", flush=True)
dist.destroy_process_group()
