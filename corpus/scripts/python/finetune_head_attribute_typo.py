"""Fine-tuning recipe copied from a ResNet example onto a model whose head is named differently.

Not a PyTorch failure: the recipe reads `model.fc.in_features`, but this backbone calls
its last layer `classifier`; nn.Module raises AttributeError ('ConvNet' object has no
attribute 'fc').
"""

import torch
import torch.nn as nn


class ConvNet(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))


def prepare_for_finetuning(model, num_classes):
    for param in model.parameters():
        param.requires_grad = False
    model.fc = nn.Linear(model.fc.in_features, num_classes)  # new trainable head
    return model


def main():
    torch.manual_seed(0)
    model = prepare_for_finetuning(ConvNet(), num_classes=5)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 5, (8,))
    loss = nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()


if __name__ == "__main__":
    main()
