"""Rank 1's prefetch thread dies on a record without a 'label' key; its main loop then waits for batches that never come."""
import datetime
import queue
import threading

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
rank = dist.get_rank()
records = [{"x": [1.0, 2.0], "label": 0}, {"x": [3.0, 4.0], "label": 1}, {"x": [5.0, 6.0]}]
batches: queue.Queue = queue.Queue()


def prefetch():
    for record in (records if rank == 1 else records[:2] * 2):
        batches.put((torch.tensor(record["x"]), record["label"]))


threading.Thread(target=prefetch, name="prefetch", daemon=True).start()
for step in range(3):
    x, label = batches.get(timeout=3)
    total = x.sum().reshape(1)
    dist.all_reduce(total)
    print(f"rank {rank} step {step} total {total.item()}", flush=True)
dist.destroy_process_group()
