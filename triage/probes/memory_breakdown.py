"""memory_breakdown: what holds the memory at an out-of-memory error, against what the failed allocation needed.

The figures in the OOM message (tried to allocate, capacity, free, allocated,
reserved) are combined with live ones: the CUDA allocator's counters when CUDA
is up (an OOM does not poison the context), parameters, gradients, optimizer
state and the largest live tensors. From the activation memory per sample it
estimates the batch size that fits and ranks the fixes.
"""

from __future__ import annotations

import gc
import math
import re
import resource
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..diagnosis import ProbeResult
from ._support import describe, iter_tensors, result
from .context import ProbeContext

NAME = "memory_breakdown"
_UNITS = {"b": 1, "bytes": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
          "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}
_SIZE = r"(?P<{}>[\d.]+)\s*(?P<{}_unit>[KMGT]i?B|B|bytes)"
_PATTERNS = {
    "tried": [r"Tried to allocate " + _SIZE.format("tried", "tried"),
              r"you tried to allocate (?P<tried>\d+) (?P<tried_unit>bytes)"],
    "capacity": [r"total capaci?ty of " + _SIZE.format("capacity", "capacity"),
                 _SIZE.format("capacity", "capacity") + r" total capacity",
                 r"max allowed: " + _SIZE.format("capacity", "capacity")],
    "free": [r"of which " + _SIZE.format("free", "free") + r" is free",
             _SIZE.format("free", "free") + r" free"],
    "allocated": [_SIZE.format("allocated", "allocated") + r" is allocated by PyTorch",
                  _SIZE.format("allocated", "allocated") + r" already allocated",
                  r"MPS allocated: " + _SIZE.format("allocated", "allocated")],
    "unallocated": [_SIZE.format("unallocated", "unallocated") + r" is reserved by PyTorch but unallocated"],
    "reserved": [_SIZE.format("reserved", "reserved") + r" reserved in total by PyTorch"],
}


# figure -> the group name the OOM rules use for it
_VALUE_NAMES = {"tried": "tried", "capacity": "total", "free": "free", "allocated": "allocated",
                "unallocated": "unalloc", "reserved": "reserved"}


def _size(text) -> int | None:
    """Bytes in '2.00 GiB' / '512 MiB' / '4096 bytes', or None."""
    found = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]i?B|B|bytes)\s*", str(text or ""), re.IGNORECASE)
    if not found:
        return None
    return int(float(found[1]) * _UNITS.get(found[2].lower(), 1))


def parse_oom(message: str) -> dict[str, int]:
    """Byte figures named in an out-of-memory message (any torch version's wording)."""
    figures: dict[str, int] = {}
    for key, patterns in _PATTERNS.items():
        for pattern in patterns:
            found = re.search(pattern, message, re.IGNORECASE)
            if found:
                unit = _UNITS.get(found[f"{key}_unit"].lower(), 1)
                figures[key] = int(float(found[key]) * unit)
                break
    if "reserved" not in figures and "allocated" in figures and "unallocated" in figures:
        figures["reserved"] = figures["allocated"] + figures["unallocated"]
    return figures


def human(n: float) -> str:
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


@dataclass
class Holdings:
    """Bytes held by the training state, by kind, and the largest live tensors."""

    parameters: int = 0
    gradients: int = 0
    optimizer: int = 0
    largest: list[str] = field(default_factory=list)
    dtype: torch.dtype | None = None

    @property
    def static(self) -> int:
        return self.parameters + self.gradients + self.optimizer


def _holdings(ctx: ProbeContext, device_type: str | None) -> Holdings:
    held = Holdings()
    model = ctx.model if isinstance(ctx.model, nn.Module) else None
    names: dict[int, str] = {}
    if model is not None:
        for name, p in model.named_parameters():
            if device_type is None or p.device.type == device_type:
                held.parameters += p.numel() * p.element_size()
                if p.grad is not None:
                    held.gradients += p.grad.numel() * p.grad.element_size()
                    names[id(p.grad)] = f"{name}.grad"
                names[id(p)] = name
                held.dtype = held.dtype or p.dtype
    optimizer = ctx.optimizer
    if optimizer is not None and hasattr(optimizer, "state"):
        for param, state in list(optimizer.state.items()):
            for key, value in (state.items() if isinstance(state, dict) else ()):
                if isinstance(value, torch.Tensor) and (device_type is None or value.device.type == device_type):
                    held.optimizer += value.numel() * value.element_size()
                    names[id(value)] = f"optimizer {key} of {names.get(id(param), 'a parameter')}"
    held.largest = _largest_live(device_type, names)
    return held


