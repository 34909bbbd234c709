"""Nearest-neighbour evaluation of an embedding model over the whole gallery at once.

The bug: the gallery has 600,000 items, and `queries @ gallery.T` with all gallery items
as queries materialises a 600000 x 600000 float32 similarity matrix (1.44 TB) in host
memory. Compute the similarities block by block and keep only the top-k per block.
"""

import torch
import torch.nn as nn

GALLERY = 600_000
DIM = 64


def embed_gallery(encoder, features, batch=100_000):
    with torch.no_grad():
        return torch.cat([nn.functional.normalize(encoder(features[i:i + batch]), dim=1) for i in range(0, len(features), batch)])


def recall_at_k(embeddings, labels, k=5):
    similarity = embeddings @ embeddings.T          # every item against every item
    similarity.fill_diagonal_(-1)
    neighbours = similarity.topk(k, dim=1).indices
    return (labels[neighbours] == labels[:, None]).any(dim=1).float().mean()


def main():
    torch.manual_seed(0)
    encoder = nn.Linear(32, DIM)
    features = torch.randn(GALLERY, 32)
    labels = torch.randint(0, 1000, (GALLERY,))
    embeddings = embed_gallery(encoder, features)
    print(f"recall@5 = {recall_at_k(embeddings, labels):.3f}")


if __name__ == "__main__":
    main()
