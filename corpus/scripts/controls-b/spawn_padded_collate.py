"""Passing control: variable-length sequences padded by a module-level collate_fn, a spawned worker.

The fixed form of the lambda-collate and ragged-batch bugs: a module-level function is
picklable under spawn, and pad_sequence makes equal-size batches.
"""

import torch
import torch.nn as nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset


class Sequences(Dataset):
    def __init__(self, n=32):
        g = torch.Generator().manual_seed(0)
        self.items = [torch.randint(1, 200, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g) for _ in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i], int(self.items[i].sum() % 2)


def pad_collate(batch):
    tokens = pad_sequence([t for t, _ in batch], batch_first=True, padding_value=0)
    return tokens, torch.tensor([y for _, y in batch])


def main():
    torch.manual_seed(0)
    loader = DataLoader(Sequences(), batch_size=8, num_workers=1, multiprocessing_context="spawn", collate_fn=pad_collate)
    embed, head = nn.Embedding(200, 16, padding_idx=0), nn.Linear(16, 2)
    optimizer = torch.optim.Adam([*embed.parameters(), *head.parameters()], lr=1e-2)
    for tokens, labels in loader:
        loss = nn.functional.cross_entropy(head(embed(tokens).mean(1)), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"last loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
