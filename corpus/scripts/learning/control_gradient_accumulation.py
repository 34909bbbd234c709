"""Control: gradient accumulation over 4 batches, losses logged as floats; nothing is wrong."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(1024, 20)
y = (x[:, :5].sum(1) > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
criterion = nn.CrossEntropyLoss()
accum_steps = 4
history = []

for epoch in range(3):
    for i, (inputs, targets) in enumerate(loader):
        loss = criterion(model(inputs), targets) / accum_steps
        loss.backward()
        history.append(loss.item() * accum_steps)
        if (i + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    print(f"epoch {epoch} loss {sum(history[-64:]) / 64:.4f}")
