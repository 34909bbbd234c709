"""Binary churn classifier whose model outputs [N, 1] logits, trained against [N] labels.

The bug: the last Linear has one output, so logits are [32, 1], while the labels are a
flat vector of 32; BCEWithLogitsLoss needs both the same size (squeeze the logits, or
unsqueeze the labels).
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def make_data(n=128):
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(n, 10, generator=generator)
    churned = (features[:, 0] + 0.5 * features[:, 3] > 0).float()
    return TensorDataset(features, churned)


def main():
    loader = DataLoader(make_data(), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4)
    criterion = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(2.0))
    model.train()
    for epoch in range(3):
        for features, churned in loader:
            logits = model(features)
            loss = criterion(logits, churned)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
