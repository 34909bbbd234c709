"""An adaptive-computation model compiled with fullgraph=True for speed.

The bug: forward() exits early when the running halting score passes a threshold,
`if halt.mean() > 0.99: break` - Python control flow on a tensor's value. Dynamo
cannot trace a branch that depends on data and, with fullgraph=True, refuses to split
the graph. Use a fixed number of steps with torch.where masking, or drop fullgraph.
"""

import torch
import torch.nn as nn


class AdaptiveRefiner(nn.Module):
    def __init__(self, dim=32, max_steps=6):
        super().__init__()
        self.step = nn.Linear(dim, dim)
        self.halt = nn.Linear(dim, 1)
        self.max_steps = max_steps

    def forward(self, x):
        halted = torch.zeros(x.shape[0], 1)
        for _ in range(self.max_steps):
            x = x + torch.tanh(self.step(x))
            halted = halted + torch.sigmoid(self.halt(x))
            if halted.mean() > 0.99:
                break
        return x


def main():
    torch.manual_seed(0)
    model = AdaptiveRefiner()
    compiled = torch.compile(model, fullgraph=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(3):
        x = torch.randn(16, 32)
        loss = compiled(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
