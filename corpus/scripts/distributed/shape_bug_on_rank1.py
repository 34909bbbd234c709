"""Rank 1 reads its shard with an extra feature column, so its Linear layer gets 17 features instead of 16."""
import datetime

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
features = 16 if rank != 1 else 17  # rank 1's shard was written with an id column left in
for step in range(3):
    x, y = torch.randn(4, features), torch.randint(0, 2, (4,))
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"rank {rank} step {step} loss {loss.item():.3f}", flush=True)
dist.destroy_process_group()
