"""Training on samples "fetched from object storage", with a DataLoader timeout as a safety net.

The bug: one object's fetch stalls (simulated with a sleep longer than the loader's
timeout=2): the main process gives up with "DataLoader timed out after 2 seconds".
The slow read needs its own timeout/retry, not a bigger DataLoader timeout.
"""

import time

import torch
from torch.utils.data import DataLoader, Dataset


class RemoteShards(Dataset):
    """Each sample is a feature vector read from a (simulated) remote object store."""

    def __init__(self, n=32, stalled_index=16):
        self.n, self.stalled_index = n, stalled_index

    def __len__(self):
        return self.n

    def fetch(self, i):
        if i == self.stalled_index:
            time.sleep(3)  # the store stops answering for this object
        g = torch.Generator().manual_seed(i)
        return torch.randn(16, generator=g)

    def __getitem__(self, i):
        x = self.fetch(i)
        return x, (x.sum() > 0).long()


def main():
    loader = DataLoader(RemoteShards(), batch_size=8, num_workers=2, timeout=2)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
