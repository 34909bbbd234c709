"""A DistributedDataParallel-ready script launched as a single process on a CPU-only machine.

The bug: the script pins its GPU with torch.cuda.set_device(LOCAL_RANK) without checking
that CUDA exists; on a CPU-only PyTorch build that call fails. Guard it with
torch.cuda.is_available() and fall back to the CPU (and the gloo backend).
"""

import os

import torch
import torch.nn as nn


def setup():
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def main():
    device = setup()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(32, 8, device=device), torch.randint(0, 2, (32,), device=device)
    for step in range(10):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
