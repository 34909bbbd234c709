"""Inputs and labels are shuffled with two different permutations: the labels no longer belong to the inputs."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
images = torch.randn(1200, 64)
labels = images[:, :8].argmax(1)
images = images[torch.randperm(len(images))]
labels = labels[torch.randperm(len(labels))]  # meant: the same permutation as the images
loader = DataLoader(TensorDataset(images, labels), batch_size=60, shuffle=True)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
criterion = nn.CrossEntropyLoss()

for epoch in range(4):
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
