"""Rank 1 waits on a lock its own logging thread never releases; rank 0's all_reduce times out waiting for it."""
import datetime
import threading

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
rank = dist.get_rank()
log_lock = threading.Lock()


def flush_logs():
    log_lock.acquire()  # never released: the bug


if rank == 1:
    threading.Thread(target=flush_logs, daemon=True).start()
    threading.Event().wait(0.2)
for step in range(3):
    if rank == 1:
        with log_lock:  # waits forever
            pass
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    print(f"rank {rank} step {step}", flush=True)
dist.destroy_process_group()
