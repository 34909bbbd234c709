"""torchvision references/classification/train.py `--test-only --resume`, evaluating a saved checkpoint.

The bug: the evaluation path was rewritten as `model_without_ddp.load_state_dict(checkpoint)`, passing the
whole checkpoint dict that train.py saves ({"model", "optimizer", "lr_scheduler", "epoch", "args"}) instead of
its "model" entry. Load `checkpoint["model"]`.
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


def evaluate(model, criterion, data_loader):
    model.eval()
    with torch.inference_mode():
        for image, target in data_loader:
            print("Test: loss", criterion(model(image), target).item())


def main(args):
    dataset_test = torch.utils.data.TensorDataset(torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,)))
    data_loader_test = torch.utils.data.DataLoader(dataset_test, batch_size=8)
    model = ResNetTiny()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    model_without_ddp = model

    if args.resume:
        checkpoint = torch.load(args.resume, map_location="cpu", weights_only=True)
        model_without_ddp.load_state_dict(checkpoint)
        if not args.test_only:
            optimizer.load_state_dict(checkpoint["optimizer"])
            lr_scheduler.load_state_dict(checkpoint["lr_scheduler"])
        args.start_epoch = checkpoint["epoch"] + 1

    if args.test_only:
        evaluate(model, criterion, data_loader_test)
        return

    checkpoint = {"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(),
                  "lr_scheduler": lr_scheduler.state_dict(), "epoch": 0}
    torch.save(checkpoint, os.path.join(args.output_dir, "checkpoint.pth"))


def get_args_parser():
    parser = argparse.ArgumentParser(description="PyTorch Classification Training")
    parser.add_argument("--lr", default=0.1, type=float)
    parser.add_argument("--output-dir", default=".", type=str)
    parser.add_argument("--resume", default="", type=str)
    parser.add_argument("--test-only", dest="test_only", action="store_true")
    return parser


if __name__ == "__main__":
    output_dir = tempfile.mkdtemp(prefix="classification-")
    main(get_args_parser().parse_args(["--output-dir", output_dir]))
    main(get_args_parser().parse_args(["--test-only", "--resume", os.path.join(output_dir, "checkpoint.pth")]))
