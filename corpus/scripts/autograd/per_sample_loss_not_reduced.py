"""Importance-weighted training: each sample's loss is scaled by a weight from the sampler.

The bug: the criterion is built with reduction="none" to apply the weights, but the
weighted losses are never reduced, so loss is a vector of 16 values and backward()
has no scalar to start from. Reduce it: `(losses * weights).mean()`.
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    x, y = torch.randn(64, 12), torch.randint(0, 3, (64,))
    weights = torch.rand(64) + 0.5  # from an importance sampler
    loader = DataLoader(TensorDataset(x, y, weights), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    criterion = nn.CrossEntropyLoss(reduction="none")
    for features, labels, sample_weights in loader:
        losses = criterion(model(features), labels)
        loss = losses * sample_weights
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
