"""A GPT-style training loop (nanoGPT's train.py shape: `model = torch.compile(model)`, then checkpoints with
`model.state_dict()`), and sample.py loading the checkpoint into a fresh, uncompiled model.

The bug: the training loop saved `model.state_dict()` from the compiled wrapper, whose keys all start with
"_orig_mod." (nanoGPT saves `raw_model.state_dict()`, and its sample.py strips `_orig_mod.` for this reason).
Strip the prefix when loading, or save the module that was passed to torch.compile.
"""

import os
import tempfile

import torch
import torch.nn as nn
from torch.nn import functional as F


class GPT(nn.Module):
    def __init__(self, vocab_size=64, block_size=16, n_embd=32):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1), device=idx.device)
        logits = self.lm_head(self.ln_f(self.wte(idx) + self.wpe(pos)))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def train(out_dir):
    model = GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model = torch.compile(model, backend="eager")  # requires PyTorch 2.0
    for iter_num in range(3):
        X = torch.randint(0, 64, (8, 16))
        _, loss = model(X, torch.roll(X, -1, 1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num}
    torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))


def sample(out_dir):
    checkpoint = torch.load(os.path.join(out_dir, "ckpt.pt"), map_location="cpu")
    model = GPT()
    state_dict = checkpoint["model"]
    model.load_state_dict(state_dict)
    model.eval()
    with torch.no_grad():
        print(model(torch.zeros(1, 1, dtype=torch.long))[0].argmax(-1))


if __name__ == "__main__":
    out_dir = tempfile.mkdtemp(prefix="out-")
    train(out_dir)
    sample(out_dir)
