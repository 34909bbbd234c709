"""The environment of a run: Python, torch, CUDA/cuDNN, GPUs and the environment variables that matter.

Never initialises CUDA: GPU names and memory are read only when the script
already initialised CUDA and the context is not poisoned by an earlier error.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

from .secrets import SCRUBBED, is_secret_name, scrub_text

ENV_NAMES = (
    "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING", "CUDA_DEVICE_ORDER", "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING", "TORCH_USE_CUDA_DSA", "TORCH_SHOW_CPP_STACKTRACES",
    "TORCH_DISTRIBUTED_DEBUG", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "WORLD_SIZE", "RANK", "LOCAL_RANK",
    "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
    "CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED", "PYTHONFAULTHANDLER",
)  # fmt: skip
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCHINDUCTOR_", "TORCHDYNAMO_", "TORCHELASTIC_", "GLOO_", "CUDNN_")
MAX_ENV_VALUE = 200


def environment(*, cuda_usable: bool = True) -> dict[str, Any]:
    """What a report needs to know about where the run happened; never raises."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": _attempt(platform.platform),
        "executable": sys.executable,
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        env.update(_torch_environment(torch, cuda_usable))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        env["numpy"] = getattr(numpy, "__version__", None)
    env["env"] = relevant_env_vars()
    return env


def torch_versions(torch) -> dict[str, Any]:
    """The cheap part: versions only (safe right after `import torch`)."""
    version = getattr(torch, "version", None)
    return {
        "torch": str(getattr(torch, "__version__", "")) or None,
        "cuda": getattr(version, "cuda", None),
        "hip": getattr(version, "hip", None),
        "torch_git": (getattr(version, "git_version", None) or "")[:10] or None,
    }


def _torch_environment(torch, cuda_usable: bool) -> dict[str, Any]:
    env = torch_versions(torch)
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return env
    env["cudnn"] = _attempt(lambda: torch.backends.cudnn.version()) if env.get("cuda") else None
    env["cuda_available"] = _attempt(cuda.is_available, False)
    env["gpu_count"] = _attempt(cuda.device_count, 0) if env["cuda_available"] else 0
    initialized = _attempt(cuda.is_initialized, False)
    env["cuda_initialized"] = initialized
    if initialized and cuda_usable:
        gpus = []
        for index in range(min(env["gpu_count"] or 0, 16)):
            gpu: dict[str, Any] = {"index": index}
            props = _attempt(lambda: cuda.get_device_properties(index))
            if props is not None:
                gpu.update(name=props.name, total_memory=props.total_memory, capability=f"{props.major}.{props.minor}")
            gpu["allocated"] = _attempt(lambda: cuda.memory_allocated(index))
            gpu["reserved"] = _attempt(lambda: cuda.memory_reserved(index))
            gpu["max_allocated"] = _attempt(lambda: cuda.max_memory_allocated(index))
            free_total = _attempt(lambda: cuda.mem_get_info(index))
            if free_total:
                gpu["free"] = free_total[0]
            gpus.append(gpu)
        env["gpus"] = gpus
    elif initialized:
        env["gpus_note"] = "CUDA context unusable after the error; GPU memory not queried"
    return env


def launcher_rank(environ: dict[str, str] | None = None) -> int | None:
    """The process's rank when a launcher (torchrun, SLURM, mpirun) set one."""
    environ = os.environ if environ is None else environ
    for name in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def relevant_env_vars(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    out = {}
    for name in sorted(environ):
        if name in ENV_NAMES or name.startswith(ENV_PREFIXES):
            value = environ[name]
            out[name] = SCRUBBED if is_secret_name(name) else scrub_text(value[:MAX_ENV_VALUE])
    return out


def _attempt(call, default=None):
    try:
        return call()
    except Exception:
        return default
