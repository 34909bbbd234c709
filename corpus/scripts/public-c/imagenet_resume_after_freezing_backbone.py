"""pytorch/examples imagenet/main.py `--resume`, after the script was changed to fine-tune only the classifier.

The bug: the checkpoint was written by the full-network run, whose SGD optimizer held all 5 parameters; the
resumed run freezes the backbone and builds `torch.optim.SGD(model.fc.parameters(), ...)` (2 parameters), then
calls `optimizer.load_state_dict(checkpoint['optimizer'])`. The model weights load; the optimizer state cannot.
Build the optimizer as in the run that saved it, or skip loading its state when the set of trained
parameters changed (start the new phase with a fresh optimizer).
"""

import argparse
import os
import tempfile

import torch
import torch.nn as nn

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
parser.add_argument("--resume", default="", type=str)
parser.add_argument("--lr", default=0.1, type=float)
parser.add_argument("--finetune-fc", action="store_true")


class ResNetTiny(nn.Module):
    """Stands in for torchvision.models.resnet18 (same attribute names, a fraction of the size)."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.avgpool(self.relu(self.bn1(self.conv1(x)))), 1))


def main_worker(args, workdir):
    model = ResNetTiny()
    if args.finetune_fc:
        for name, param in model.named_parameters():
            param.requires_grad = name.startswith("fc.")
        optimizer = torch.optim.SGD(model.fc.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    else:
        optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    criterion = nn.CrossEntropyLoss()
    if args.resume:
        print("=> loading checkpoint '{}'".format(args.resume))
        checkpoint = torch.load(args.resume, map_location="cpu")
        args.start_epoch = checkpoint["epoch"]
        model.load_state_dict(checkpoint["state_dict"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        print("=> loaded checkpoint '{}' (epoch {})".format(args.resume, checkpoint["epoch"]))
    images, target = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    loss = criterion(model(images), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch.save({"epoch": 1, "arch": "resnet18", "state_dict": model.state_dict(), "best_acc1": 0.0,
                "optimizer": optimizer.state_dict()}, os.path.join(workdir, "checkpoint.pth.tar"))


if __name__ == "__main__":
    workdir = tempfile.mkdtemp(prefix="imagenet-")
    main_worker(parser.parse_args([]), workdir)
    main_worker(parser.parse_args(["--finetune-fc", "--resume", os.path.join(workdir, "checkpoint.pth.tar")]), workdir)
