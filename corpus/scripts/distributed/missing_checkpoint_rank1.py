"""Each rank resumes from its own optimizer shard; rank 1's shard file was never written."""
import datetime
import os
import tempfile

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
rank = dist.get_rank()
folder = os.path.join(tempfile.gettempdir(), f"triage-corpus-ckpt-{os.environ.get('TORCHELASTIC_RUN_ID', 'job')}")
os.makedirs(folder, exist_ok=True)
model = nn.Linear(3, 3)
if rank == 0:
    torch.save(model.state_dict(), os.path.join(folder, "optim-rank0.pt"))  # only rank 0 saved its shard
dist.barrier()
state = torch.load(os.path.join(folder, f"optim-rank{rank}.pt"))
model.load_state_dict(state)
dist.barrier()
print(f"rank {rank} resumed", flush=True)
dist.destroy_process_group()
