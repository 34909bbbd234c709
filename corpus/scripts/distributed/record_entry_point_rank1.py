"""An @record entry point (torchelastic writes each rank's error file): rank 1 indexes past its label table."""
import datetime

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
    rank = dist.get_rank()
    labels = torch.arange(10)
    index = 3 if rank == 0 else 12  # rank 1's sampler offset is computed from the wrong shard length
    total = labels[index].float().reshape(1)
    dist.all_reduce(total)
    print(f"rank {rank}: total {total.item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
