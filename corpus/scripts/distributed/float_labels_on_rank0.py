"""Rank 0 loads labels from a CSV as floats; cross_entropy wants class indices (Long). Rank 1's loader casts them."""
import datetime

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Linear(4, 3))
x = torch.randn(6, 4)
labels = torch.tensor([0.0, 2.0, 1.0, 1.0, 0.0, 2.0]).reshape(6, 1)  # a (6, 1) float column from the CSV
y = labels if rank == 0 else labels.squeeze(1).long()
loss = nn.functional.cross_entropy(model(x), y)
loss.backward()
print(f"rank {rank} loss {loss.item():.3f}", flush=True)
dist.destroy_process_group()
