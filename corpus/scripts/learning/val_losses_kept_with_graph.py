"""A validation loss is computed every step without torch.no_grad() and kept in a list: each keeps its graph and activations."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
criterion = nn.MSELoss()
val_x = torch.randn(64, 128)
val_y = val_x[:, :1] * 0.5
val_history = []

for step in range(320):
    inputs = torch.randn(32, 128)
    targets = inputs[:, :1] * 0.5
    optimizer.zero_grad()
    loss = criterion(model(inputs), targets)
    loss.backward()
    optimizer.step()
    val_history.append(criterion(model(val_x), val_y))  # meant: .item(), under torch.no_grad()
    if step % 100 == 0:
        print(f"step {step} loss {loss.item():.4f} val {val_history[-1].item():.4f}")
