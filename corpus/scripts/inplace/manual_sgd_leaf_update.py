"""Linear regression "from scratch" with a hand-written gradient-descent update.

The bug: `w -= lr * w.grad` runs with autograd on, and w is a leaf that requires grad,
so the in-place update is refused. Do the update inside `with torch.no_grad():`
(and zero the gradients afterwards), or use torch.optim.SGD.
"""

import torch

TRUE_W, TRUE_B = torch.tensor([[2.0], [-3.4]]), 4.2


def main():
    torch.manual_seed(0)
    features = torch.randn(200, 2)
    labels = features @ TRUE_W + TRUE_B + 0.01 * torch.randn(200, 1)
    w = torch.normal(0, 0.01, size=(2, 1), requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    lr, batch_size = 0.03, 10
    for epoch in range(3):
        for start in range(0, len(features), batch_size):
            x, y = features[start : start + batch_size], labels[start : start + batch_size]
            loss = ((x @ w + b - y) ** 2 / 2).mean()
            loss.backward()
            w -= lr * w.grad
            b -= lr * b.grad
            w.grad.zero_()
            b.grad.zero_()
        print(f"epoch {epoch + 1}, loss {loss.item():f}")


if __name__ == "__main__":
    main()
