"""Plain self-attention over a whole long document at once.

The bug: the score matrix is batch x heads x L x L. The GPU run uses the full 65,536-token
context, so `q @ k.transpose(-2, -1)` asks for 2 x 8 x 65536 x 65536 float32 values, 256 GiB
in one allocation, more than any single GPU holds; no batch size fixes it. The CPU smoke
run uses 512 tokens and finishes. Attention has to be computed in tiles
(`F.scaled_dot_product_attention` does so) or over shorter windows.
"""

import math

import torch
import torch.nn as nn


class SelfAttention(nn.Module):
    def __init__(self, dim=256, heads=8):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, length, dim = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(dim // self.heads)
        mixed = scores.softmax(dim=-1) @ v
        return self.out(mixed.transpose(1, 2).reshape(b, length, dim))


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    context = 65_536 if device.type == "cuda" else 512  # the CPU run is a smoke test
    model = nn.Sequential(nn.Embedding(32_000, 256), SelfAttention(), nn.Linear(256, 32_000)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    tokens = torch.randint(0, 32_000, (2, context), device=device)
    for step in range(2):
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 32_000), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
