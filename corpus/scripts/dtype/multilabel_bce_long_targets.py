"""A multi-label tagger (each sample may carry several of 6 tags) trained with BCEWithLogitsLoss.

The bug: the multi-hot tag vectors are built from Python ints, so they are int64 (Long);
BCEWithLogitsLoss computes a float loss and cannot write it into a Long result.
Build the targets as floats: `torch.tensor(tags, dtype=torch.float32)` or `.float()`.
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

TAGS = ["sport", "politics", "tech", "music", "food", "travel"]


class TaggedPosts(Dataset):
    def __init__(self, n=48):
        generator = torch.Generator().manual_seed(0)
        self.features = torch.randn(n, 24, generator=generator)
        self.tag_sets = [torch.randperm(len(TAGS), generator=generator)[: 1 + i % 3].tolist() for i in range(n)]

    def __len__(self):
        return len(self.tag_sets)

    def __getitem__(self, i):
        multi_hot = torch.tensor([1 if t in self.tag_sets[i] else 0 for t in range(len(TAGS))])
        return self.features[i], multi_hot


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, len(TAGS)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    criterion = nn.BCEWithLogitsLoss()
    for epoch in range(2):
        for features, tags in DataLoader(TaggedPosts(), batch_size=16, shuffle=True):
            loss = criterion(model(features), tags)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
