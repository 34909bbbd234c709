"""A training loop that logs accuracy and an R^2-style score computed with NumPy.

The bug: the metric helper calls `.numpy()` on the model's output, which is part of the
autograd graph (requires grad), and NumPy cannot follow it. Use
`preds.detach().cpu().numpy()` (or compute metrics under torch.no_grad()).
"""

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def r2_score(preds, target):
    p, t = preds.numpy().ravel(), target.numpy().ravel()
    return 1.0 - np.sum((t - p) ** 2) / np.sum((t - t.mean()) ** 2)


def main():
    torch.manual_seed(0)
    x = torch.randn(120, 4)
    y = x @ torch.tensor([[1.5], [-2.0], [0.3], [0.0]]) + 0.05 * torch.randn(120, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=20, shuffle=True)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(2):
        for features, target in loader:
            preds = model(features)
            loss = nn.functional.mse_loss(preds, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"loss {loss.item():.4f} r2 {r2_score(preds, target):.3f}")


if __name__ == "__main__":
    main()
