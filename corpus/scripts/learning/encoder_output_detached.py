"""The encoder's output goes through `.data` before the head: no gradient ever reaches the encoder."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(24, 48), nn.Tanh(), nn.Linear(48, 16))
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = self.encoder(x).data  # "normalise" the features in place below
        h = (h - h.mean(0)) / (h.std(0) + 1e-5)
        return self.head(h)


torch.manual_seed(0)
x = torch.randn(600, 24)
y = (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()
loader = DataLoader(TensorDataset(x, y), batch_size=50, shuffle=True)
model = Classifier()
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
criterion = nn.CrossEntropyLoss()

for epoch in range(4):
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
