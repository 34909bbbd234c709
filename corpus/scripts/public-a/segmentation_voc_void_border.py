"""torchvision references/segmentation/train.py (FCN on Pascal VOC), with the criterion rewritten.

The bug: VOC masks mark object borders and "difficult" pixels with 255 (void). The reference
criterion passes ignore_index=255 to cross_entropy; this copy dropped it when adding class
weights, so the first void pixel is read as class 255 of 21.
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class VOCSegmentation(Dataset):
    """Stands in for torchvision.datasets.VOCSegmentation: images and masks with 21 classes plus 255 borders."""

    def __init__(self, n=16, size=48):
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randn(n, 3, size, size, generator=generator)
        masks = torch.zeros(n, size, size, dtype=torch.int64)
        for i in range(n):
            cls = 1 + i % 20
            masks[i, 12:36, 12:36] = cls
            masks[i, 11, 11:37] = 255  # the void outline VOC draws around each object
            masks[i, 36, 11:37] = 255
        self.masks = masks

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        return self.images[index], self.masks[index]


class FCNHead(nn.Sequential):
    def __init__(self, in_channels, channels):
        inter_channels = in_channels // 4
        super().__init__(
            nn.Conv2d(in_channels, inter_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(inter_channels),
            nn.ReLU(),
            nn.Dropout(0.1),
            nn.Conv2d(inter_channels, channels, 1),
        )


class FCN(nn.Module):
    """torchvision's fcn_resnet50 layout (backbone, classifier, upsampling, dict output), small enough for a CPU."""

    def __init__(self, num_classes=21):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, 2, 1), nn.BatchNorm2d(64), nn.ReLU(),
        )
        self.classifier = FCNHead(64, num_classes)

    def forward(self, x):
        input_shape = x.shape[-2:]
        features = self.backbone(x)
        x = self.classifier(features)
        x = nn.functional.interpolate(x, size=input_shape, mode="bilinear", align_corners=False)
        return {"out": x}


def criterion(inputs, target):
    losses = {}
    class_weights = torch.ones(21)
    class_weights[0] = 0.5  # background dominates VOC
    for name, x in inputs.items():
        losses[name] = nn.functional.cross_entropy(x, target, weight=class_weights)
    if len(losses) == 1:
        return losses["out"]
    return losses["out"] + 0.5 * losses["aux"]


def train_one_epoch(model, criterion, optimizer, data_loader, device, epoch, print_freq):
    model.train()
    for i, (image, target) in enumerate(data_loader):
        image, target = image.to(device), target.to(device)
        output = model(image)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % print_freq == 0:
            print(f"Epoch: [{epoch}] [{i}/{len(data_loader)}] loss: {loss.item():.4f}")


def main(args):
    torch.manual_seed(0)
    device = torch.device(args.device)
    dataset = VOCSegmentation()
    data_loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = FCN(num_classes=21).to(device)
    params_to_optimize = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    optimizer = torch.optim.SGD(params_to_optimize, lr=args.lr, momentum=0.9, weight_decay=1e-4)
    for epoch in range(args.epochs):
        train_one_epoch(model, criterion, optimizer, data_loader, device, epoch, args.print_freq)


def get_args_parser():
    parser = argparse.ArgumentParser(description="PyTorch Segmentation Training")
    parser.add_argument("--device", default="cpu", type=str)
    parser.add_argument("-b", "--batch-size", default=4, type=int)
    parser.add_argument("--epochs", default=2, type=int)
    parser.add_argument("--lr", default=0.01, type=float)
    parser.add_argument("--print-freq", default=2, type=int)
    return parser


if __name__ == "__main__":
    args = get_args_parser().parse_args()
    main(args)
