"""A Dataset that builds its samples on the GPU, loaded with worker processes.

The bug: `__getitem__` creates tensors with `device="cuda"`, and the DataLoader's workers
are forked from a parent that has already initialised CUDA (the model is on the GPU), so the
first sample raises "Cannot re-initialize CUDA in forked subprocess". Keep the Dataset on the
CPU and move each batch in the training loop (or use the 'spawn' start method). On a machine
without a GPU everything is on the CPU and it trains.
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Features(Dataset):
    def __init__(self, n=256):
        generator = torch.Generator().manual_seed(0)
        self.rows = torch.randn(n, 16, generator=generator)
        self.targets = (self.rows.sum(dim=1, keepdim=True) > 0).float()

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return torch.tensor(self.rows[i].tolist(), device=DEVICE), self.targets[i].to(DEVICE)


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(DEVICE)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(Features(), batch_size=32, shuffle=True, num_workers=2)
    for epoch in range(2):
        for rows, targets in loader:
            loss = nn.functional.binary_cross_entropy_with_logits(model(rows), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    print(f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
