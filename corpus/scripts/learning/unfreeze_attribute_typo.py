"""Transfer learning: `block3.requires_grad = True` sets a plain attribute, so the block meant to be fine-tuned stays frozen."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block1 = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.block2 = nn.Sequential(nn.Linear(32, 32), nn.ReLU())
        self.block3 = nn.Sequential(nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.block3(self.block2(self.block1(x))))


torch.manual_seed(0)
x = torch.randn(512, 16)
y = torch.randint(0, 4, (512,))
loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
model = Net()
model.requires_grad_(False)
model.block3.requires_grad = True  # meant: model.block3.requires_grad_(True)
model.head.requires_grad_(True)
optimizer = torch.optim.Adam([
    {"params": model.block3.parameters(), "lr": 1e-4},
    {"params": model.head.parameters(), "lr": 1e-3},
])
criterion = nn.CrossEntropyLoss()

for epoch in range(3):
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
