"""A GAN loop that updates the discriminator before the generator's backward pass.

The bug: d_fake = D(fake) is computed once and reused; optimizer_d.step() then changes
D's weights in place, and the generator loss backpropagates through the same d_fake,
whose graph saved the old weights. Recompute D(fake) after the discriminator step (and
use fake.detach() for the discriminator loss).
"""

import torch
import torch.nn as nn

LATENT = 16


def main():
    torch.manual_seed(0)
    generator = nn.Sequential(nn.Linear(LATENT, 32), nn.ReLU(), nn.Linear(32, 2))
    discriminator = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    optimizer_g = torch.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizer_d = torch.optim.Adam(discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()
    real_data = torch.randn(256, 2) * 0.5 + torch.tensor([2.0, -1.0])
    for step in range(8):
        real = real_data[torch.randint(0, 256, (32,))]
        fake = generator(torch.randn(32, LATENT))
        d_real, d_fake = discriminator(real), discriminator(fake)

        loss_d = bce(d_real, torch.ones_like(d_real)) + bce(d_fake, torch.zeros_like(d_fake))
        optimizer_d.zero_grad()
        loss_d.backward(retain_graph=True)
        optimizer_d.step()

        loss_g = bce(d_fake, torch.ones_like(d_fake))
        optimizer_g.zero_grad()
        loss_g.backward()
        optimizer_g.step()


if __name__ == "__main__":
    main()
