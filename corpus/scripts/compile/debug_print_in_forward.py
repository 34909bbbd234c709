"""A small vision transformer block compiled with fullgraph=True, with a leftover debug print.

The bug: forward() still prints the attention tensor's statistics from a debugging
session: print(f"...", attn.shape, attn.max()) - Dynamo cannot put print() of a tensor
into a graph, and fullgraph=True turns that graph break into an error. Remove the
print (or log outside the compiled module, or use torch._dynamo.config.reorderable_logging_functions).
"""

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, dim=48, heads=4):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        h, attn = self.attn(h, h, h, need_weights=True)
        print("attn", attn.shape, attn.max())  # debugging the attention collapse
        x = x + h
        return x + self.mlp(self.norm2(x))


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 48), Block(), Block(), nn.Linear(48, 10))
    model = torch.compile(model, fullgraph=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(3):
        patches, labels = torch.randn(4, 16, 12), torch.randint(0, 10, (4,))
        loss = nn.functional.cross_entropy(model(patches).mean(1), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
