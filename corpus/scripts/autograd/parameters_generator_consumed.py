"""A script that logs its parameter count, then builds the optimizer from the same iterator.

The bug: model.parameters() returns a generator; counting the parameters consumes it, so
the optimizer receives an exhausted iterator, i.e. an empty parameter list. Call
model.parameters() again (or keep `params = list(model.parameters())`).
"""

import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(4, 16, 5), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(16, 2))
    params = model.parameters()
    print(f"trainable parameters: {sum(p.numel() for p in params if p.requires_grad):,}")
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    signals, labels = torch.randn(32, 4, 50), torch.randint(0, 2, (32,))
    for step in range(5):
        loss = nn.functional.cross_entropy(model(signals), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
