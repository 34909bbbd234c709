"""A sentiment classifier over [batch, time, features] sequences with an LSTM built without batch_first.

The bug: nn.LSTM defaults to [time, batch, features], so the batch of 16 sequences of
20 steps is read as 16 steps of a batch of 20; `out[-1]` then holds 20 rows, and the
loss compares 20 predictions with 16 labels.
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class SentimentLSTM(nn.Module):
    def __init__(self, features=12, hidden=32, classes=2):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=1)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):  # x: [batch, time, features]
        out, _ = self.lstm(x)
        return self.head(out[-1])  # last time step


def main():
    torch.manual_seed(0)
    sequences = torch.randn(64, 20, 12)
    labels = torch.randint(0, 2, (64,))
    loader = DataLoader(TensorDataset(sequences, labels), batch_size=16, shuffle=True)
    model = SentimentLSTM()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(3):
        for x, y in loader:
            loss = criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()


if __name__ == "__main__":
    main()
