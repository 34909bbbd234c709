"""Text classification with padded batches; the loader uses spawn (as on macOS/Windows).

The bug: the padding collate_fn is a lambda, and with the spawn start method the
DataLoader must pickle it to send it to each worker, which lambdas do not allow.
A module-level function (or functools.partial of one) is needed.
"""

import torch
import torch.nn as nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

PAD = 0


class Reviews(Dataset):
    def __init__(self, n=48):
        g = torch.Generator().manual_seed(1)
        self.texts = [torch.randint(1, 500, (int(torch.randint(5, 20, (1,), generator=g)),), generator=g) for _ in range(n)]
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, i):
        return self.texts[i], self.labels[i]


def main():
    loader = DataLoader(
        Reviews(), batch_size=8, shuffle=True, num_workers=2, multiprocessing_context="spawn",
        collate_fn=lambda batch: (pad_sequence([t for t, _ in batch], batch_first=True, padding_value=PAD),
                                  torch.stack([y for _, y in batch])),
    )
    embed, head = nn.Embedding(500, 32, padding_idx=PAD), nn.Linear(32, 2)
    optimizer = torch.optim.Adam([*embed.parameters(), *head.parameters()], lr=1e-3)
    for tokens, labels in loader:
        loss = nn.functional.cross_entropy(head(embed(tokens).mean(1)), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
