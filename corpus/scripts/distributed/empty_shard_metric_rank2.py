"""Three ranks split 4 validation samples by rank; rank 2 gets none and its accuracy divides by zero."""
import datetime

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
rank, world = dist.get_rank(), dist.get_world_size()
samples = list(range(4))
per_rank = -(-len(samples) // world)  # ceil: 2, 2, 0
mine = samples[rank * per_rank:(rank + 1) * per_rank]
correct = sum(1 for s in mine if s % 2 == 0)
accuracy = correct / len(mine)
result = torch.tensor([accuracy])
dist.all_reduce(result)
print(f"rank {rank}: mean accuracy {result.item() / world:.2f}", flush=True)
dist.destroy_process_group()
