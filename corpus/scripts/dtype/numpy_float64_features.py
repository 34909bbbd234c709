"""A regression model trained on features prepared with NumPy.

The bug: NumPy arrays default to float64, torch.from_numpy keeps that dtype, and the
model's weights are float32, so the first Linear sees Double input and Float weights.
Convert with `.float()` (or build the arrays as np.float32).
"""

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def load_features(n=200):
    rng = np.random.default_rng(0)
    raw = rng.normal(size=(n, 8))
    standardized = (raw - raw.mean(axis=0)) / raw.std(axis=0)
    target = standardized @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(n, 1))
    return torch.from_numpy(standardized), torch.from_numpy(target)


def main():
    torch.manual_seed(0)
    features, target = load_features()
    loader = DataLoader(TensorDataset(features, target), batch_size=25, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(3):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
