"""A 10-class classifier trained on labels numbered 1..10 instead of 0..9.

The bug: the dataset's labels are 1-based, so label 10 is out of range for a
10-way output (valid targets are 0..9). On a GPU the same bug is a device-side assert.
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Digits(Dataset):
    def __init__(self, n=200):
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randn(n, 1, 8, 8, generator=generator)
        self.labels = torch.randint(1, 11, (n,), generator=generator)  # 1..10, as in the source files

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


def main():
    torch.manual_seed(0)
    loader = DataLoader(Digits(), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for images, labels in loader:
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
