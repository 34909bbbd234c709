"""pytorch/examples imagenet/main.py `--resume` on a laptop with no GPU, of a checkpoint written on a GPU server.

The bug: main.py calls `torch.load(args.resume)` without map_location when `--gpu` is not given, so the
tensors are restored to the device they were saved from, cuda:0, which this machine does not have.
`torch.load(args.resume, map_location="cpu")` (or the device chosen at run time) loads it.

The GPU server's save is reproduced on the CPU: `on_gpu_server()` makes torch.save tag every storage
"cuda:0", exactly what a checkpoint written from a CUDA model holds.
"""

import argparse
import os
import shutil
import tempfile

import torch
import torch.nn as nn

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
parser.add_argument("--resume", default="", type=str)
parser.add_argument("--gpu", default=None, type=int)
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


def on_gpu_server():
    """Tag every saved storage as cuda:0, as torch.save does for a model trained on the server's GPU."""
    torch.serialization.register_package(1, lambda storage: "cuda:0", lambda storage, location: None)


def save_checkpoint(state, is_best, filename="checkpoint.pth.tar"):
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, os.path.join(os.path.dirname(filename), "model_best.pth.tar"))


def train_on_server(workdir):
    model = ResNetTiny()
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    images, target = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    loss = nn.CrossEntropyLoss()(model(images), target)
    loss.backward()
    optimizer.step()
    on_gpu_server()
    save_checkpoint({"epoch": 1, "arch": "resnet18", "state_dict": model.state_dict(), "best_acc1": torch.tensor(12.5),
                     "optimizer": optimizer.state_dict()}, True, os.path.join(workdir, "checkpoint.pth.tar"))


def main_worker(args):
    model = ResNetTiny()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    if args.resume:
        if os.path.isfile(args.resume):
            print("=> loading checkpoint '{}'".format(args.resume))
            if args.gpu is None:
                checkpoint = torch.load(args.resume)
            else:
                # Map model to be loaded to specified single gpu.
                loc = "cuda:{}".format(args.gpu)
                checkpoint = torch.load(args.resume, map_location=loc)
            args.start_epoch = checkpoint["epoch"]
            best_acc1 = checkpoint["best_acc1"]
            model.load_state_dict(checkpoint["state_dict"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            print("=> loaded checkpoint '{}' (epoch {}, acc {})".format(args.resume, checkpoint["epoch"], best_acc1))


if __name__ == "__main__":
    workdir = tempfile.mkdtemp(prefix="imagenet-")
    train_on_server(workdir)
    main_worker(parser.parse_args(["--resume", os.path.join(workdir, "model_best.pth.tar")]))
