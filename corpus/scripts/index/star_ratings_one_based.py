"""A review-rating classifier: 5 classes for 1..5 stars, trained on the raw star values.

The bug: the labels are the star counts 1..5, but a 5-way output wants class indices
0..4, so a 5-star review is out of range. Subtract one from the ratings (and add it back
when predicting).
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Reviews(Dataset):
    def __init__(self, n=60):
        generator = torch.Generator().manual_seed(0)
        self.embeddings = torch.randn(n, 32, generator=generator)  # precomputed sentence embeddings
        self.stars = torch.randint(1, 6, (n,), generator=generator)

    def __len__(self):
        return len(self.stars)

    def __getitem__(self, i):
        return self.embeddings[i], self.stars[i]


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 5))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    for epoch in range(2):
        for embeddings, stars in DataLoader(Reviews(), batch_size=12, shuffle=True):
            loss = criterion(model(embeddings), stars)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
