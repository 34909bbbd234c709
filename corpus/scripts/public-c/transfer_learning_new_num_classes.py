"""PyTorch transfer-learning tutorial (ants vs bees), cut to a CPU run on random images.

The bug: the model is built for the new task's 2 classes first (`ResNetTiny(num_classes=len(class_names))`)
and the ImageNet-trained checkpoint, whose classifier has 1000 outputs, is loaded into it afterwards. The
tutorial loads the pretrained weights into the 1000-class model and only then replaces `model_ft.fc` with
`nn.Linear(num_ftrs, 2)`.
"""

import os
import tempfile

import torch
import torch.nn as nn
import torch.optim as optim
from torch.optim import lr_scheduler


class ResNetTiny(nn.Module):
    """Stands in for torchvision.models.resnet18 (same attribute names, a fraction of the size)."""

    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.avgpool(self.relu(self.bn1(self.conv1(x)))), 1))


def download_pretrained(path):
    """The ImageNet weights (a 1000-class head), as torchvision's model zoo would provide them."""
    torch.save(ResNetTiny(num_classes=1000).state_dict(), path)


def train_model(model, criterion, optimizer, scheduler, dataloaders, num_epochs=1):
    for epoch in range(num_epochs):
        model.train()
        for inputs, labels in dataloaders["train"]:
            optimizer.zero_grad()
            loss = criterion(model(inputs), labels)
            loss.backward()
            optimizer.step()
        scheduler.step()
    return model


def main():
    weights = os.path.join(tempfile.mkdtemp(prefix="hub-"), "resnet18-f37072fd.pth")
    download_pretrained(weights)
    class_names = ["ants", "bees"]
    image_datasets = {"train": torch.utils.data.TensorDataset(torch.randn(16, 3, 32, 32), torch.randint(0, 2, (16,)))}
    dataloaders = {x: torch.utils.data.DataLoader(image_datasets[x], batch_size=4, shuffle=True) for x in ["train"]}

    model_ft = ResNetTiny(num_classes=len(class_names))
    model_ft.load_state_dict(torch.load(weights))
    criterion = nn.CrossEntropyLoss()
    optimizer_ft = optim.SGD(model_ft.parameters(), lr=0.001, momentum=0.9)
    exp_lr_scheduler = lr_scheduler.StepLR(optimizer_ft, step_size=7, gamma=0.1)
    train_model(model_ft, criterion, optimizer_ft, exp_lr_scheduler, dataloaders)


if __name__ == "__main__":
    main()
