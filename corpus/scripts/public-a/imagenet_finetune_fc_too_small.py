"""pytorch/examples imagenet/main.py, fine-tuning a pretrained ResNet on a 12-class image folder.

The bug: the classifier is replaced with nn.Linear(512, args.num_classes) and --num-classes
keeps its default of 10, but the training folder has 12 class folders, so ImageFolder gives
labels 0..11 and labels 10 and 11 are past the head's 10 outputs. Build the head from the
dataset: nn.Linear(512, len(train_dataset.classes)).
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's resnet18 layout, narrowed so that it runs in seconds on a CPU."""

    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = BasicBlock(64, 64)
        self.layer2 = BasicBlock(64, 128, 2)
        self.layer3 = BasicBlock(128, 256, 2)
        self.layer4 = BasicBlock(256, 512, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


class ImageFolder(Dataset):
    """Stands in for torchvision.datasets.ImageFolder over train/<class>/*.jpg (12 class folders)."""

    def __init__(self, root):
        self.root = root
        self.classes = ["cat", "dog", "fox", "hen", "owl", "pig", "ram", "yak", "ant", "bee", "cow", "elk"]
        generator = torch.Generator().manual_seed(0)
        self.samples = [(torch.randn(3, 64, 64, generator=generator), i % len(self.classes)) for i in range(96)]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        return self.samples[index]


def train(train_loader, model, criterion, optimizer, epoch, device, args):
    model.train()
    for i, (images, target) in enumerate(train_loader):
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % args.print_freq == 0:
            print(f"Epoch: [{epoch}][{i}/{len(train_loader)}]\tLoss {loss.item():.4f}")


def main():
    parser = argparse.ArgumentParser(description='PyTorch ImageNet Training')
    parser.add_argument('data', nargs='?', default='data/pets')
    parser.add_argument('--num-classes', default=10, type=int)
    parser.add_argument('-b', '--batch-size', default=16, type=int)
    parser.add_argument('--lr', '--learning-rate', default=0.1, type=float)
    parser.add_argument('-p', '--print-freq', default=2, type=int)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device("cpu")

    model = ResNet()  # models.__dict__['resnet18'](pretrained=True) in the original
    model.fc = nn.Linear(model.fc.in_features, args.num_classes)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)

    train_dataset = ImageFolder(args.data + '/train')
    train_loader = DataLoader(train_dataset, batch_size=args.batch_size, shuffle=True)
    for epoch in range(2):
        train(train_loader, model, criterion, optimizer, epoch, device, args)


if __name__ == '__main__':
    main()
