"""A training script that logs metrics to Weights & Biases, run in a fresh environment.

Not a PyTorch failure: `wandb` is imported at the top of the script but is not installed
in this interpreter's environment: ModuleNotFoundError before any training starts.
"""

import os

import torch
import torch.nn as nn
import wandb


def main():
    run = wandb.init(project="tabular-baseline", mode=os.environ.get("WANDB_MODE", "offline"))
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(256, 12), torch.randn(256, 1)
    for epoch in range(5):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        run.log({"epoch": epoch, "loss": loss.item()})
    run.finish()


if __name__ == "__main__":
    main()
