"""Train on tensors written by a separate preprocessing step (prepare_data.py), read with torch.load.

Not a PyTorch failure: the preprocessing step was never run in this checkout (or the
script is started from another directory), so the relative path
data/processed/train_tensors.pt does not exist: FileNotFoundError.
"""

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="data/processed/train_tensors.pt")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    return parser.parse_args()


def main():
    args = parse_args()
    blob = torch.load(args.data)
    loader = DataLoader(TensorDataset(blob["x"], blob["y"]), batch_size=32, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(blob["x"].shape[1], 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
