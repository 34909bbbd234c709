"""Class labels read from a CSV as floats and passed straight to CrossEntropyLoss.

The bug: pandas-style numeric parsing gives float labels (0.0, 1.0, 2.0), but
CrossEntropyLoss wants class indices as int64 (Long).
"""

import csv
import io

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

CSV = "\n".join(["f1,f2,f3,f4,label"] + [f"{i * 0.1:.1f},{i * 0.2:.1f},{i * 0.3:.1f},{i * 0.4:.1f},{i % 3}.0" for i in range(32)])


def load():
    rows = list(csv.DictReader(io.StringIO(CSV)))
    features = torch.tensor([[float(r[k]) for k in ("f1", "f2", "f3", "f4")] for r in rows])
    labels = torch.tensor([float(r["label"]) for r in rows])
    return TensorDataset(features, labels)


def main():
    loader = DataLoader(load(), batch_size=8, shuffle=True)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = nn.CrossEntropyLoss()
    for features, labels in loader:
        loss = criterion(model(features), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
