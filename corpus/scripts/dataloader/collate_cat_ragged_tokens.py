"""Token sequences of different lengths concatenated into one batch by a hand-written collate_fn.

The bug: collate_fn concatenates the samples along dimension 0 after unsqueezing, which needs
every sequence to have the same length; the dataset's sequences vary from 12 to 16 tokens, so
torch.cat fails in the DataLoader worker. Pad the sequences first (pad_sequence) or bucket them by length.
"""

import torch
from torch.utils.data import DataLoader, Dataset


class Sentences(Dataset):
    def __init__(self, n=64):
        g = torch.Generator().manual_seed(0)
        self.items = [torch.randint(1, 1000, (12 + i % 5,), generator=g) for i in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


def collate(samples):
    return torch.cat([s.unsqueeze(0) for s in samples], dim=0)


def main():
    loader = DataLoader(Sentences(), batch_size=8, shuffle=False, num_workers=2, collate_fn=collate)
    embed = torch.nn.Embedding(1000, 16)
    for step, tokens in enumerate(loader):
        print(step, embed(tokens).mean().item())


if __name__ == "__main__":
    main()
