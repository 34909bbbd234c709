"""A bag-of-words text classifier whose token ids come from a padded float tensor.

The bug: the ids are padded into torch.zeros(...) (float32 by default) and never cast
back, so nn.Embedding receives Float indices; it needs Long (or Int). Pad with
torch.zeros(..., dtype=torch.long) or call `.long()`.
"""

import torch
import torch.nn as nn

SENTENCES = [[5, 17, 42, 8], [3, 99, 12], [7, 7, 64, 81, 2], [11, 30]]
LABELS = [1, 0, 1, 0]


def pad(batch, length=6):
    padded = torch.zeros(len(batch), length)
    for row, ids in enumerate(batch):
        padded[row, : len(ids)] = torch.tensor(ids)
    return padded


class BagOfWords(nn.Module):
    def __init__(self, vocab=128, dim=16, classes=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids):
        return self.head(self.embed(ids).mean(dim=1))


def main():
    torch.manual_seed(0)
    model = BagOfWords()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    ids, labels = pad(SENTENCES), torch.tensor(LABELS)
    for epoch in range(5):
        loss = nn.functional.cross_entropy(model(ids), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
