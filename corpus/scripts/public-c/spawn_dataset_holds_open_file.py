"""A token-stream Dataset over one big binary file (nanoGPT / minGPT char_dataset style), with 2 loader workers
under the spawn start method (macOS, Windows, or CUDA code that calls set_start_method("spawn")).

The bug: the Dataset opens the file once in `__init__` and keeps the handle (`self.data_file`); spawn pickles
the Dataset to send it to each worker, and an open file object cannot be pickled. Open the file lazily in the
worker (in `__getitem__` on first use, or in a worker_init_fn), keeping only the path in `__init__`.
"""

import os
import tempfile

import torch
import torch.multiprocessing as mp
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class TokenFileDataset(Dataset):
    def __init__(self, path, block_size):
        self.block_size = block_size
        self.data_file = open(path, "rb")
        self.num_tokens = os.path.getsize(path) // 2

    def __len__(self):
        return self.num_tokens - self.block_size - 1

    def __getitem__(self, idx):
        self.data_file.seek(2 * idx)
        chunk = torch.frombuffer(bytearray(self.data_file.read(2 * (self.block_size + 1))), dtype=torch.int16).long()
        return chunk[:-1], chunk[1:]


def write_tokens(path, n=4096, vocab_size=256):
    tokens = torch.randint(0, vocab_size, (n,), dtype=torch.int16, generator=torch.Generator().manual_seed(0))
    with open(path, "wb") as f:
        f.write(bytes(tokens.view(torch.uint8).tolist()))


def main():
    mp.set_start_method("spawn", force=True)
    path = os.path.join(tempfile.mkdtemp(prefix="tokens-"), "train.bin")
    write_tokens(path)
    train_dataset = TokenFileDataset(path, block_size=32)
    loader = DataLoader(train_dataset, batch_size=16, shuffle=True, num_workers=2)
    model = nn.Sequential(nn.Embedding(256, 32), nn.Linear(32, 256))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for it, (x, y) in enumerate(loader):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        model.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if it == 5:
            break


if __name__ == "__main__":
    main()
