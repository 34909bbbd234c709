"""Control: random Fourier features drawn once, in __init__, from torch's seeded generator and kept as a buffer:
the step is deterministic and the classifier on top learns. Triage must stay silent."""
import math

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class RandomFeatures(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        # sqrt(2/D) * cos(x W + b), W ~ N(0, 0.25²), b ~ U(0, 2 pi): fixed for the whole run
        self.register_buffer("projection", torch.randn(in_features, out_features) * 0.25)
        self.register_buffer("phase", torch.rand(out_features) * 2 * math.pi)
        self.scale = (2 / out_features) ** 0.5

    def forward(self, x):
        return self.scale * torch.cos(x @ self.projection + self.phase)


torch.manual_seed(0)
x = torch.randn(1200, 16)
y = x[:, :6].argmax(1)
loader = DataLoader(TensorDataset(x, y), batch_size=60, shuffle=True)
model = nn.Sequential(RandomFeatures(16, 128), nn.Linear(128, 6))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
criterion = nn.CrossEntropyLoss()

for epoch in range(4):
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
