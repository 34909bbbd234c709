"""A hand-written binary cross-entropy on saturated sigmoid outputs, under anomaly detection.

The bug: sigmoid(40.0) is exactly 1.0 in float32, so log(1 - p) is log(0) = -inf and
(1 - y) * -inf = nan; use BCEWithLogitsLoss (or clamp p) instead.
"""

import torch
import torch.nn as nn


def bce(p, y):
    return -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()


def main():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    with torch.no_grad():
        model.bias.fill_(40.0)  # a badly initialised logit layer
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.ones(8, 1)
    torch.autograd.set_detect_anomaly(True)
    for step in range(3):
        loss = bce(torch.sigmoid(model(x)), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
