"""A character-level language model trained with truncated backpropagation through time.

The bug: the GRU's hidden state is carried from one chunk to the next without
.detach(), so the second chunk's backward() runs back into the first chunk's graph,
which the first backward() already freed. Carry `hidden = hidden.detach()` between chunks.
"""

import torch
import torch.nn as nn

TEXT = "to be or not to be that is the question whether tis nobler in the mind to suffer " * 4
CHUNK = 32


class CharRNN(nn.Module):
    def __init__(self, vocab, dim=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, vocab)

    def forward(self, ids, hidden=None):
        features, hidden = self.gru(self.embed(ids), hidden)
        return self.out(features), hidden


def main():
    torch.manual_seed(0)
    chars = sorted(set(TEXT))
    ids = torch.tensor([chars.index(c) for c in TEXT]).unsqueeze(0)
    model = CharRNN(len(chars))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    hidden = None
    for start in range(0, ids.size(1) - CHUNK - 1, CHUNK):
        inputs, targets = ids[:, start : start + CHUNK], ids[:, start + 1 : start + CHUNK + 1]
        logits, hidden = model(inputs, hidden)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()


if __name__ == "__main__":
    main()
