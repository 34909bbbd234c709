"""A 10-class classifier trained on labels numbered 1..10 instead of 0..9, on whatever device there is.

The bug: the labels are 1-based, so label 10 is out of range for a 10-way head (valid
targets are 0..9). On a GPU the loss kernel's assertion fails on the device and the
error surfaces later, as "CUDA error: device-side assert triggered", at whichever call
next synchronises; on a CPU the same batch raises "Target 10 is out of bounds" at once.
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Digits(Dataset):
    def __init__(self, n=512):
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randn(n, 1, 8, 8, generator=generator)
        self.labels = torch.randint(1, 11, (n,), generator=generator)  # 1..10, as in the source files

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(Digits(), batch_size=64, shuffle=True)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    running = 0.0
    for step, (images, labels) in enumerate(loader):
        images, labels = images.to(device), labels.to(device)
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        running += loss.item()
    print(f"mean loss {running / (step + 1):.3f}")


if __name__ == "__main__":
    main()
