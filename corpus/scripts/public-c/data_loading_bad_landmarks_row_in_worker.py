"""PyTorch data-loading tutorial (FaceLandmarksDataset) with `num_workers=2`, on generated faces.

The bug: one row of face_landmarks.csv (image 13, from a second annotation tool) lost its last y value, so it
has 135 coordinates; `landmarks.reshape(-1, 2)` in `__getitem__` fails in whichever worker builds that batch,
and the main process re-raises it as "Caught RuntimeError in DataLoader worker process 1". Fix the
annotation row (or validate the CSV when the Dataset is built: every row must have 136 numbers).
"""

import csv
import os
import tempfile

import torch
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
        image = torch.load(img_name)
        landmarks = torch.tensor([float(v) for v in self.landmarks_frame[idx][1:] if v != ""])
        landmarks = landmarks.reshape(-1, 2)
        sample = {"image": image, "landmarks": landmarks}
        if self.transform:
            sample = self.transform(sample)
        return sample


def make_faces(root, n=24):
    g = torch.Generator().manual_seed(0)
    with open(os.path.join(root, "face_landmarks.csv"), "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["image_name"] + [f"part_{i}_{a}" for i in range(68) for a in "xy"])
        for i in range(n):
            torch.save(torch.rand(3, 64, 64, generator=g), os.path.join(root, f"face_{i}.pt"))
            points = [f"{v:.1f}" for v in (torch.rand(136, generator=g) * 64).tolist()]
            if i == 13:
                points[-1] = ""
            writer.writerow([f"face_{i}.pt"] + points)


def main():
    root = tempfile.mkdtemp(prefix="faces-")
    make_faces(root)
    face_dataset = FaceLandmarksDataset(csv_file=os.path.join(root, "face_landmarks.csv"), root_dir=root)
    dataloader = DataLoader(face_dataset, batch_size=4, shuffle=False, num_workers=2)
    for i_batch, sample_batched in enumerate(dataloader):
        print(i_batch, sample_batched["image"].size(), sample_batched["landmarks"].size())


if __name__ == "__main__":
    main()
