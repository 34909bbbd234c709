"""Passing control: variable-length sequences padded by a collate_fn and loaded by two workers.

The correct versions of corpus bugs: pad_sequence in collate, batch_first=True,
logits squeezed to the labels' [N] shape, float targets, hidden state not carried over.
"""

import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
from torch.utils.data import DataLoader, Dataset


class Sequences(Dataset):
    def __init__(self, n=64):
        generator = torch.Generator().manual_seed(0)
        self.items = [torch.randn(int(torch.randint(5, 20, (1,), generator=generator)), 6, generator=generator) for _ in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        sequence = self.items[i]
        return sequence, float(sequence[:, 0].mean() > 0)


def collate(batch):
    sequences, labels = zip(*batch)
    lengths = torch.tensor([len(s) for s in sequences])
    return pad_sequence(sequences, batch_first=True), lengths, torch.tensor(labels)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(6, 24, batch_first=True)
        self.head = nn.Linear(24, 1)

    def forward(self, padded, lengths):
        _, (hidden, _) = self.lstm(pack_padded_sequence(padded, lengths, batch_first=True, enforce_sorted=False))
        return self.head(hidden[-1]).squeeze(-1)


def main():
    torch.manual_seed(0)
    loader = DataLoader(Sequences(), batch_size=16, shuffle=True, num_workers=2, collate_fn=collate, persistent_workers=True)
    model = Classifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    for epoch in range(2):
        total = 0.0
        for padded, lengths, labels in loader:
            loss = nn.functional.binary_cross_entropy_with_logits(model(padded, lengths), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        print(f"epoch {epoch}: mean loss {total / len(loader):.3f}")


if __name__ == "__main__":
    main()
