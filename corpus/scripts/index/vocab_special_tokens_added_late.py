"""A word-level language model whose vocabulary grows after the embedding is built.

The bug: nn.Embedding is sized from the corpus vocabulary (len(vocab) = 23), then the
<bos>/<eos> special tokens are appended to the vocabulary, so their ids 23 and 24 are
beyond the embedding table. Add special tokens before building the model (or size it
from the final vocabulary).
"""

import torch
import torch.nn as nn

TEXT = "the cat sat on the mat while the dog ran in the park and the bird sang a song by the old oak tree near my house today"


class LanguageModel(nn.Module):
    def __init__(self, vocab_size, dim=32):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, vocab_size)

    def forward(self, ids):
        hidden, _ = self.rnn(self.embed(ids))
        return self.out(hidden)


def main():
    torch.manual_seed(0)
    vocab = {word: i for i, word in enumerate(sorted(set(TEXT.split())))}
    model = LanguageModel(len(vocab))
    for special in ("<bos>", "<eos>"):
        vocab[special] = len(vocab)
    ids = torch.tensor([[vocab["<bos>"], *(vocab[w] for w in TEXT.split()), vocab["<eos>"]]])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(3):
        logits = model(ids[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
