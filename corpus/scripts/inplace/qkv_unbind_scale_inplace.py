"""A hand-written multi-head attention that scales the queries in place.

The bug: q, k, v come from qkv.unbind(0), which returns views that autograd forbids
modifying in place; `q *= self.scale` raises. Scale out of place: `q = q * self.scale`.
"""

import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim=48, heads=6):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q *= self.scale
        attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, t, c))


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 48), Attention(), nn.LayerNorm(48), nn.Linear(48, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 10, 16), torch.randn(8, 10, 1)
    for step in range(3):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
