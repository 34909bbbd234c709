"""Regression model validated on the whole validation set in one forward pass.

The bug: predictions are [N, 1] but the targets are [N]; mse_loss broadcasts them to
[N, N] (it only warns), which for N = 400,000 is a 640 GB float32 tensor. Squeeze the
predictions (or keep targets as [N, 1]); on small batches the same bug trains silently
on the wrong loss.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


def make_split(n, g):
    x = torch.randn(n, 8, generator=g)
    y = x @ torch.linspace(-1, 1, 8) + 0.1 * torch.randn(n, generator=g)
    return x, y


def main():
    g = torch.Generator().manual_seed(0)
    x_train, y_train = make_split(2_000, g)
    x_val, y_val = make_split(400_000, g)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(2):
        for i in range(0, len(x_train), 100):
            loss = F.mse_loss(model(x_train[i:i + 100]), y_train[i:i + 100])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            val_loss = F.mse_loss(model(x_val), y_val)
        print(f"epoch {epoch}: train {loss.item():.4f} val {val_loss.item():.4f}")


if __name__ == "__main__":
    main()
