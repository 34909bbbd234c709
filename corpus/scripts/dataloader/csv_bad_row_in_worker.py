"""Tabular regression from a CSV file read lazily by the Dataset, with 2 workers.

The bug: row 37 of the exported CSV has "n/a" in the target column; float() raises
ValueError inside __getitem__ in a worker, re-raised as "Caught ValueError in
DataLoader worker process N". The rows need cleaning (or skipping) before training.
"""

import csv
import os
import tempfile

import torch
from torch.utils.data import DataLoader, Dataset


class HousePrices(Dataset):
    def __init__(self, path):
        with open(path, newline="") as handle:
            self.rows = list(csv.DictReader(handle))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        row = self.rows[i]
        features = torch.tensor([float(row["area"]), float(row["rooms"]), float(row["age"])])
        target = torch.tensor([float(row["price"])])
        return features, target


def write_csv(path, n=64):
    g = torch.Generator().manual_seed(0)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["area", "rooms", "age", "price"])
        for i in range(n):
            area, rooms, age = torch.rand(3, generator=g).tolist()
            price = "n/a" if i == 37 else f"{2 * area + rooms - age:.3f}"
            writer.writerow([f"{area:.3f}", f"{rooms:.3f}", f"{age:.3f}", price])


def main():
    path = os.path.join(tempfile.mkdtemp(prefix="houses-"), "train.csv")
    write_csv(path)
    loader = DataLoader(HousePrices(path), batch_size=16, shuffle=False, num_workers=2)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(3):
        for features, target in loader:
            loss = torch.nn.functional.mse_loss(model(features), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
