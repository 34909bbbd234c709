"""A compiled training step that measures its own duration for throughput logging.

The bug: the step calls time.perf_counter() inside the function given to
torch.compile(fullgraph=True). Dynamo cannot trace that C builtin ("Attempted to call
function marked as skipped") and fullgraph forbids the graph break. Time the call from
outside the compiled function.
"""

import time

import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


@torch.compile(fullgraph=True)
def train_step(x, target):
    started = time.perf_counter()
    loss = nn.functional.smooth_l1_loss(model(x), target)
    loss.backward()
    return loss.detach(), time.perf_counter() - started


def main():
    torch.manual_seed(0)
    for step in range(5):
        x, target = torch.randn(128, 64), torch.randn(128, 64)
        optimizer.zero_grad(set_to_none=True)
        loss, seconds = train_step(x, target)
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f} ({128 / seconds:.0f} samples/s)")


if __name__ == "__main__":
    main()
