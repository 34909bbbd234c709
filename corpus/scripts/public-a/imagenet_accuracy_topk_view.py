"""pytorch/examples imagenet/main.py: the accuracy() helper as it was written before torch 1.7.

The bug: accuracy() transposes the top-k predictions (pred.t()), so `correct` is a
non-contiguous view, and correct[:k].view(-1) cannot flatten it for k > 1 (pytorch/examples
issue 836). The current example uses correct[:k].reshape(-1).
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class AverageMeter(object):
    """Computes and stores the average and current value"""

    def __init__(self, name, fmt=':f'):
        self.name = name
        self.fmt = fmt
        self.reset()

    def reset(self):
        self.val = 0
        self.avg = 0
        self.sum = 0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def accuracy(output, target, topk=(1,)):
    """Computes the accuracy over the k top predictions for the specified values of k"""
    with torch.no_grad():
        maxk = max(topk)
        batch_size = target.size(0)

        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))

        res = []
        for k in topk:
            correct_k = correct[:k].view(-1).float().sum(0, keepdim=True)
            res.append(correct_k.mul_(100.0 / batch_size))
        return res


def train(train_loader, model, criterion, optimizer, epoch, device, args):
    losses = AverageMeter('Loss', ':.4e')
    top1 = AverageMeter('Acc@1', ':6.2f')
    top5 = AverageMeter('Acc@5', ':6.2f')
    model.train()
    for i, (images, target) in enumerate(train_loader):
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)

        # compute output
        output = model(images)
        loss = criterion(output, target)

        # measure accuracy and record loss
        acc1, acc5 = accuracy(output, target, topk=(1, 5))
        losses.update(loss.item(), images.size(0))
        top1.update(acc1[0], images.size(0))
        top5.update(acc5[0], images.size(0))

        # compute gradient and do SGD step
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % args.print_freq == 0:
            print(f"Epoch: [{epoch}][{i}/{len(train_loader)}] Loss {losses.avg:.4f} Acc@1 {top1.avg:.2f}")


def main():
    parser = argparse.ArgumentParser(description='PyTorch ImageNet Training')
    parser.add_argument('-b', '--batch-size', default=32, type=int)
    parser.add_argument('--lr', default=0.1, type=float)
    parser.add_argument('-p', '--print-freq', default=10, type=int)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device("cpu")

    # a small convnet and random 3x32x32 images over 100 classes stand in for resnet18 on ImageNet
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
        nn.Conv2d(32, 64, 3, 2, 1), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(64, 100),
    ).to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    train_dataset = TensorDataset(torch.randn(128, 3, 32, 32), torch.randint(0, 100, (128,)))
    train_loader = DataLoader(train_dataset, batch_size=args.batch_size, shuffle=True)
    for epoch in range(2):
        train(train_loader, model, criterion, optimizer, epoch, device, args)


if __name__ == '__main__':
    main()
