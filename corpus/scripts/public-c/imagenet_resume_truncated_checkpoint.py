"""pytorch/examples imagenet/main.py `--resume` after the previous job was killed while saving.

The bug: save_checkpoint() writes straight to checkpoint.pth.tar with torch.save; the job hit its wall-clock
limit mid-write (reproduced here by keeping the first 60% of the bytes), so the file on disk is a zip archive
without its central directory. Resume from the previous good checkpoint, and save to a temporary name then
`os.replace()` it, so a killed job never leaves a half-written file under the real name.
"""

import argparse
import os
import tempfile

import torch
import torch.nn as nn

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
parser.add_argument("--resume", default="", type=str)
parser.add_argument("--lr", default=0.1, type=float)


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


def save_checkpoint(state, is_best, filename="checkpoint.pth.tar"):
    torch.save(state, filename)


def killed_during_save(filename):
    """The SLURM job ran out of time while torch.save was still writing."""
    size = os.path.getsize(filename)
    with open(filename, "r+b") as handle:
        handle.truncate(int(size * 0.6))


def main_worker(args, workdir):
    model = ResNetTiny()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    if args.resume:
        if os.path.isfile(args.resume):
            print("=> loading checkpoint '{}'".format(args.resume))
            checkpoint = torch.load(args.resume, map_location="cpu")
            model.load_state_dict(checkpoint["state_dict"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            print("=> loaded checkpoint '{}' (epoch {})".format(args.resume, checkpoint["epoch"]))
        return
    filename = os.path.join(workdir, "checkpoint.pth.tar")
    save_checkpoint({"epoch": 1, "arch": "resnet18", "state_dict": model.state_dict(), "best_acc1": 0.0,
                     "optimizer": optimizer.state_dict()}, False, filename)
    killed_during_save(filename)


if __name__ == "__main__":
    workdir = tempfile.mkdtemp(prefix="imagenet-")
    main_worker(parser.parse_args([]), workdir)
    main_worker(parser.parse_args(["--resume", os.path.join(workdir, "checkpoint.pth.tar")]), workdir)
