"""Rank 1's batches never reach the auxiliary head, so DDP on rank 1 never finishes reducing that head's gradient."""
import datetime

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)
        self.aux = nn.Linear(8, 2)

    def forward(self, x, with_aux):
        h = torch.relu(self.body(x))
        out = self.head(h)
        return out + self.aux(h) if with_aux else out


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    with_aux = rank == 0  # only rank 0's data has auxiliary labels
    loss = nn.functional.cross_entropy(model(x, with_aux), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"rank {rank} step {step}", flush=True)
dist.destroy_process_group()
