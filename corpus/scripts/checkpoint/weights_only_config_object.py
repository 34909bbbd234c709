"""Save a checkpoint with the training config object inside it, then load it for inference.

The bug: the checkpoint stores a TrainConfig dataclass instance; since torch 2.6
torch.load defaults to weights_only=True, which refuses to unpickle arbitrary classes:
"Unsupported global: GLOBAL __main__.TrainConfig". Store `dataclasses.asdict(config)`,
or allow the class with torch.serialization.add_safe_globals([TrainConfig]).
"""

import dataclasses
import os
import tempfile

import torch
import torch.nn as nn


@dataclasses.dataclass
class TrainConfig:
    vocab_size: int = 1000
    dim: int = 64
    lr: float = 3e-4
    dropout: float = 0.1


def build(config):
    return nn.Sequential(nn.Embedding(config.vocab_size, config.dim), nn.Dropout(config.dropout), nn.Linear(config.dim, config.vocab_size))


def save(path):
    config = TrainConfig()
    model = build(config)
    torch.save({"config": config, "model": model.state_dict(), "step": 1200}, path)


def load_for_inference(path):
    checkpoint = torch.load(path, map_location="cpu")
    model = build(checkpoint["config"])
    model.load_state_dict(checkpoint["model"])
    return model.eval()


if __name__ == "__main__":
    path = os.path.join(tempfile.mkdtemp(prefix="lm-"), "step1200.pt")
    save(path)
    model = load_for_inference(path)
    print(model(torch.randint(0, 1000, (2, 8))).shape)
