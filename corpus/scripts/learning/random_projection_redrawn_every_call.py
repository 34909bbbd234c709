"""A random-features layer draws its projection matrix inside forward(), from NumPy: every call projects the
inputs with a new matrix, so the classifier after it sees unrelated features each step and never learns.
Seeding torch and NumPy once at the top makes the run repeat, not the step: each call still draws a new matrix."""
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class RandomFeatures(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features

    def forward(self, x):
        # random Fourier features: sqrt(2/D) * cos(x W + b), W ~ N(0, 0.25²), b ~ U(0, 2 pi)
        projection = torch.from_numpy(np.random.randn(self.in_features, self.out_features).astype("float32")) * 0.25
        phase = torch.from_numpy(np.random.uniform(0, 2 * np.pi, self.out_features).astype("float32"))
        return (2 / self.out_features) ** 0.5 * torch.cos(x @ projection + phase)


torch.manual_seed(0)
np.random.seed(0)
x = torch.randn(1200, 16)
y = x[:, :6].argmax(1)
loader = DataLoader(TensorDataset(x, y), batch_size=60, shuffle=True)
model = nn.Sequential(RandomFeatures(16, 128), nn.Linear(128, 6))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
criterion = nn.CrossEntropyLoss()

for epoch in range(4):
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
