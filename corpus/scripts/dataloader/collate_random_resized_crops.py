"""An image classifier whose augmentation crops a random size and forgets to resize back.

The bug: RandomCrop-style augmentation returns crops of different sizes (e.g. [3, 32, 32]
and [3, 28, 30]); default_collate cannot stack them into one batch tensor. A resize to a
fixed (H, W) after the crop is missing.
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class RandomCropImages(Dataset):
    def __init__(self, n=64, size=32):
        g = torch.Generator().manual_seed(0)
        self.images = torch.rand(n, 3, size, size, generator=g)
        self.labels = torch.randint(0, 10, (n,), generator=g)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image = self.images[i]
        if i % 4 == 1:  # "scale augmentation": crop a random-size patch
            top, left = i % 3, i % 5
            image = image[:, top:top + 28, left:left + 30]
        return image, self.labels[i]


def main():
    torch.manual_seed(0)
    loader = DataLoader(RandomCropImages(), batch_size=8, shuffle=False, num_workers=2)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(2):
        for images, labels in loader:
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
