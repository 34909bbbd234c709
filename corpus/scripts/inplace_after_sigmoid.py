"""A gated residual block that scales its gate in place.

The bug: `gate.mul_(2)` modifies the sigmoid's output, which autograd saved to
compute sigmoid's gradient, so backward() finds the tensor at version 1, not 0.
"""

import torch
import torch.nn as nn


class GatedBlock(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.gate = nn.Linear(dim, dim)

    def forward(self, x):
        gate = torch.sigmoid(self.gate(x))
        gate.mul_(2)
        return x + gate * self.proj(x)


def main():
    torch.manual_seed(0)
    model = nn.Sequential(GatedBlock(), GatedBlock(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    for step in range(5):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
