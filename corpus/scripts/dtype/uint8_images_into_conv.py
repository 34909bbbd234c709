"""A CNN fed raw uint8 pixel arrays straight from an image decoder.

The bug: the dataset returns the decoded bytes (torch.uint8, 0..255) without converting
them; Conv2d's weights are float32, so the first convolution refuses the input.
Convert with `img.float().div(255)` (what ToTensor() does) in __getitem__.
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class RawImages(Dataset):
    def __init__(self, n=32):
        generator = torch.Generator().manual_seed(0)
        self.pixels = torch.randint(0, 256, (n, 28, 28, 3), dtype=torch.uint8, generator=generator)  # HWC, as decoded
        self.labels = torch.randint(0, 4, (n,), generator=generator)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.pixels[i].permute(2, 0, 1), self.labels[i]  # HWC -> CHW, still uint8


def main():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(16, 4),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for images, labels in DataLoader(RawImages(), batch_size=8, shuffle=True):
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
