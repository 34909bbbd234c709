"""House-price regression with SGD at lr=4e-4 on unscaled features (areas in the tens): every step overshoots and the loss grows."""
import torch
from torch import nn

torch.manual_seed(0)
rooms = torch.randint(1, 8, (256, 1)).float()
area = rooms * 12 + torch.randn(256, 1) * 5  # square metres, in the tens
age = torch.rand(256, 1) * 40
x = torch.cat([rooms, area, age], dim=1)
y = 3.0 * rooms + 0.1 * area - 0.05 * age + torch.randn(256, 1)
model = nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=4e-4)
criterion = nn.MSELoss()

for step in range(60):
    batch = torch.randint(0, 256, (32,))
    optimizer.zero_grad()
    loss = criterion(model(x[batch]), y[batch])
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4g}")
