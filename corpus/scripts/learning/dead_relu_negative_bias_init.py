"""A custom init sets every hidden bias to -4: all ReLU units are dead from the first step and the hidden layer never learns."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.rand(800, 10)  # features in [0, 1)
y = (x[:, 0] > x[:, 1]).long()
loader = DataLoader(TensorDataset(x, y), batch_size=40, shuffle=True)
model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))


def init_weights(module):
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.05)
        nn.init.constant_(module.bias, -4.0)  # meant as a sparsity prior


model[:2].apply(init_weights)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
criterion = nn.CrossEntropyLoss()

for epoch in range(4):
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
