"""Small real models shaped like public training code, for the tests of the recorded model call."""

from __future__ import annotations

import torch
from torch import nn


class TextClassificationModel(nn.Module):
    """The PyTorch text-classification tutorial's model: an EmbeddingBag over a flat token list and its offsets."""

    def __init__(self, vocab_size: int = 50, embed_dim: int = 16, num_class: int = 4) -> None:
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab_size, embed_dim)
        self.fc = nn.Linear(embed_dim, num_class)

    def forward(self, text, offsets):
        return self.fc(self.embedding(text, offsets))


def text_batch(labels: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(label, text, offsets) in the tutorial's collate_batch order: the label first."""
    torch.manual_seed(0)
    lengths = [3, 5, 2, 4][:len(labels)]
    text = torch.randint(0, 50, (sum(lengths),))
    offsets = torch.tensor([0, *lengths[:-1]]).cumsum(0)
    return torch.tensor(labels), text, offsets


NZ, NC, FEATURES = 8, 3, 8


class Generator(nn.Module):
    """The DCGAN example's generator, for 16x16 images."""

    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(NZ, FEATURES * 2, 4, 1, 0, bias=False), nn.BatchNorm2d(FEATURES * 2), nn.ReLU(True),
            nn.ConvTranspose2d(FEATURES * 2, FEATURES, 4, 2, 1, bias=False), nn.BatchNorm2d(FEATURES), nn.ReLU(True),
            nn.ConvTranspose2d(FEATURES, NC, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    """The DCGAN example's discriminator, for 16x16 images.

    `flatten=False` is the bug: its output stays [B, 1, 1, 1]."""

    def __init__(self, flatten: bool = True) -> None:
        super().__init__()
        self.flatten = flatten
        self.main = nn.Sequential(
            nn.Conv2d(NC, FEATURES, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(FEATURES, FEATURES * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(FEATURES * 2),
            nn.LeakyReLU(0.2, inplace=True), nn.Conv2d(FEATURES * 2, 1, 4, 1, 0, bias=False), nn.Sigmoid())

    def forward(self, input):
        output = self.main(input)
        return output.view(-1, 1).squeeze(1) if self.flatten else output


class TinyTagger(nn.Module):
    """A token tagger called the Hugging Face way, with keyword arguments only."""

    def __init__(self, vocab: int = 30, tags: int = 5) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 8)
        self.head = nn.Linear(8, tags)

    def forward(self, input_ids, attention_mask=None):
        hidden = self.embed(input_ids)
        if attention_mask is not None:
            hidden = hidden * attention_mask.unsqueeze(-1)
        return self.head(hidden)
