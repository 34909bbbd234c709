"""A tiny language model trained with gradient clipping that refuses non-finite norms.

The bug: the attention scores are computed as exp(q.k) by hand (no max-subtraction),
which overflows to inf for large logits; the gradients become NaN and
clip_grad_norm_(..., error_if_nonfinite=True) stops the run. Use softmax (which is
stable) or subtract the row max before exp.
"""

import torch
import torch.nn as nn


class TinyAttentionLM(nn.Module):
    def __init__(self, vocab=100, dim=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, tokens):
        q, k, v = self.qkv(self.embed(tokens)).chunk(3, dim=-1)
        scores = torch.exp(q @ k.transpose(1, 2))  # hand-rolled softmax
        weights = scores / scores.sum(dim=-1, keepdim=True)
        return self.out(weights @ v)


def main():
    torch.manual_seed(0)
    model = TinyAttentionLM()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    for step in range(50):
        tokens = torch.randint(0, 100, (8, 17))
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 100), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0, error_if_nonfinite=True)
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.3f} grad norm {norm.item():.2f}")


if __name__ == "__main__":
    main()
