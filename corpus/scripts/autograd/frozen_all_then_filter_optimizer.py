"""Fine-tuning a "pretrained" encoder with a new classification head.

The bug: the head is replaced first and the freezing loop runs afterwards over all of
model.parameters(), so the new head is frozen too; filtering on requires_grad then
leaves the optimizer nothing to train. Freeze model.encoder.parameters() only (or
freeze before replacing the head).
"""

import torch
import torch.nn as nn


class Classifier(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, classes)

    def forward(self, x):
        return self.head(self.encoder(x))


def main():
    torch.manual_seed(0)
    model = Classifier()
    model.load_state_dict(Classifier().state_dict())  # stands in for the pretrained checkpoint
    model.head = nn.Linear(64, 3)  # new task: 3 classes
    for param in model.parameters():
        param.requires_grad = False
    trainable = filter(lambda p: p.requires_grad, model.parameters())
    optimizer = torch.optim.Adam(trainable, lr=1e-3)
    x, y = torch.randn(32, 20), torch.randint(0, 3, (32,))
    for step in range(5):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
