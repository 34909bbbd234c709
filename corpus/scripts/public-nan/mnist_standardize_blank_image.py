"""pytorch/examples mnist/main.py, with the input normalisation moved into the model as per-image standardisation.

The bug: `Standardize` divides each image by its own std, and a blank image (an empty scan: every pixel 0)
has std 0: 0 / 0 = NaN for all of its pixels, so the loss of that batch is NaN and the Adadelta step writes
NaN into every weight. Add an epsilon to the std (or use the dataset's fixed mean and std, as the original
transforms.Normalize((0.1307,), (0.3081,)) does).
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR


class Standardize(nn.Module):
    """Zero mean, unit variance per image (instead of the dataset-wide Normalize transform)."""

    def forward(self, x):
        mean = x.mean(dim=(1, 2, 3), keepdim=True)
        std = x.std(dim=(1, 2, 3), keepdim=True)
        return (x - mean) / std


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.standardize = Standardize()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.standardize(x)
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader), loss.item()))


def scanned_digits(n, generator):
    """MNIST-shaped digits in [0, 1] (ToTensor's range); every 50th scan came out blank."""
    target = torch.randint(0, 10, (n,), generator=generator)
    data = torch.zeros(n, 1, 28, 28)
    for i, label in enumerate(target.tolist()):
        if i % 50 == 37:
            continue  # an empty page: all zeros
        row, col = divmod(label, 4)
        data[i, 0, 7 * row:7 * row + 7, 7 * col:7 * col + 7] = torch.rand(7, 7, generator=generator)
    return data, target


def main():
    parser = argparse.ArgumentParser(description='PyTorch MNIST Example')
    parser.add_argument('--batch-size', type=int, default=32, metavar='N')
    parser.add_argument('--epochs', type=int, default=2, metavar='N')
    parser.add_argument('--lr', type=float, default=1.0, metavar='LR')
    parser.add_argument('--gamma', type=float, default=0.7, metavar='M')
    parser.add_argument('--seed', type=int, default=1, metavar='S')
    parser.add_argument('--log-interval', type=int, default=1, metavar='N')
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    data, target = scanned_digits(128, torch.Generator().manual_seed(args.seed))
    train_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data, target),
                                               batch_size=args.batch_size, shuffle=False)

    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        scheduler.step()


if __name__ == '__main__':
    main()
