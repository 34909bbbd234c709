"""memory_breakdown: what holds the memory at an out-of-memory error, against what the failed allocation needed.

The figures in the OOM message (tried to allocate, capacity, free, allocated,
reserved) are combined with live ones: the CUDA allocator's counters when CUDA
is up (an OOM does not poison the context), parameters, gradients, optimizer
state and the largest live tensors. It walks the autograd graphs that the
failing frames' variables and the script's globals keep (graph_memory's walk):
graphs that span many forward passes and hold most of the memory in use are
memory kept across batches (an evaluation loop without `torch.no_grad()` that
sums loss tensors), which no batch size fixes. Otherwise, from the activation
memory per sample it estimates the batch size that fits, and says so when one
sample alone cannot fit, then ranks the fixes.
"""

from __future__ import annotations

import gc
import itertools
import linecache
import math
import re
import resource
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import nn

from ..diagnosis import ProbeResult
from ._support import describe, iter_tensors, result
from .context import ProbeContext
from .graph_memory import MAX_NODES, GraphWalk, model_storages, walk_graphs

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
    device_type = "cuda" if live else None
    held = _holdings(ctx, device_type)
    batch = _batch_size(ctx)
    kept = _kept_graph(ctx, device_type)
    kept_facts = _kept_facts(kept, figures.get("allocated") or figures.get("reserved"), "allocated by PyTorch")
    facts: dict[str, Any] = {"figures": figures, "live": live, "parameters": held.parameters,
                             "gradients": held.gradients, "optimizer_state": held.optimizer,
                             "largest_tensors": held.largest, "batch_size": batch, **kept_facts,
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
    if kept_facts.get("graphs_kept_across_batches"):
        parts.append(_kept_sentence(kept_facts["kept_graph"]))
        fixes, fit, note = _kept_graph_fixes(kept_facts["kept_graph"]), None, ""
    else:
        fixes, fit, note = _fixes(figures, held, batch, _failing_line(ctx))
    if note:
        parts.append(note)
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


def _failing_line(ctx: ProbeContext) -> str:
    """`file:line` (with its code) of the innermost user frame at the failure, or ''."""
    if not ctx.frames:
        return ""
    frame, line = ctx.frames[-1]
    filename = frame.f_code.co_filename
    code = linecache.getline(filename, line).strip()
    return f"{filename}:{line}" + (f" (`{code}`)" if code else "")


# Of the card, what a step may plan to use: the CUDA context, the allocator's rounding and fragmentation take the rest.
USABLE_SHARE = 0.9


def _fixes(figures: dict[str, int], held: Holdings, batch: int | None,
           location: str = "") -> tuple[list[str], int | None, str]:
    """The fixes, best first; the batch size estimated to fit; and a note for the detail when no batch size fits."""
    fixes: list[str] = []
    fit = None
    tried, capacity = figures.get("tried", 0), figures.get("capacity", 0)
    allocated = figures.get("allocated", 0)
    unallocated = figures.get("unallocated", max(figures.get("reserved", 0) - allocated, 0))
    static = held.static
    # What can be free for one step: the card less the weights, gradients and optimizer state, which stay.
    room = capacity * USABLE_SHARE - static if capacity else 0
    per_sample = None
    if batch and capacity and tried and allocated + tried - static > 0:
        per_sample = (allocated + tried - static) / batch
    if capacity and room <= 0:
        return _model_state_fixes(held, capacity)
    if capacity and tried and (tried > room or (per_sample is not None and per_sample > room)):
        return _one_sample_fixes(tried, per_sample, room, held, location)
    fragmented = None
    if unallocated and tried and unallocated >= tried:
        fragmented = (f"memory is fragmented ({human(unallocated)} reserved but unallocated, more than the "
                      f"{human(tried)} requested): set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    # Fragmentation leads only when the live tensors plus the request would fit: otherwise memory is really short.
    shortage = bool(capacity) and allocated + tried > 0.95 * capacity
    if fragmented and not shortage:
        fixes.append(fragmented)
    if per_sample is not None:
        fit = max(int(room // per_sample), 0)
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
    return fixes, fit, ""


def _one_sample_fixes(tried: int, per_sample: float | None, room: float, held: Holdings,
                      location: str) -> tuple[list[str], int, str]:
    """When one sample alone (or the one failed allocation) needs more than the card can free beside the weights and
    optimizer state, no batch size fits: the fixes that can work make the operation itself smaller."""
    need = max(tried, per_sample or 0)
    room_text = f"the {human(max(room, 0))} the card can free beside the weights, gradients and optimizer state"
    if tried > room:
        note = (f"that one allocation ({human(tried)}) is more than {room_text}: no batch size fits, not even 1, "
                f"so the operation that asks for it must get smaller")
    else:
        note = (f"one sample alone needs ≈ {human(per_sample or 0)} of activations, more than {room_text}: no batch "
                f"size fits, not even 1")
    at = f" at {location}" if location else ""
    fixes = []
    if tried > room:
        fixes.append(f"split the operation{at} into tiles/chunks (a loop over blocks of rows, queries, frames or "
                     f"patches that keeps only what it needs of each) so that it never materialises {human(tried)} "
                     f"at once")
    else:
        fixes.append("use activation checkpointing (torch.utils.checkpoint) on the largest blocks: one sample's "
                     "activations are then recomputed in backward instead of all kept")
    fixes.append("for attention, use a memory-efficient kernel (torch.nn.functional.scaled_dot_product_attention, "
                 "xformers): it never materialises the length × length score matrix")
    fixes.append("shorten the inputs (a shorter sequence or context window, a lower resolution, crops): the memory "
                 "grows with the input size, not the batch")
    if held.dtype in (torch.float32, None) and need / 2 <= room:
        fixes.append("train in mixed precision (torch.autocast with bfloat16/float16): it halves activations, "
                     f"≈ {human(need / 2)}, which would fit")
    return fixes, 0, note


def _model_state_fixes(held: Holdings, capacity: int) -> tuple[list[str], int, str]:
    """When the weights, gradients and optimizer state alone fill the card, no batch size fits: hold less state."""
    note = (f"the weights, gradients and optimizer state alone take {human(held.static)} of the {human(capacity)} "
            f"card: no batch size fits, not even 1")
    fixes = ["load less model onto the card: half precision (bfloat16/float16 weights), a smaller or quantised "
             "variant, or offload part of it to the CPU"]
    if held.optimizer:
        fixes.append(f"hold less optimizer state ({human(held.optimizer)}): a lighter optimizer (SGD, Adafactor, "
                     "8-bit Adam) or sharding it across GPUs (ZeRO / FSDP)")
    if held.gradients:
        fixes.append("free gradients between steps (`optimizer.zero_grad(set_to_none=True)`) and do not keep "
                     "gradients of frozen parameters (`requires_grad_(False)`)")
    return fixes, 0, note


# A variable's autograd graphs that span at least this many forward passes and hold at least this share of the memory
# in use are memory kept across batches. Two or three passes in one graph are ordinary within one step (two views
# through the same model, a student and teacher sharing layers), so the bar sits above them.
MANY_PASSES = 4
HOLDS_MOST = 0.5
MAX_ITEMS = 10_000  # items of one list, tuple or dict looked at for tensors


@dataclass
class KeptGraph:
    """The variable whose autograd graphs hold the most saved memory, where it lives, and what the walk found."""

    variable: str
    where: str
    walk: GraphWalk


def _kept_graph(ctx: ProbeContext, device_type: str | None) -> KeptGraph | None:
    """The variable of the failing frames or the script's globals whose graphs hold the most saved tensors, within
    one node budget for all of them; None when no graph holds any."""
    exclude: set[tuple[str, int]] | None = None
    best: KeptGraph | None = None
    budget = MAX_NODES
    walked: set[int] = set()
    for variable, where, roots in _graph_holders(ctx):
        if budget <= 0:
            break
        if all(id(root) in walked for root in roots):
            continue  # the same graph under another name
        walked.update(id(root) for root in roots)
        exclude = model_storages() if exclude is None else exclude
        walk = walk_graphs(roots, exclude, device_type, budget)
        budget -= walk.nodes
        if best is None or walk.held_bytes > best.walk.held_bytes:
            best = KeptGraph(variable, where, walk)
    return best if best is not None and best.walk.held_bytes else None


def _graph_holders(ctx: ProbeContext) -> Iterator[tuple[str, str, list[Any]]]:
    """(variable, file:line, grad_fn nodes) for each variable of the failing user frames (innermost first) and of the
    script's globals that holds tensors with a grad_fn: itself, or in a list, tuple or dict."""
    scopes: list[tuple[dict[str, Any], str]] = []
    for frame, line in reversed(ctx.frames):
        scope = frame.f_locals
        if isinstance(scope.get("self"), nn.Module):
            continue  # a forward's own locals are that one forward's graph, by construction
        scopes.append((scope, f"{frame.f_code.co_filename}:{line}"))
    main = sys.modules.get("__main__")
    globals_ = getattr(main, "__dict__", None)
    if isinstance(globals_, dict) and not any(scope is globals_ for scope, _ in scopes):
        scopes.append((globals_, str(getattr(main, "__file__", None) or "the script")))
    seen: set[int] = set()
    for scope, where in scopes:
        for name, value in list(scope.items()):
            if id(value) in seen:
                continue
            seen.add(id(value))
            roots = _grad_fns(value)
            if roots:
                yield name, where, roots


def _grad_fns(value: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        items: Any = (value,)
    elif isinstance(value, (list, tuple)):
        items = value[:MAX_ITEMS]
    elif isinstance(value, dict):
        items = list(itertools.islice(value.values(), MAX_ITEMS))
    else:
        return []
    return [item.grad_fn for item in items if isinstance(item, torch.Tensor) and item.grad_fn is not None]


def _kept_facts(kept: KeptGraph | None, in_use: int | None, in_use_word: str) -> dict[str, Any]:
    """The facts the OOM rules' causes read: the largest kept graph, and whether it is memory kept across batches."""
    if kept is None:
        return {}
    walk = kept.walk
    share = walk.held_bytes / in_use if in_use else None
    graph = {"variable": kept.variable, "where": kept.where, "passes": walk.passes, "held_bytes": walk.held_bytes,
             "held": human(walk.held_bytes), "in_use": human(in_use) if in_use else None, "in_use_word": in_use_word,
             "share": round(share, 3) if share is not None else None, "nodes": walk.nodes,
             "saved_tensors": walk.storages, "complete": walk.complete}
    across = walk.passes >= MANY_PASSES and share is not None and share >= HOLDS_MOST
    return {"kept_graph": graph, "graphs_kept_across_batches": across}


def _kept_sentence(graph: dict[str, Any]) -> str:
    at_least = "" if graph["complete"] else "at least "
    return (f"`{graph['variable']}` ({graph['where']}) keeps autograd graphs that span {at_least}{graph['passes']} "
            f"forward passes and hold {at_least}{graph['held']} of saved tensors, {graph['share']:.0%} of the "
            f"{graph['in_use']} {graph['in_use_word']}: every batch's graph stays alive because no backward() frees "
            f"it, so memory grows batch after batch")


def _kept_graph_fixes(graph: dict[str, Any]) -> list[str]:
    return [f"run the evaluation under `torch.no_grad()` (or `torch.inference_mode()`) and accumulate "
            f"`{graph['variable']}` from `loss.item()` or `loss.detach()`: each batch's graph is then freed with the "
            f"batch instead of {graph['held']} kept over {graph['passes']} batches",
            "if one backward over many batches is really wanted, call backward() on each batch's loss and "
            "accumulate gradients instead of summing the losses first"]


def _resident_bytes() -> int | None:
    """This process's resident memory (VmRSS), what kept graphs on the host are measured against."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        return None


def _host_oom(ctx: ProbeContext, figures: dict[str, int]) -> ProbeResult:
    tried = figures.get("tried", 0)
    host = _host_available()
    held = _holdings(ctx, "cpu")
    limits = [v for v in (host.get("MemAvailable"), host.get("cgroup_limit"), host.get("address_space_left")) if v is not None]
    available = min(limits) if limits else None
    kept_facts = _kept_facts(_kept_graph(ctx, "cpu"), _resident_bytes(), "resident in this process")
    facts = {"tried": tried, "host": host, "parameters": held.parameters, "gradients": held.gradients,
             "optimizer_state": held.optimizer, "largest_tensors": held.largest, **kept_facts}
    parts = [f"the failed host allocation asked for {human(tried)}" if tried else "a host allocation failed"]
    if available:
        parts.append(f"the host has {human(host.get('MemAvailable', 0))} available"
                     + (f" (cgroup limit {human(host['cgroup_limit'])})" if host.get("cgroup_limit") else "")
                     + (f", but the process's address-space limit (ulimit -v) leaves {human(host['address_space_left'])}"
                        if "address_space_left" in host else ""))
    if held.largest:
        parts.append("largest live tensors: " + ", ".join(held.largest[:3]))
    fixes = ""
    if kept_facts.get("graphs_kept_across_batches"):
        parts.append(_kept_sentence(kept_facts["kept_graph"]))
        facts["fixes"] = _kept_graph_fixes(kept_facts["kept_graph"])
        fixes = ". Fixes, best first: " + " ".join(f"({i}) {fix}" for i, fix in enumerate(facts["fixes"], 1))
    if tried and available and tried > available:
        total = host.get("MemTotal", 0)
        hint = (" — more than the machine's entire memory: the size itself is wrong (check the shape being "
                "created, e.g. a dimension multiplied instead of added)") if total and tried > total else ""
        return result(NAME, "confirmed", "; ".join(parts) + hint + fixes, **facts)
    # Kept graphs that hold most of the process's memory confirm what filled it, whatever is free by now.
    status = ("confirmed" if kept_facts.get("graphs_kept_across_batches") else
              "inconclusive" if not (tried and available) else "refuted")
    return result(NAME, status, "; ".join(parts) + fixes, **facts)
