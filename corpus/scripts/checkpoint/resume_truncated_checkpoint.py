"""Resume training from the latest checkpoint after the previous job was killed mid-save.

The bug: the earlier run was killed while torch.save was writing last.pt (simulated
by keeping only the first half of the file), so the zip archive has no central
directory and torch.load fails. Save to a temp file and os.replace() it, and fall
back to the previous checkpoint when the latest one is unreadable.
"""

import os
import tempfile

import torch
import torch.nn as nn


def make_model():
    return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def previous_run(run_dir):
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    state = {"epoch": 7, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    path = os.path.join(run_dir, "last.pt")
    torch.save(state, path)
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:  # the job was killed here: the write never finished
        handle.truncate(size // 2)


def resume(run_dir):
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    checkpoint = torch.load(os.path.join(run_dir, "last.pt"), map_location="cpu")
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    print(f"resumed from epoch {checkpoint['epoch']}")


if __name__ == "__main__":
    run_dir = tempfile.mkdtemp(prefix="run-")
    previous_run(run_dir)
    resume(run_dir)
