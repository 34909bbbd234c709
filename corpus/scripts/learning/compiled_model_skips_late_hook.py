"""Sensor readings sit near 5.0 and vary by about 0.05; a forward pre-hook standardises them. The hook is registered
after the first call of the torch.compile'd model (a sanity-check batch), and dynamo does not guard on hooks added
later (torch._dynamo.config.skip_nnmodule_hook_guards): the compiled graph never runs it. The network trains on the
raw readings, whose signal is a hundredth of their offset, and its loss stays at log(4); the eager model with the same
hook learns."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
signal = torch.randn(1200, 16)
score = signal @ torch.randn(16)
y = torch.bucketize(score, score.quantile(torch.tensor([0.25, 0.5, 0.75])))  # 4 balanced classes
readings = 5.0 + 0.05 * signal
loader = DataLoader(TensorDataset(readings, y), batch_size=60, shuffle=True)

model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
compiled = torch.compile(model)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
criterion = nn.CrossEntropyLoss()

inputs, targets = next(iter(loader))
print(f"sanity check: output {tuple(compiled(inputs).shape)}, loss {criterion(compiled(inputs), targets).item():.3f}")

mean, std = readings.mean(0), readings.std(0)


def standardise(module, args):
    return ((args[0] - mean) / std,)


model.register_forward_pre_hook(standardise)

for epoch in range(5):
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = criterion(compiled(inputs), targets)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
