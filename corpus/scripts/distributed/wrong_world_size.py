"""The script hard-codes world_size=3 from an old config while torchrun starts 2 ranks: rendezvous waits for a third."""
import datetime
import os

import torch.distributed as dist

WORLD_SIZE = 3  # copied from the 3-GPU machine's config
dist.init_process_group("gloo", init_method="env://", rank=int(os.environ["RANK"]), world_size=WORLD_SIZE,
                        timeout=datetime.timedelta(seconds=5))
print(f"rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
dist.destroy_process_group()
