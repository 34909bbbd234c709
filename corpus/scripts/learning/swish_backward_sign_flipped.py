"""A hand-written Swish autograd.Function whose backward returns the gradient with the wrong sign."""
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
        return grad_output * -(s * (1 + x * (1 - s)))  # the derivative is s * (1 + x * (1 - s))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 64)
        self.fc2 = nn.Linear(64, 64)
        self.fc3 = nn.Linear(64, 1)

    def forward(self, x):
        return self.fc3(Swish.apply(self.fc2(Swish.apply(self.fc1(x)))))


torch.manual_seed(0)
x = torch.randn(800, 10)
y = torch.sin(x[:, :3].sum(1, keepdim=True))
loader = DataLoader(TensorDataset(x, y), batch_size=40, shuffle=True)
model = MLP()
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
criterion = nn.MSELoss()

for epoch in range(5):
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