def _largest_live(device_type: str | None, names: dict[int, str], top: int = 5) -> list[str]:
    with warnings.catch_warnings():  # isinstance() on some lazy module attributes warns about deprecations
        warnings.simplefilter("ignore")
        return _scan_live(device_type, names, top)


def _scan_live(device_type: str | None, names: dict[int, str], top: int) -> list[str]:
    tensors: dict[tuple, tuple[int, str]] = {}
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, torch.Tensor) or obj.device.type == "meta":
                continue
            if device_type is not None and obj.device.type != device_type:
                continue
            storage = obj.untyped_storage()
            key = (str(obj.device), storage.data_ptr())
            size = storage.nbytes()
        except Exception:
            continue
        if key not in tensors or id(obj) in names:
            tensors[key] = (size, names.get(id(obj)) or describe(obj))
    ranked = sorted(tensors.values(), key=lambda item: -item[0])[:top]
    return [f"{label}: {human(size)}" for size, label in ranked]


def _batch_size(ctx: ProbeContext) -> int | None:
    for source in (ctx.batch, ctx.model_args):
        for _, tensor in iter_tensors(source):
            if tensor.dim() >= 1:
                return int(tensor.shape[0])
    return None


def _cuda_live() -> dict[str, int]:
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    device = torch.cuda.current_device()
    return {"allocated": torch.cuda.memory_allocated(device), "reserved": torch.cuda.memory_reserved(device),
            "peak": torch.cuda.max_memory_allocated(device),
            "capacity": torch.cuda.get_device_properties(device).total_memory}


def _host_available() -> dict[str, int]:
    figures: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    figures[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path, encoding="ascii") as f:
                text = f.read().strip()
            if text.isdigit() and int(text) < 1 << 60:
                figures["cgroup_limit"] = int(text)
                break
        except OSError:
            continue
    # A job's `ulimit -v` (RLIMIT_AS) caps the process below what the host has free.
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        try:
            with open("/proc/self/status", encoding="ascii") as f:
                size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
            figures["address_space_left"] = max(0, soft - size)
        except (OSError, StopIteration, ValueError):
            pass
    return figures


def memory_breakdown(ctx: ProbeContext) -> ProbeResult:
    exc = ctx.incident.exception
    message = "\n".join(e.message for e in ctx.incident.exceptions) or (exc.message if exc else "")
    message += "\n" + "\n".join(ctx.incident.log_lines)
    figures = parse_oom(message)
    values = getattr(ctx.diagnosis, "values", {}) or {}
    for key, name in _VALUE_NAMES.items():  # what the rule's match extracted, where the text gave nothing
        size = _size(values.get(name))
        if key not in figures and size is not None:
            figures[key] = size
    host = "DefaultCPUAllocator" in message or "can't allocate memory" in message
    if host:
        return _host_oom(ctx, figures)
    live = _cuda_live()
    for key in ("capacity", "allocated", "reserved"):
        if live.get(key):
            figures.setdefault(key, live[key])
    held = _holdings(ctx, "cuda" if live else None)
    batch = _batch_size(ctx)
    facts: dict[str, Any] = {"figures": figures, "live": live, "parameters": held.parameters,
                             "gradients": held.gradients, "optimizer_state": held.optimizer,
                             "largest_tensors": held.largest, "batch_size": batch,
                             "diagnosis_values": {k: v for k, v in values.items() if isinstance(v, (str, int, float))}}
    parts = []
    if figures.get("tried"):
        parts.append(f"the failed allocation needed {human(figures['tried'])}")
    if figures.get("capacity"):
        in_use = figures.get("allocated")
        parts.append(f"the GPU has {human(figures['capacity'])}" +
                     (f", {human(in_use)} allocated by PyTorch" if in_use else "") +
                     (f", {human(figures['free'])} free" if "free" in figures else ""))
    if live.get("peak"):
        parts.append(f"peak allocated this run {human(live['peak'])}")
    if held.static:
        parts.append(f"parameters {human(held.parameters)}, gradients {human(held.gradients)}, optimizer state "
                     f"{human(held.optimizer)}")
    fixes, fit = _fixes(figures, held, batch)
    facts["fixes"] = fixes
    if fit is not None:
        facts["batch_size_estimate"] = fit
    detail = "; ".join(parts) if parts else "no memory figures in the message and no CUDA device to ask"
    if fixes:
        detail += ". Fixes, best first: " + " ".join(f"({i}) {fix}" for i, fix in enumerate(fixes[:4], 1))
    status = _status(figures)
    return result(NAME, status, detail, **facts)


