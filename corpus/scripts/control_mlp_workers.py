"""Passing control: a small MLP trained for two epochs with two DataLoader workers."""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = (x.sum(dim=1, keepdim=True) > 0).float()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, num_workers=2)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(2):
        total = 0.0
        for features, target in loader:
            loss = nn.functional.binary_cross_entropy_with_logits(model(features), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        print(f"epoch {epoch} mean loss {total / len(loader):.4f}")


if __name__ == "__main__":
    main()
