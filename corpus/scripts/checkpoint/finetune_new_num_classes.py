"""Fine-tune a pretrained 10-class backbone on a new 3-class task.

The bug: the new model is built with num_classes=3 and the full pretrained state_dict
(whose classifier has 10 outputs) is loaded strictly:
"size mismatch for classifier.weight: copying a param with shape torch.Size([10, 128])
from checkpoint, the shape in current model is torch.Size([3, 128])".
Drop the classifier keys (or load with the head replaced after loading).
"""

import os
import tempfile

import torch
import torch.nn as nn


class SmallConvNet(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.classifier = nn.Linear(128, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))


def pretrain(path):
    model = SmallConvNet(num_classes=10)
    torch.save({"epoch": 90, "state_dict": model.state_dict()}, path)


def finetune(path, num_classes=3):
    model = SmallConvNet(num_classes=num_classes)
    checkpoint = torch.load(path, map_location="cpu")
    model.load_state_dict(checkpoint["state_dict"])
    optimizer = torch.optim.SGD(model.classifier.parameters(), lr=0.01)
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, num_classes, (8,))
    loss = nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()


if __name__ == "__main__":
    path = os.path.join(tempfile.mkdtemp(prefix="pretrained-"), "backbone_in10.pth")
    pretrain(path)
    finetune(path)
