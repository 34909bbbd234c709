"""A two-level U-Net for segmentation, fed 50x50 tiles instead of a multiple of 4.

The bug: the 25x25 map halves to 12x12 (MaxPool2d floors), the transposed conv brings it
back to 24x24, and the skip connection still holds 25x25, so torch.cat fails. Pad the
input to a multiple of 4, or crop/pad the upsampled map to the skip's size.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())


class UNet(nn.Module):
    def __init__(self, classes=3):
        super().__init__()
        self.enc1, self.enc2, self.mid = block(1, 8), block(8, 16), block(16, 32)
        self.pool = nn.MaxPool2d(2)
        self.up2 = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.dec2 = block(32, 16)
        self.up1 = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec1 = block(16, 8)
        self.out = nn.Conv2d(8, classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        m = self.mid(self.pool(e2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.out(d1)


def main():
    torch.manual_seed(0)
    tiles = torch.randn(4, 1, 50, 50)
    masks = torch.randint(0, 3, (4, 50, 50))
    model = UNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(2):
        loss = F.cross_entropy(model(tiles), masks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
