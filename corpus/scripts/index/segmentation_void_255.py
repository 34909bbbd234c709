"""Semantic segmentation on VOC-style masks, whose object borders are labelled 255 ("void").

The bug: the masks mark uncertain border pixels with 255, and the loss is built without
ignore_index=255, so the 4-class cross_entropy sees class 255. Use
nn.CrossEntropyLoss(ignore_index=255).
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

VOID = 255


class Scenes(Dataset):
    def __init__(self, n=8, size=32, classes=4):
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randn(n, 3, size, size, generator=generator)
        self.masks = torch.randint(0, classes, (n, size, size), generator=generator)
        self.masks[:, ::8, :] = VOID  # object boundaries

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], self.masks[i]


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    for images, masks in DataLoader(Scenes(), batch_size=4, shuffle=True):
        loss = criterion(model(images), masks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
