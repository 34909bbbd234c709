"""Passing control: a small CNN on synthetic images, two DataLoader workers, a checkpoint round trip.

The correct versions of several corpus bugs: pixels converted to float in __getitem__,
a pooled head that fits any image size, labels 0..C-1, map_location="cpu" on load.
"""

import os
import tempfile

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Shapes(Dataset):
    def __init__(self, n=96, size=16, classes=3):
        generator = torch.Generator().manual_seed(0)
        self.labels = torch.randint(0, classes, (n,), generator=generator)
        self.pixels = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=generator)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        image = self.pixels[i].float().div(255)
        image[int(self.labels[i])] += 0.5  # a class-dependent signal in one channel
        return image, self.labels[i]


def build_model(classes=3):
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, classes),
    )


def main():
    torch.manual_seed(0)
    loader = DataLoader(Shapes(), batch_size=32, shuffle=True, num_workers=2, persistent_workers=True)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(2):
        for images, labels in loader:
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.3f}")
    path = os.path.join(tempfile.mkdtemp(prefix="ckpt-"), "cnn.pt")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    restored = build_model()
    restored.load_state_dict(torch.load(path, map_location="cpu", weights_only=True)["model"])
    restored.eval()
    with torch.no_grad():
        correct = sum((restored(x).argmax(1) == y).sum().item() for x, y in loader)
    print(f"accuracy after reload: {correct / len(loader.dataset):.2f}")


if __name__ == "__main__":
    main()
