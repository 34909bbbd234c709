"""An MLP whose hidden layer applies tanh, then a shared ReLU(inplace=True) "to save memory".

The bug: tanh saves its output for the backward pass (d tanh = 1 - tanh^2), and the
in-place ReLU overwrites that output, so backward() finds it modified. Use
nn.ReLU() (inplace=False) after tanh/sigmoid, or drop the redundant activation.
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(nn.Module):
    def __init__(self, inputs=6, hidden=32):
        super().__init__()
        self.act = nn.ReLU(inplace=True)
        self.fc1 = nn.Linear(inputs, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        x = self.act(self.fc1(x))
        x = self.act(torch.tanh(self.fc2(x)))
        return self.out(x)


def main():
    torch.manual_seed(0)
    x = torch.randn(96, 6)
    y = x[:, :1] * 2 - x[:, 1:2]
    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for features, target in DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True):
        loss = nn.functional.mse_loss(model(features), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
