"""Variable-length token sequences batched with the default collate function.

The bug: default_collate stacks tensors, so sequences of different lengths (12 and 9)
cannot form a batch; a collate_fn that pads (pad_sequence) is missing.
"""

import torch
from torch.utils.data import DataLoader, Dataset


class Sentences(Dataset):
    LENGTHS = [12, 9, 15, 7, 12, 11, 8, 10]

    def __len__(self):
        return len(self.LENGTHS)

    def __getitem__(self, i):
        return torch.randint(1, 1000, (self.LENGTHS[i],))


def main():
    embed = torch.nn.EmbeddingBag(1000, 16)
    classifier = torch.nn.Linear(16, 2)
    optimizer = torch.optim.SGD(list(embed.parameters()) + list(classifier.parameters()), lr=0.1)
    for tokens in DataLoader(Sentences(), batch_size=4, shuffle=False):
        logits = classifier(embed(tokens))
        loss = logits.logsumexp(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
