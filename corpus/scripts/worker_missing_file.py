"""An image-folder dataset whose index lists a file that is not on disk, loaded with 2 workers.

The bug: the index (train.txt) was written before some images were deleted; the
worker opening sample 13 raises FileNotFoundError, re-raised in the main process
as "Caught FileNotFoundError in DataLoader worker process N".
"""

import os
import tempfile

import torch
from torch.utils.data import DataLoader, Dataset


class ImageFolder(Dataset):
    def __init__(self, root, names):
        self.root = root
        self.names = names

    def __len__(self):
        return len(self.names)

    def __getitem__(self, i):
        with open(os.path.join(self.root, self.names[i]), "rb") as handle:
            pixels = torch.frombuffer(bytearray(handle.read()), dtype=torch.uint8)
        return pixels.float().div(255).reshape(4, 4), i % 2


def main():
    root = tempfile.mkdtemp(prefix="images-")
    names = [f"img_{i:03d}.raw" for i in range(32)]
    for name in names:
        with open(os.path.join(root, name), "wb") as handle:
            handle.write(os.urandom(16))
    os.remove(os.path.join(root, names[13]))
    loader = DataLoader(ImageFolder(root, names), batch_size=4, num_workers=2)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for images, labels in loader:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
