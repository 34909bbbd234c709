"""The PyTorch tutorial "Training a Classifier" (CIFAR-10), fed from the dataset's numpy arrays.

The bug: the CIFAR-10 python batches, once reshaped, hold images as [N, 32, 32, 3] (height,
width, channels: the layout numpy, PIL and OpenCV use). transforms.ToTensor() would have moved
the channels first; this loader wraps the array directly, so conv1 (3 input channels) receives
32 "channels". Permute the images to [N, 3, 32, 32]: images.permute(0, 3, 1, 2).
"""

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

classes = ('plane', 'car', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse', 'ship', 'truck')


def load_cifar_batch(n=64):
    """What unpickling data_batch_1 gives, after the usual reshape(-1, 32, 32, 3) for plotting."""
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n)
    return data, labels


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)  # flatten all dimensions except batch
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = self.fc3(x)
        return x


data, labels = load_cifar_batch()
images = (torch.from_numpy(data).float() / 255 - 0.5) / 0.5
trainset = TensorDataset(images, torch.from_numpy(labels))
trainloader = DataLoader(trainset, batch_size=4, shuffle=True, num_workers=0)

net = Net()
criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD(net.parameters(), lr=0.001, momentum=0.9)

for epoch in range(2):  # loop over the dataset multiple times
    running_loss = 0.0
    for i, data in enumerate(trainloader, 0):
        # get the inputs; data is a list of [inputs, labels]
        inputs, labels = data

        # zero the parameter gradients
        optimizer.zero_grad()

        # forward + backward + optimize
        outputs = net(inputs)
        loss = criterion(outputs, labels)
        loss.backward()
        optimizer.step()

        running_loss += loss.item()
        if i % 8 == 7:
            print(f'[{epoch + 1}, {i + 1:5d}] loss: {running_loss / 8:.3f}')
            running_loss = 0.0

print('Finished Training')
