"""Linear regression on unnormalised features (prices in the thousands) with SGD lr=0.1, on the GPU when there is one.

The bug: with inputs of magnitude ~1000 the gradient is huge, so lr=0.1 overshoots every
step; the loss grows to inf and then nan within a few steps and the script keeps going.
On a GPU, triage's per-step NaN check is a flag set on the device and read later, so it
must still find the step. Normalise the features and/or lower the learning rate.
"""

import torch
import torch.nn as nn


def make_data(n=256):
    g = torch.Generator().manual_seed(0)
    area = torch.rand(n, 1, generator=g) * 3000 + 500  # square feet
    rooms = torch.randint(1, 6, (n, 1), generator=g).float()
    price = 150 * area + 10_000 * rooms + torch.randn(n, 1, generator=g) * 5_000
    return torch.cat([area, rooms], dim=1), price / 1000


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x, y = (t.to(device) for t in make_data())
    model = nn.Linear(2, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(40):
        for i in range(0, len(x), 64):
            loss = nn.functional.mse_loss(model(x[i:i + 64]), y[i:i + 64])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if epoch % 10 == 0:
            print(f"epoch {epoch}: mse {loss.item():.4g}")
    print("final weights", model.weight.data.tolist())


if __name__ == "__main__":
    main()
