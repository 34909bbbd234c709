"""The init_method adds LOCAL_RANK to the port by mistake: rank 1 looks for the store on a port nobody listens on."""
import datetime
import os

import torch.distributed as dist

port = int(os.environ["MASTER_PORT"]) + int(os.environ["LOCAL_RANK"])  # the bug: per-rank port
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=int(os.environ["RANK"]),
                        world_size=int(os.environ["WORLD_SIZE"]), timeout=datetime.timedelta(seconds=5))
print(f"rank {dist.get_rank()} joined", flush=True)
dist.destroy_process_group()
