"""Each rank all-reduces the metrics it computed, but rank 1 computes two extra ones: the tensors' sizes differ."""
import datetime

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
rank = dist.get_rank()
metrics = {"loss": 0.5, "acc": 0.9}
if rank == 1:
    metrics.update(precision=0.8, recall=0.7)
values = torch.tensor(list(metrics.values()))
dist.all_reduce(values)
print(f"rank {rank}: {values.tolist()}", flush=True)
dist.destroy_process_group()
