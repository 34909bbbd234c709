"""Metric learning with a hand-written Euclidean distance, debugged under anomaly detection.

The bug: when an anchor and its positive are the same sample (duplicates in the batch),
sqrt(sum((a - p)^2)) is sqrt(0), whose gradient is inf; inf * 0 gives NaN in the
backward of the squared difference ("Function 'PowBackward0' returned nan values").
Use torch.sqrt(d + 1e-12) or F.pairwise_distance (which adds eps).
"""

import torch
import torch.nn as nn


def euclidean(a, b):
    return torch.sqrt(((a - b) ** 2).sum(dim=1))


def triplet_loss(anchor, positive, negative, margin=1.0):
    return torch.relu(euclidean(anchor, positive) - euclidean(anchor, negative) + margin).mean()


def main():
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    optimizer = torch.optim.Adam(encoder.parameters(), lr=1e-3)
    samples = torch.randn(64, 32)
    torch.autograd.set_detect_anomaly(True)  # "the loss went NaN last night; find out where"
    for step in range(20):
        idx = torch.randint(0, 64, (16, 3))
        idx[step % 16, 1] = idx[step % 16, 0]  # a duplicate pair sneaks into the batch
        anchor, positive, negative = (encoder(samples[idx[:, k]]) for k in range(3))
        loss = triplet_loss(anchor, positive, negative)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