def _status(figures: dict[str, int]) -> str:
    tried, capacity = figures.get("tried"), figures.get("capacity")
    if not tried or not capacity:
        return "inconclusive"
    used = figures.get("reserved") or figures.get("allocated") or 0
    free = figures.get("free", max(capacity - used, 0))
    return "confirmed" if tried > free else "refuted"


def _fixes(figures: dict[str, int], held: Holdings, batch: int | None) -> tuple[list[str], int | None]:
    fixes: list[str] = []
    fit = None
    tried, capacity = figures.get("tried", 0), figures.get("capacity", 0)
    allocated = figures.get("allocated", 0)
    unallocated = figures.get("unallocated", max(figures.get("reserved", 0) - allocated, 0))
    fragmented = None
    if unallocated and tried and unallocated >= tried:
        fragmented = (f"memory is fragmented ({human(unallocated)} reserved but unallocated, more than the "
                      f"{human(tried)} requested): set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    # Fragmentation leads only when the live tensors plus the request would fit: otherwise memory is really short.
    shortage = bool(capacity) and allocated + tried > 0.95 * capacity
    if fragmented and not shortage:
        fixes.append(fragmented)
    if batch and capacity and tried:
        static = held.static if held.static else 0
        activations = allocated + tried - static
        if activations > 0:
            per_sample = activations / batch
            fit = max(int((capacity * 0.9 - static) // per_sample), 0)
            if fit < batch:
                steps = math.ceil(batch / max(fit, 1))
                fixes.append(f"reduce the batch from {batch} to about {max(fit, 1)} (activations ≈ "
                             f"{human(per_sample)} per sample) and accumulate gradients over {steps} steps to keep "
                             f"the effective batch size")
    if fragmented and shortage:
        fixes.append(fragmented)
    if held.dtype in (torch.float32, None):
        fixes.append("train in mixed precision (torch.autocast with bfloat16/float16): activations take half the memory")
    fixes.append("use activation checkpointing (torch.utils.checkpoint) on the largest blocks")
    if held.optimizer and held.parameters and held.optimizer >= 2 * held.parameters:
        fixes.append(f"optimizer state is {human(held.optimizer)} ({held.optimizer / held.parameters:.1f}× the "
                     "parameters): consider a lighter optimizer or sharding it")
    if not any("expandable_segments" in f for f in fixes) and unallocated:
        fixes.append("if reserved-but-unallocated memory grows, set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    return fixes, fit


def _host_oom(ctx: ProbeContext, figures: dict[str, int]) -> ProbeResult:
    tried = figures.get("tried", 0)
    host = _host_available()
    held = _holdings(ctx, "cpu")
    limits = [v for v in (host.get("MemAvailable"), host.get("cgroup_limit"), host.get("address_space_left")) if v is not None]
    available = min(limits) if limits else None
    facts = {"tried": tried, "host": host, "parameters": held.parameters, "gradients": held.gradients,
             "optimizer_state": held.optimizer, "largest_tensors": held.largest}
    parts = [f"the failed host allocation asked for {human(tried)}" if tried else "a host allocation failed"]
    if available:
        parts.append(f"the host has {human(host.get('MemAvailable', 0))} available"
                     + (f" (cgroup limit {human(host['cgroup_limit'])})" if host.get("cgroup_limit") else "")
                     + (f", but the process's address-space limit (ulimit -v) leaves {human(host['address_space_left'])}"
                        if "address_space_left" in host else ""))
    if held.largest:
        parts.append("largest live tensors: " + ", ".join(held.largest[:3]))
    if tried and available and tried > available:
        total = host.get("MemTotal", 0)
        hint = (" — more than the machine's entire memory: the size itself is wrong (check the shape being "
                "created, e.g. a dimension multiplied instead of added)") if total and tried > total else ""
        return result(NAME, "confirmed", "; ".join(parts) + hint, **facts)
    status = "inconclusive" if not (tried and available) else "refuted"
    return result(NAME, status, "; ".join(parts), **facts)
