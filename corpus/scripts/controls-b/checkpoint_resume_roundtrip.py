"""Passing control: train, save a checkpoint of plain data, resume it with torch.load's defaults.

The fixed form of the checkpoint bugs: the inner model's state_dict (no "module."
prefix), the config as a dict (loads under weights_only=True), an atomic save, and a
model built with the checkpoint's own num_classes.
"""

import os
import tempfile

import torch
import torch.nn as nn


def build(config):
    return nn.Sequential(nn.Linear(config["features"], config["hidden"]), nn.ReLU(), nn.Linear(config["hidden"], config["num_classes"]))


def train(config, path):
    model = build(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    x, y = torch.randn(64, config["features"]), torch.randint(0, config["num_classes"], (64,))
    for _ in range(5):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    state = {"config": config, "model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 5}
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def resume(path):
    checkpoint = torch.load(path, map_location="cpu")
    model = build(checkpoint["config"])
    model.load_state_dict(checkpoint["model"])
    optimizer = torch.optim.Adam(model.parameters(), lr=checkpoint["config"]["lr"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    print(f"resumed at epoch {checkpoint['epoch']}")


if __name__ == "__main__":
    path = os.path.join(tempfile.mkdtemp(prefix="ckpt-"), "last.pt")
    train({"features": 10, "hidden": 32, "num_classes": 3, "lr": 1e-3}, path)
    resume(path)
