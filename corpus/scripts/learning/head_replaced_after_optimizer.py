"""Fine-tuning: the new classification head is attached after the optimizer was built, so it never trains."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.fc = nn.Linear(64, 100)  # pretrained on 100 classes

    def forward(self, x):
        return self.fc(self.features(x))


torch.manual_seed(0)
x = torch.randn(640, 32)
y = torch.randint(0, 5, (640,))
loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
model = Backbone()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
model.fc = nn.Linear(64, 5)  # our task has 5 classes
criterion = nn.CrossEntropyLoss()

for epoch in range(4):
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
