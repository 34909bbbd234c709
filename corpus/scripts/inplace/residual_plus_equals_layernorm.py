"""A pre-norm transformer block that adds its residuals in place.

The bug: `x += self.attn(...)` modifies x after LayerNorm saved it for its backward
pass (and the second `x +=` does the same to the first sum), so backward() finds the
saved tensor at a newer version. Write the residual out of place: `x = x + ...`.
"""

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x += self.attn(h, h, h, need_weights=False)[0]
        x += self.mlp(self.norm2(x))
        return x


def main():
    torch.manual_seed(0)
    embed = nn.Embedding(100, 32)
    blocks = nn.Sequential(Block(), Block())
    head = nn.Linear(32, 100)
    params = [*embed.parameters(), *blocks.parameters(), *head.parameters()]
    optimizer = torch.optim.AdamW(params, lr=3e-4)
    tokens = torch.randint(0, 100, (4, 12))
    for step in range(3):
        logits = head(blocks(embed(tokens)))
        loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 100), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
