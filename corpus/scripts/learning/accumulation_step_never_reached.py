"""Gradient accumulation whose optimizer.step() is never reached: accum_steps exceeds the batches per epoch."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(512, 20)
y = (x[:, :5].sum(1) > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
criterion = nn.CrossEntropyLoss()
accum_steps = 32  # "effective batch 1024"; the epoch has only 16 batches, and i restarts every epoch

for epoch in range(5):
    for i, (inputs, targets) in enumerate(loader):
        loss = criterion(model(inputs), targets) / accum_steps
        loss.backward()
        if (i + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    print(f"epoch {epoch} loss {loss.item() * accum_steps:.4f}")
