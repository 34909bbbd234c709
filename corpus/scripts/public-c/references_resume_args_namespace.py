"""torchvision references/classification/train.py, cut to a CPU run: save every epoch, then resume.

The bug: the checkpoint dict holds `"args": args`, the argparse.Namespace of the run (train.py does this), and
since torch 2.6 `torch.load` defaults to weights_only=True, whose unpickler refuses any class it has not been
told is safe. Allow it with `torch.serialization.add_safe_globals([argparse.Namespace])` (or load a checkpoint
you trust with weights_only=False).
"""

import argparse
import os
import tempfile

import torch
import torch.nn as nn


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


def save_on_master(*args, **kwargs):
    torch.save(*args, **kwargs)  # utils.save_on_master: only rank 0 writes


def train_one_epoch(model, criterion, optimizer, data_loader):
    model.train()
    for image, target in data_loader:
        loss = criterion(model(image), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main(args):
    dataset = torch.utils.data.TensorDataset(torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,)))
    data_loader = torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True)
    model = ResNetTiny()
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=args.lr_step_size, gamma=args.lr_gamma)
    model_without_ddp = model

    if args.resume:
        checkpoint = torch.load(args.resume, map_location="cpu")
        model_without_ddp.load_state_dict(checkpoint["model"])
        if not args.test_only:
            optimizer.load_state_dict(checkpoint["optimizer"])
            lr_scheduler.load_state_dict(checkpoint["lr_scheduler"])
        args.start_epoch = checkpoint["epoch"] + 1

    for epoch in range(args.start_epoch, args.epochs):
        train_one_epoch(model, criterion, optimizer, data_loader)
        lr_scheduler.step()
        if args.output_dir:
            checkpoint = {
                "model": model_without_ddp.state_dict(),
                "optimizer": optimizer.state_dict(),
                "lr_scheduler": lr_scheduler.state_dict(),
                "epoch": epoch,
                "args": args,
            }
            save_on_master(checkpoint, os.path.join(args.output_dir, f"model_{epoch}.pth"))
            save_on_master(checkpoint, os.path.join(args.output_dir, "checkpoint.pth"))


def get_args_parser():
    parser = argparse.ArgumentParser(description="PyTorch Classification Training")
    parser.add_argument("--epochs", default=1, type=int)
    parser.add_argument("--lr", default=0.1, type=float)
    parser.add_argument("--momentum", default=0.9, type=float)
    parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
    parser.add_argument("--label-smoothing", default=0.0, type=float, dest="label_smoothing")
    parser.add_argument("--lr-step-size", default=30, type=int)
    parser.add_argument("--lr-gamma", default=0.1, type=float)
    parser.add_argument("--output-dir", default=".", type=str)
    parser.add_argument("--resume", default="", type=str)
    parser.add_argument("--start-epoch", default=0, type=int)
    parser.add_argument("--test-only", dest="test_only", action="store_true")
    return parser


if __name__ == "__main__":
    output_dir = tempfile.mkdtemp(prefix="classification-")
    main(get_args_parser().parse_args(["--output-dir", output_dir]))
    main(get_args_parser().parse_args(["--output-dir", output_dir, "--epochs", "2",
                                       "--resume", os.path.join(output_dir, "checkpoint.pth")]))
