"""Semi-supervised training where unlabeled samples carry the label -1.

The bug: the dataset marks unlabeled samples with -1, but the loss is built without
ignore_index=-1, so cross_entropy treats -1 as a class index. Use
nn.CrossEntropyLoss(ignore_index=-1) (or drop the unlabeled rows from the supervised loss).
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

UNLABELED = -1


def make_dataset(n=80, labeled_fraction=0.25):
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(n, 10, generator=generator)
    labels = torch.randint(0, 3, (n,), generator=generator)
    hidden = torch.rand(n, generator=generator) > labeled_fraction
    labels[hidden] = UNLABELED
    return TensorDataset(features, labels)


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    supervised = nn.CrossEntropyLoss()
    for features, labels in DataLoader(make_dataset(), batch_size=16, shuffle=True):
        logits = model(features)
        probs = logits.softmax(dim=1)
        entropy = -(probs * probs.clamp_min(1e-8).log()).sum(dim=1).mean()  # for the unlabeled part
        loss = supervised(logits, labels) + 0.1 * entropy
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
