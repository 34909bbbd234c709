"""A dataset with an in-memory cache guarded by a lock, and a thread that checkpoints the cache.

The bug: the checkpoint thread holds the cache lock while the DataLoader forks its
workers; each worker gets a copy of a lock that is held and that nobody in the worker
will ever release, so the first `with self.lock:` in __getitem__ blocks forever and
the training loop waits for its first batch. Plain python hangs; run it under
triage with --hang-timeout.
"""

import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset


class CachedFeatures(Dataset):
    def __init__(self, n=64):
        self.n = n
        self.cache = {}
        self.lock = threading.Lock()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with self.lock:
            if i not in self.cache:
                self.cache[i] = torch.full((8,), float(i))
            return self.cache[i]

    def checkpoint(self, started):
        with self.lock:
            started.set()
            time.sleep(60)  # uploading the cache to a bucket


def main():
    dataset = CachedFeatures()
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    started = threading.Event()
    threading.Thread(target=dataset.checkpoint, args=(started,), daemon=True).start()
    started.wait()
    for batch in DataLoader(dataset, batch_size=8, num_workers=2):
        loss = model(batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
