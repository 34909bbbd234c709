"""Sharding 9 samples over 2 ranks without drop_last leaves rank 1 a last batch of one sample: BatchNorm refuses it."""
import datetime

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
data = TensorDataset(torch.randn(9, 6), torch.randint(0, 2, (9,)))
shard = torch.utils.data.Subset(data, list(range(rank, len(data), world)))  # rank 0: 5 samples, rank 1: 4
loader = DataLoader(shard, batch_size=3)  # rank 0: batches of 3 and 2; rank 1: 3 and 1
model = DDP(nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"rank {rank} epoch {epoch} done", flush=True)
dist.destroy_process_group()
