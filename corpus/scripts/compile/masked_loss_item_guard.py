"""Token classification with ignored positions; the loss function is compiled with fullgraph=True.

The bug: the loss returns early when a batch has no labelled tokens,
`if mask.sum().item() == 0: return ...` - a Python branch on a value only known at run
time. Dynamo cannot guard on that data-dependent value ("Could not guard on
data-dependent expression") and fullgraph makes it an error. Use a branchless form:
(loss * mask).sum() / mask.sum().clamp(min=1).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

IGNORE = -100


@torch.compile(fullgraph=True)
def masked_token_loss(logits, labels):
    mask = labels != IGNORE
    if mask.sum().item() == 0:
        return logits.sum() * 0.0
    per_token = F.cross_entropy(logits.flatten(0, 1), labels.clamp(min=0).flatten(), reduction="none")
    return (per_token * mask.flatten()).sum() / mask.sum()


def main():
    torch.manual_seed(0)
    tagger = nn.Sequential(nn.Embedding(500, 32), nn.Linear(32, 9))
    optimizer = torch.optim.Adam(tagger.parameters(), lr=1e-3)
    for step in range(4):
        tokens = torch.randint(0, 500, (8, 20))
        labels = torch.randint(0, 9, (8, 20))
        labels[:, 15:] = IGNORE  # padding positions
        loss = masked_token_loss(tagger(tokens), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
