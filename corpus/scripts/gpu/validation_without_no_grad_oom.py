"""A validation loop without `torch.no_grad()` that sums the loss tensors.

The bug: `total = total + loss` keeps every validation batch's autograd graph alive, and
with it every activation the backward pass would need, so memory climbs batch after batch
until the GPU runs out part-way through validation. Training steps free their graphs in
`backward()`, validation never calls it. The CPU smoke run validates on a few small
batches and finishes.
"""

import torch
import torch.nn as nn


def make_model(width):
    return nn.Sequential(nn.Linear(1024, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 10))


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.type == "cuda"
    width, batch, batches = (8192, 16_384, 400) if on_gpu else (64, 32, 4)
    model = make_model(width).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(3):
        x = torch.randn(batch, 1024, device=device)
        y = torch.randint(0, 10, (batch,), device=device)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    total = torch.zeros((), device=device)
    for i in range(batches):
        x = torch.randn(batch, 1024, device=device)
        y = torch.randint(0, 10, (batch,), device=device)
        total = total + nn.functional.cross_entropy(model(x), y)
    print(f"validation loss {total.item() / batches:.3f}")


if __name__ == "__main__":
    main()
