"""A tabular classifier whose class labels were encoded with NumPy as int32.

The bug: `labels.astype(np.int32)` (the default int on Windows, or a "save memory" cast)
becomes a torch.int32 tensor; cross_entropy wants class indices as int64 (Long).
Convert with `torch.from_numpy(labels).long()`.
"""

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

SPECIES = ["setosa", "versicolor", "virginica"]


def load():
    rng = np.random.default_rng(0)
    names = rng.choice(SPECIES, size=90)
    codes = np.searchsorted(SPECIES, names).astype(np.int32)
    features = (rng.normal(size=(90, 4)) + codes[:, None]).astype(np.float32)
    return torch.from_numpy(features), torch.from_numpy(codes)


def main():
    torch.manual_seed(0)
    features, labels = load()
    loader = DataLoader(TensorDataset(features, labels), batch_size=15, shuffle=True)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, len(SPECIES)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        correct = 0
        for x, y in loader:
            logits = model(x)
            loss = nn.functional.cross_entropy(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            correct += (logits.argmax(1) == y).sum().item()
        print(f"epoch {epoch}: accuracy {correct / len(labels):.2f}")


if __name__ == "__main__":
    main()
