"""The PyTorch tutorial "Training a Classifier" (CIFAR-10), reading the data from a CSV export.

The bug: the Dataset reads each row (label, 3072 pixel values) into one float32 tensor and
returns row[0] as the label, so CrossEntropyLoss gets float class labels. Class-index targets
must be int64: return row[0].long() (or torch.tensor(label, dtype=torch.long)).
"""

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, Dataset

classes = ('plane', 'car', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse', 'ship', 'truck')


class CIFAR10Csv(Dataset):
    """Rows of `label,p0,...,p3071` as pandas.read_csv(...).values gives them (float64)."""

    def __init__(self, n=64):
        rng = np.random.default_rng(0)
        labels = rng.integers(0, 10, size=(n, 1))
        pixels = rng.integers(0, 256, size=(n, 3 * 32 * 32))
        self.rows = np.concatenate([labels, pixels], axis=1).astype(np.float64)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        row = torch.tensor(self.rows[index], dtype=torch.float32)
        image = (row[1:].view(3, 32, 32) / 255 - 0.5) / 0.5
        return image, row[0]


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


trainset = CIFAR10Csv()
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

        # print statistics
        running_loss += loss.item()
        if i % 8 == 7:
            print(f'[{epoch + 1}, {i + 1:5d}] loss: {running_loss / 8:.3f}')
            running_loss = 0.0

print('Finished Training')
