"""Node classification on subgraphs sampled by a Dataset, loaded with 2 workers.

The bug: __getitem__ builds the adjacency matrix of the *whole* graph densely
(torch.zeros(num_nodes, num_nodes) for 300,000 nodes = 360 GB) instead of the sampled
subgraph's, so the worker's allocation fails and the DataLoader re-raises it. Index the
subgraph's nodes first (or keep the adjacency sparse).
"""

import torch
from torch.utils.data import DataLoader, Dataset

NUM_NODES = 300_000
NUM_EDGES = 1_000_000


class SubgraphSampler(Dataset):
    def __init__(self, edges, features, labels, size=64):
        self.edges, self.features, self.labels, self.size = edges, features, labels, size

    def __len__(self):
        return 32

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        nodes = torch.randint(0, NUM_NODES, (self.size,), generator=g)
        adjacency = torch.zeros(NUM_NODES, NUM_NODES)
        adjacency[self.edges[0], self.edges[1]] = 1.0
        sub = adjacency[nodes][:, nodes]
        return sub, self.features[nodes], self.labels[nodes]


def main():
    g = torch.Generator().manual_seed(0)
    edges = torch.randint(0, NUM_NODES, (2, NUM_EDGES), generator=g)
    features, labels = torch.randn(NUM_NODES, 16, generator=g), torch.randint(0, 4, (NUM_NODES,), generator=g)
    loader = DataLoader(SubgraphSampler(edges, features, labels), batch_size=4, num_workers=2)
    weight = torch.nn.Linear(16, 4)
    optimizer = torch.optim.Adam(weight.parameters(), lr=1e-2)
    for adjacency, x, y in loader:
        logits = weight(adjacency @ x)  # one round of neighbour aggregation
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 4), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
