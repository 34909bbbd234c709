"""A training script reading its hyper-parameters from a config dict with the wrong key.

Not a PyTorch failure: the config says "lr" and the script asks for "learning_rate".
"""

import json

import torch

CONFIG = json.loads('{"lr": 0.01, "epochs": 2, "batch_size": 16, "hidden": 32}')


def build_optimizer(model, config):
    return torch.optim.SGD(model.parameters(), lr=config["learning_rate"])


def main():
    model = torch.nn.Sequential(torch.nn.Linear(4, CONFIG["hidden"]), torch.nn.ReLU(), torch.nn.Linear(CONFIG["hidden"], 1))
    optimizer = build_optimizer(model, CONFIG)
    x, y = torch.randn(CONFIG["batch_size"], 4), torch.randn(CONFIG["batch_size"], 1)
    for epoch in range(CONFIG["epochs"]):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
