"""A transformer encoder whose positional table is a plain tensor attribute, not a buffer.

The bug: `self.pe = torch.zeros(...)` is not registered with register_buffer, so
`model.to("cuda")` leaves it on the CPU and the first forward pass mixes devices.
Needs a GPU to fail; on a CPU-only machine the devices agree and it trains.
"""

import math

import torch
import torch.nn as nn


class PositionalEncoding(nn.Module):
    def __init__(self, dim, max_len=128):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div = torch.exp(torch.arange(0, dim, 2) * (-math.log(10000.0) / dim))
        self.pe = torch.zeros(max_len, dim)
        self.pe[:, 0::2] = torch.sin(position * div)
        self.pe[:, 1::2] = torch.cos(position * div)

    def forward(self, x):
        return x + self.pe[: x.size(1)]


class Encoder(nn.Module):
    def __init__(self, vocab=100, dim=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = PositionalEncoding(dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=64, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.head(self.encoder(self.pos(self.embed(tokens))))


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Encoder().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    tokens = torch.randint(0, 100, (8, 20), device=device)
    for step in range(3):
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.reshape(-1, 100), tokens.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
