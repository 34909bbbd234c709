"""A small CNN trained on 32x32 crops, then the data pipeline is switched to 64x64 images.

The bug: fc1 was sized for the 8x8 map that 32x32 inputs leave after two 2x poolings
(32*8*8 = 2048); 64x64 inputs leave a 16x16 map, so 32*16*16 = 8192 features arrive.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

IMAGE_SIZE = 64  # was 32 when the model was written


class SmallCNN(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(32 * 8 * 8, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(x.size(0), -1)
        return self.fc2(F.relu(self.fc1(x)))


def main():
    torch.manual_seed(0)
    images = torch.randn(48, 3, IMAGE_SIZE, IMAGE_SIZE)
    labels = torch.randint(0, 5, (48,))
    loader = DataLoader(TensorDataset(images, labels), batch_size=16, shuffle=True)
    model = SmallCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(2):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
