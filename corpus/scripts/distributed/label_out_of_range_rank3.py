"""Four ranks; rank 3's shard holds the label 10 of a class added after the model was built with 10 outputs."""
import datetime

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
rank = dist.get_rank()
torch.manual_seed(rank)
model = DDP(nn.Linear(12, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(5, 12)
    y = torch.randint(0, 10, (5,))
    if rank == 3 and step == 1:
        y[2] = 10  # the new class
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"rank {rank} step {step}", flush=True)
dist.destroy_process_group()
