"""A tiny self-attention block whose padding mask is built for the wrong sequence length.

The bug: the mask is made from MAX_LEN (16) while the batch is padded to its own
longest sequence (12), so adding it to the 12x12 attention scores fails.
"""

import torch
import torch.nn as nn

MAX_LEN = 16


class SelfAttention(nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.scale = dim ** -0.5

    def forward(self, x, mask):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) * self.scale
        scores = scores + mask[:, None, :]
        return scores.softmax(dim=-1) @ v


def padding_mask(lengths):
    positions = torch.arange(MAX_LEN)[None, :]
    return torch.where(positions < lengths[:, None], 0.0, float("-inf"))


def main():
    torch.manual_seed(0)
    lengths = torch.tensor([12, 7, 9, 12])
    tokens = torch.randn(4, int(lengths.max()), 32)
    block = SelfAttention()
    optimizer = torch.optim.SGD(block.parameters(), lr=1e-2, momentum=0.9)
    out = block(tokens, padding_mask(lengths))
    out.pow(2).mean().backward()
    optimizer.step()


if __name__ == "__main__":
    main()
