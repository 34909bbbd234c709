"""PyTorch data-loading tutorial (FaceLandmarksDataset with Rescale / RandomCrop / ToTensor), on generated faces.

The bug: the transform pipeline keeps `Rescale(256)` but the `RandomCrop(224)` after it was dropped. Rescale
with an int keeps the aspect ratio (the shorter side becomes 256), so images of different shapes come out with
different widths and default_collate cannot stack them into one batch. Crop (or Rescale((256, 256))) to one size.
"""

import csv
import os
import tempfile

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class FaceLandmarksDataset(Dataset):
    """Face Landmarks dataset."""

    def __init__(self, csv_file, root_dir, transform=None):
        with open(csv_file, newline="") as handle:
            self.landmarks_frame = list(csv.reader(handle))[1:]
        self.root_dir = root_dir
        self.transform = transform

    def __len__(self):
        return len(self.landmarks_frame)

    def __getitem__(self, idx):
        img_name = os.path.join(self.root_dir, self.landmarks_frame[idx][0])
        image = torch.load(img_name)  # HxWxC uint8, as io.imread returns it
        landmarks = torch.tensor([float(v) for v in self.landmarks_frame[idx][1:]]).reshape(-1, 2)
        sample = {"image": image, "landmarks": landmarks}
        if self.transform:
            sample = self.transform(sample)
        return sample


class Rescale:
    """Rescale the image in a sample to a given size (int: the smaller edge, keeping the aspect ratio)."""

    def __init__(self, output_size):
        self.output_size = output_size

    def __call__(self, sample):
        image, landmarks = sample["image"], sample["landmarks"]
        h, w = image.shape[:2]
        if isinstance(self.output_size, int):
            if h > w:
                new_h, new_w = self.output_size * h / w, self.output_size
            else:
                new_h, new_w = self.output_size, self.output_size * w / h
        else:
            new_h, new_w = self.output_size
        new_h, new_w = int(new_h), int(new_w)
        img = F.interpolate(image.permute(2, 0, 1)[None].float(), size=(new_h, new_w), mode="bilinear")[0]
        landmarks = landmarks * torch.tensor([new_w / w, new_h / h])
        return {"image": img.permute(1, 2, 0), "landmarks": landmarks}


class RandomCrop:
    """Crop randomly the image in a sample."""

    def __init__(self, output_size):
        self.output_size = (output_size, output_size)

    def __call__(self, sample):
        image, landmarks = sample["image"], sample["landmarks"]
        h, w = image.shape[:2]
        new_h, new_w = self.output_size
        top, left = int(torch.randint(0, h - new_h + 1, ())), int(torch.randint(0, w - new_w + 1, ()))
        image = image[top: top + new_h, left: left + new_w]
        return {"image": image, "landmarks": landmarks - torch.tensor([left, top])}


class ToTensor:
    """Convert the HxWxC image in a sample to a CxHxW tensor."""

    def __call__(self, sample):
        return {"image": sample["image"].permute(2, 0, 1) / 255.0, "landmarks": sample["landmarks"]}


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, sample):
        for t in self.transforms:
            sample = t(sample)
        return sample


def make_faces(root, n=8):
    """Portraits of different shapes, with 68 landmarks each (faces/face_landmarks.csv)."""
    g = torch.Generator().manual_seed(0)
    shapes = [(300, 300), (400, 300), (300, 450), (320, 320)]
    with open(os.path.join(root, "face_landmarks.csv"), "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["image_name"] + [f"part_{i}_{a}" for i in range(68) for a in "xy"])
        for i in range(n):
            h, w = shapes[i % len(shapes)]
            torch.save(torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=g), os.path.join(root, f"{i}.pt"))
            writer.writerow([f"{i}.pt"] + [f"{v:.1f}" for v in (torch.rand(136, generator=g) * 250).tolist()])


def main():
    root = tempfile.mkdtemp(prefix="faces-")
    make_faces(root)
    transformed_dataset = FaceLandmarksDataset(csv_file=os.path.join(root, "face_landmarks.csv"), root_dir=root,
                                               transform=Compose([Rescale(256), ToTensor()]))
    dataloader = DataLoader(transformed_dataset, batch_size=4, shuffle=False, num_workers=0)
    for i_batch, sample_batched in enumerate(dataloader):
        print(i_batch, sample_batched["image"].size(), sample_batched["landmarks"].size())


if __name__ == "__main__":
    main()
