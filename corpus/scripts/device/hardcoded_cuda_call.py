"""A tutorial-style training script copied from a GPU box and run on a CPU-only laptop.

The bug: the script calls `.cuda()` unconditionally; this PyTorch build has no CUDA,
so moving the model fails before training starts. Pick the device with
torch.cuda.is_available() and use `.to(device)`.
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class MLP(nn.Module):
    def __init__(self, inputs=20, hidden=64, classes=4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


def main():
    torch.manual_seed(0)
    x, y = torch.randn(256, 20), torch.randint(0, 4, (256,))
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = MLP().cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(2):
        for features, labels in loader:
            features, labels = features.cuda(), labels.cuda()
            loss = nn.functional.cross_entropy(model(features), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
