"""A training script written on an Apple-silicon Mac, run on a Linux machine.

The bug: the device is hard-coded to "mps" (Apple's Metal backend); this PyTorch build
has no MPS support, so `model.to("mps")` fails. Choose the device at run time:
"cuda" if available, else "mps" if torch.backends.mps.is_available(), else "cpu".
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

DEVICE = torch.device("mps")


def main():
    torch.manual_seed(0)
    x = torch.randn(128, 6)
    y = x @ torch.randn(6, 1) + 0.1 * torch.randn(128, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1)).to(DEVICE)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(3):
        for features, target in loader:
            features, target = features.to(DEVICE), target.to(DEVICE)
            loss = nn.functional.mse_loss(model(features), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: mse {loss.item():.4f}")


if __name__ == "__main__":
    main()
