"""Two losses over one shared encoder, each with its own backward() call.

The bug: the first backward() frees the encoder's saved activations; the second
backward() through the same graph needs them (retain_graph=True, or sum the losses).
"""

import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(8, 32), nn.Tanh())
    recon_head = nn.Linear(32, 8)
    class_head = nn.Linear(32, 3)
    params = [*encoder.parameters(), *recon_head.parameters(), *class_head.parameters()]
    optimizer = torch.optim.SGD(params, lr=1e-2, momentum=0.9)
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    for step in range(3):
        features = encoder(x)
        recon_loss = nn.functional.mse_loss(recon_head(features), x)
        class_loss = nn.functional.cross_entropy(class_head(features), y)
        optimizer.zero_grad()
        recon_loss.backward()
        class_loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
