"""pytorch/examples super_resolution (model.py, dataset.py, main.py), loading images with numpy.

The bug: DatasetFromFolder was rewritten without torchvision transforms. The low-resolution
input becomes [1, h, w] with permute(2, 0, 1), but the high-resolution target is made with
transpose(0, 2), which swaps height and width as well as moving the channel first: [1, W, H].
On the non-square crops the model's [1, 96, 128] output meets a [1, 128, 96] target. Use
permute(2, 0, 1) for the target too.
"""

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.init as init
import torch.optim as optim
from torch.utils.data import DataLoader, Dataset


class Net(nn.Module):
    def __init__(self, upscale_factor):
        super(Net, self).__init__()
        self.relu = nn.ReLU()
        self.conv1 = nn.Conv2d(1, 64, (5, 5), (1, 1), (2, 2))
        self.conv2 = nn.Conv2d(64, 64, (3, 3), (1, 1), (1, 1))
        self.conv3 = nn.Conv2d(64, 32, (3, 3), (1, 1), (1, 1))
        self.conv4 = nn.Conv2d(32, upscale_factor ** 2, (3, 3), (1, 1), (1, 1))
        self.pixel_shuffle = nn.PixelShuffle(upscale_factor)
        self._initialize_weights()

    def forward(self, x):
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        x = self.relu(self.conv3(x))
        x = self.pixel_shuffle(self.conv4(x))
        return x

    def _initialize_weights(self):
        init.orthogonal_(self.conv1.weight, init.calculate_gain('relu'))
        init.orthogonal_(self.conv2.weight, init.calculate_gain('relu'))
        init.orthogonal_(self.conv3.weight, init.calculate_gain('relu'))
        init.orthogonal_(self.conv4.weight)


class DatasetFromFolder(Dataset):
    """BSDS300 crops as an OpenCV loader gives them: the Y channel as [H, W, 1] numpy arrays."""

    def __init__(self, crop_size=(96, 128), upscale_factor=4, n=16):
        rng = np.random.default_rng(0)
        self.images = rng.random((n, crop_size[0], crop_size[1], 1), dtype=np.float32)
        self.upscale_factor = upscale_factor

    def __getitem__(self, index):
        hr = self.images[index]
        lr = hr[::self.upscale_factor, ::self.upscale_factor]  # the Resize(crop_size // upscale_factor) step
        input = torch.from_numpy(np.ascontiguousarray(lr)).permute(2, 0, 1)
        target = torch.from_numpy(hr).transpose(0, 2)
        return input, target

    def __len__(self):
        return len(self.images)


parser = argparse.ArgumentParser(description='PyTorch Super Res Example')
parser.add_argument('--upscale_factor', type=int, default=4, help="super resolution upscale factor")
parser.add_argument('--batchSize', type=int, default=4, help='training batch size')
parser.add_argument('--nEpochs', type=int, default=2, help='number of epochs to train for')
parser.add_argument('--lr', type=float, default=0.01, help='Learning Rate. Default=0.01')
parser.add_argument('--seed', type=int, default=123, help='random seed to use. Default=123')
opt = parser.parse_args()

torch.manual_seed(opt.seed)
device = torch.device("cpu")

print('===> Loading datasets')
train_set = DatasetFromFolder(upscale_factor=opt.upscale_factor)
training_data_loader = DataLoader(dataset=train_set, batch_size=opt.batchSize, shuffle=True)

print('===> Building model')
model = Net(upscale_factor=opt.upscale_factor).to(device)
criterion = nn.MSELoss()
optimizer = optim.Adam(model.parameters(), lr=opt.lr)


def train(epoch):
    epoch_loss = 0
    for iteration, batch in enumerate(training_data_loader, 1):
        input, target = batch[0].to(device), batch[1].to(device)

        optimizer.zero_grad()
        loss = criterion(model(input), target)
        epoch_loss += loss.item()
        loss.backward()
        optimizer.step()

        print("===> Epoch[{}]({}/{}): Loss: {:.4f}".format(epoch, iteration, len(training_data_loader), loss.item()))


for epoch in range(1, opt.nEpochs + 1):
    train(epoch)
