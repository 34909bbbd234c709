"""Evaluate a model trained with nn.DataParallel: the checkpoint was saved from the wrapper.

The bug: `wrapped.state_dict()` was saved, so every key starts with "module."
("module.encoder.0.weight"); the plain model for inference expects "encoder.0.weight".
Save `wrapped.module.state_dict()` or strip the prefix when loading.
"""

import os
import tempfile

import torch
import torch.nn as nn


class Classifier(nn.Module):
    def __init__(self, features=20, hidden=64, classes=5):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(self.encoder(x))


def train(path):
    # A multi-GPU training script: DataParallel wants the model on the first GPU where there is one.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    wrapped = nn.DataParallel(Classifier().to(device))
    optimizer = torch.optim.Adam(wrapped.parameters(), lr=1e-3)
    x, y = torch.randn(32, 20, device=device), torch.randint(0, 5, (32,), device=device)
    for _ in range(5):
        loss = nn.functional.cross_entropy(wrapped(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.save(wrapped.state_dict(), path)


def evaluate(path):
    model = Classifier()
    model.load_state_dict(torch.load(path, map_location="cpu"))
    model.eval()
    with torch.no_grad():
        print(model(torch.randn(4, 20)).argmax(1))


if __name__ == "__main__":
    checkpoint = os.path.join(tempfile.mkdtemp(prefix="ckpt-"), "classifier.pt")
    train(checkpoint)
    evaluate(checkpoint)
