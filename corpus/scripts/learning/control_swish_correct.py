"""Control: a hand-written Swish autograd.Function with a correct backward."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Swish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad_output * s * (1 + x * (1 - s))


torch.manual_seed(0)
x = torch.randn(800, 10)
y = torch.sin(x[:, :3].sum(1, keepdim=True))
loader = DataLoader(TensorDataset(x, y), batch_size=40, shuffle=True)
fc1, fc2 = nn.Linear(10, 64), nn.Linear(64, 1)
optimizer = torch.optim.Adam([*fc1.parameters(), *fc2.parameters()], lr=3e-3)
criterion = nn.MSELoss()

for epoch in range(5):
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = criterion(fc2(Swish.apply(fc1(inputs))), targets)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
