"""An inference script that loads its checkpoint onto the GPU it was written for.

The bug: `map_location="cuda:0"` asks torch.load to put the tensors on a CUDA device,
and this machine has none; map_location="cpu" (or the device picked at run time) works.
The checkpoint itself is written here, on the CPU, by the "training" half of the script.
"""

import os
import tempfile

import torch
import torch.nn as nn


def build_model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))


def train_and_save(path):
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 16), torch.randint(0, 3, (64,))
    for _ in range(5):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.save({"model": model.state_dict(), "epoch": 5}, path)


def predict(path, batch):
    checkpoint = torch.load(path, map_location="cuda:0")
    model = build_model()
    model.load_state_dict(checkpoint["model"])
    model.eval()
    with torch.no_grad():
        return model(batch).argmax(dim=1)


def main():
    torch.manual_seed(0)
    path = os.path.join(tempfile.mkdtemp(prefix="ckpt-"), "classifier.pt")
    train_and_save(path)
    print(predict(path, torch.randn(4, 16)).tolist())


if __name__ == "__main__":
    main()
