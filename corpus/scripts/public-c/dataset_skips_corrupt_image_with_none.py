"""An ImageFolder-style Dataset that skips unreadable images by returning None (a common forum recipe),
trained as in pytorch/examples imagenet/main.py with 2 loader workers.

The bug: `__getitem__` returns None for the one truncated file (`except OSError: return None`), and
default_collate cannot batch None. Either drop such files when the Dataset is built, or give the DataLoader a
collate_fn that filters them: `lambda batch: default_collate([s for s in batch if s is not None])` (a module-level
function under spawn).
"""

import os
import tempfile

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class ImageFolderSkipBad(Dataset):
    def __init__(self, root):
        self.samples = []
        for class_index, class_name in enumerate(sorted(os.listdir(root))):
            for name in sorted(os.listdir(os.path.join(root, class_name))):
                self.samples.append((os.path.join(root, class_name, name), class_index))

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, target = self.samples[index]
        try:
            with open(path, "rb") as f:
                data = f.read()
            if len(data) != 3 * 32 * 32:
                raise OSError(f"image file is truncated ({len(data)} bytes not processed)")
        except OSError:
            return None
        image = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(3, 32, 32).float() / 255
        return image, target


def make_image_folder(root, per_class=12):
    g = torch.Generator().manual_seed(0)
    for class_name in ("n01440764", "n01443537"):
        os.makedirs(os.path.join(root, class_name))
        for i in range(per_class):
            pixels = torch.randint(0, 256, (3 * 32 * 32,), dtype=torch.uint8, generator=g)
            if class_name == "n01443537" and i == 5:
                pixels = pixels[:1000]  # the download was cut short
            with open(os.path.join(root, class_name, f"{class_name}_{i}.raw"), "wb") as f:
                f.write(bytes(pixels.tolist()))


def main():
    root = tempfile.mkdtemp(prefix="imagenet-")
    make_image_folder(root)
    train_loader = DataLoader(ImageFolderSkipBad(root), batch_size=6, shuffle=False, num_workers=2)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)
    for i, (images, target) in enumerate(train_loader):
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
