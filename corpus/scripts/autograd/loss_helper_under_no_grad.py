"""A shared loss helper, decorated with @torch.no_grad() for validation, reused for training.

The bug: the decorator turns off graph recording inside compute_loss, so the training
loss it returns has no grad_fn and backward() cannot run. Drop the decorator and wrap
the validation loop in `with torch.no_grad():` instead.
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


@torch.no_grad()
def compute_loss(model, batch):
    features, labels = batch
    return nn.functional.cross_entropy(model(features), labels)


def main():
    torch.manual_seed(0)
    x, y = torch.randn(160, 8), torch.randint(0, 4, (160,))
    train = DataLoader(TensorDataset(x[:128], y[:128]), batch_size=32, shuffle=True)
    val = DataLoader(TensorDataset(x[128:], y[128:]), batch_size=32)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(2):
        model.eval()
        val_loss = sum(compute_loss(model, batch).item() for batch in val) / len(val)
        model.train()
        for batch in train:
            loss = compute_loss(model, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: val loss {val_loss:.3f}")


if __name__ == "__main__":
    main()
