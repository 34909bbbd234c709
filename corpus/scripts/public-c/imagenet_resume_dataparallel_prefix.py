"""pytorch/examples imagenet/main.py, cut to a CPU run: train with nn.DataParallel, then `--resume` for evaluation.

The bug: the first run wrapped the model in torch.nn.DataParallel (main.py does so whenever it is not
distributed) and saved `model.state_dict()`, so every key starts with "module."; the evaluation run builds the
plain model (`--evaluate` on one device, no DataParallel) and loads the checkpoint into it.
"""

import argparse
import os
import shutil
import tempfile

import torch
import torch.nn as nn
import torch.utils.data

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
parser.add_argument("--epochs", default=1, type=int)
parser.add_argument("--lr", default=0.1, type=float)
parser.add_argument("--resume", default="", type=str)
parser.add_argument("--evaluate", action="store_true")


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
    if is_best:
        shutil.copyfile(filename, os.path.join(os.path.dirname(filename), "model_best.pth.tar"))


def train(train_loader, model, criterion, optimizer, device):
    model.train()
    for images, target in train_loader:
        images, target = images.to(device, non_blocking=True), target.to(device, non_blocking=True)
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main_worker(args, workdir):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = ResNetTiny()
    if not args.evaluate:
        model = torch.nn.DataParallel(model)  # "DataParallel will divide and allocate batch_size to all GPUs"
    model = model.to(device)  # main.py: .cuda() where there is a GPU (DataParallel requires it there)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)

    if args.resume:
        if os.path.isfile(args.resume):
            print("=> loading checkpoint '{}'".format(args.resume))
            checkpoint = torch.load(args.resume)
            args.start_epoch = checkpoint["epoch"]
            model.load_state_dict(checkpoint["state_dict"])
            print("=> loaded checkpoint '{}' (epoch {})".format(args.resume, checkpoint["epoch"]))

    train_dataset = torch.utils.data.TensorDataset(torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,)))
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=16, shuffle=True)
    if args.evaluate:
        return
    for epoch in range(args.epochs):
        train(train_loader, model, criterion, optimizer, device)
        save_checkpoint({"epoch": epoch + 1, "arch": "resnet_tiny", "state_dict": model.state_dict(),
                         "best_acc1": 0.0, "optimizer": optimizer.state_dict()}, True,
                        os.path.join(workdir, "checkpoint.pth.tar"))


def main():
    workdir = tempfile.mkdtemp(prefix="imagenet-")
    main_worker(parser.parse_args([]), workdir)  # the training run
    main_worker(parser.parse_args(["--evaluate", "--resume", os.path.join(workdir, "model_best.pth.tar")]), workdir)


if __name__ == "__main__":
    main()
