"""A "fast init" loader: build the model on the meta device, then load the real weights.

The bug: load_state_dict() copies into the existing parameters, and copying into a meta
tensor is a no-op (PyTorch only warns), so the weights stay on the meta device and the
first forward pass fails. Use load_state_dict(state, assign=True), or to_empty() first.
"""

import torch
import torch.nn as nn


class TextClassifier(nn.Module):
    def __init__(self, vocab=500, dim=32, classes=4):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, dim)
        self.hidden = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        return self.head(torch.relu(self.hidden(self.embed(tokens))))


def load_pretrained(state_dict):
    with torch.device("meta"):  # skip random init: the weights are overwritten anyway
        model = TextClassifier()
    model.load_state_dict(state_dict)
    return model


def main():
    torch.manual_seed(0)
    pretrained = TextClassifier().state_dict()  # stands in for torch.load("classifier.pt")
    model = load_pretrained(pretrained)
    model.eval()
    tokens = torch.randint(0, 500, (8, 12))
    with torch.no_grad():
        print(model(tokens).argmax(dim=1).tolist())


if __name__ == "__main__":
    main()
