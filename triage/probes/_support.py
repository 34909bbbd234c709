"""What every probe needs: the CPU view of the failing step's tensors and modules, and small shared helpers.

Probes that run user code run in a disposable child forked at the failure
(sandbox.py), so they use the user's own objects there: nothing is copied but
what fork cannot give the child. That is CUDA tensors (CUDA does not survive
fork: `host_copies` copies the known ones to the host before the fork, within
MAX_COPY_BYTES) and tensors in shared memory (a DataLoader worker's batch,
`share_memory_()`), whose writes fork does not isolate. After an asynchronous
CUDA error every CUDA call raises, so CUDA tensors are read only when the
incident's text says the CUDA context is still usable; their shape and dtype
(host-side metadata) are always safe.
"""

from __future__ import annotations

import contextlib
import copy
import re
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import nn

from .. import tracking
from ..diagnosis import ProbeResult
from ..incident import is_user_path
from .context import ProbeContext

# Most bytes of device tensors copied to the host before an experiment (or of zeros standing in for unreadable ones).
MAX_COPY_BYTES = 2 * 1024**3
# Host copies of the context's CUDA tensors, by id, made by `host_copies` before the fork.
HOST_COPIES: dict[int, torch.Tensor] = {}

_POISONING = re.compile(
    r"device-side assert|CUDA error: (?!out of memory)|illegal memory access|misaligned address"
    r"|unspecified launch failure|illegal instruction|CUBLAS_STATUS_EXECUTION_FAILED"
    r"|CUDNN_STATUS_EXECUTION_FAILED|cudaErrorIllegalAddress|cudaErrorLaunchFailure|CUDA kernel errors",
    re.IGNORECASE,
)
_KERNEL_ASSERT = re.compile(r"\.cu:\d+: .*Assertion .* failed")


class Unavailable(Exception):
    """Raised when a probe cannot get what it needs (the reason is the message); the probe skips."""


# ---------------------------------------------------------------------------- state of the process


def cuda_poisoned(ctx: ProbeContext) -> bool:
    """True when the incident says the CUDA context is unusable, so no CUDA tensor may be read."""
    texts = [ctx.exception and str(ctx.exception) or ""]
    incident = ctx.incident
    for exc in incident.exceptions or ([incident.exception] if incident.exception else []):
        texts.append(exc.message)
    if any(_POISONING.search(text) for text in texts if text):
        return True
    return any(_KERNEL_ASSERT.search(line) for line in incident.log_lines)


def innermost_user_frame(stack: list[traceback.FrameSummary] | None) -> traceback.FrameSummary | None:
    """The innermost frame of `stack` in the user's code (not torch, not the stdlib, not triage)."""
    for frame in reversed(stack or []):
        if is_user_path(frame.filename) and "/triage/" not in frame.filename.replace("\\", "/"):
            return frame
    return None


def torch_frame_locals(exc: BaseException | None, filename: str, function: str) -> dict[str, Any] | None:
    """The locals of the outermost frame of torch's `function` in `filename` (e.g. "serialization.py", "load") on
    the exception's traceback: the arguments torch itself was given."""
    tb = exc.__traceback__ if exc is not None else None
    while tb is not None:
        code = tb.tb_frame.f_code
        path = code.co_filename.replace("\\", "/")
        if code.co_name == function and path.endswith("/" + filename) and "/torch/" in path:
            return tb.tb_frame.f_locals
        tb = tb.tb_next
    return None


def where(frame: traceback.FrameSummary | None) -> str:
    """`file:line in function: `code`` for a frame, '' for None."""
    if frame is None:
        return ""
    code = f": `{frame.line.strip()}`" if frame.line else ""
    return f"{frame.filename}:{frame.lineno} in {frame.name}{code}"


# ---------------------------------------------------------------------------- tensors and nesting


def iter_tensors(obj: Any, path: str = "", depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """(path, tensor) for every tensor in nested dicts, lists, tuples and dataclass-like batches."""
    if depth > 6:
        return
    if isinstance(obj, torch.Tensor):
        yield path or "tensor", obj
    elif isinstance(obj, dict) or (hasattr(obj, "items") and hasattr(obj, "keys") and not isinstance(obj, nn.Module)):
        try:
            items = list(obj.items())
        except Exception:
            return
        for key, value in items:
            yield from iter_tensors(value, f"{path}[{key!r}]" if path else str(key), depth + 1)
    elif isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            yield from iter_tensors(value, f"{path}[{index}]" if path else f"[{index}]", depth + 1)


def describe(tensor: torch.Tensor) -> str:
    """`Long[8, 16] on cuda:0` (metadata only, safe on a poisoned device)."""
    dtype = str(tensor.dtype).replace("torch.", "")
    dtype = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16", "int64": "Long",
             "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool"}.get(dtype, dtype)
    return f"{dtype}[{', '.join(str(s) for s in tensor.shape)}] on {tensor.device}"


def readable(tensor: torch.Tensor, poisoned: bool) -> bool:
    """Whether a tensor's values can be read without a CUDA call that would raise (none can in a forked child,
    except through the host copies made before the fork)."""
    if tensor.device.type == "meta":
        return False
    if tensor.device.type == "cpu":
        return True
    from .sandbox import in_sandbox

    return id(tensor) in HOST_COPIES if in_sandbox() else not poisoned


def to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's values on the CPU, detached: itself for a CPU tensor (in an experiment's child, fork keeps the
    user's own safe), a private copy for one in shared memory, the host copy for a device tensor."""
    out = tensor.detach()
    if out.device.type == "cpu":
        # a sparse tensor has no storage to ask about (is_shared raises); the fork already isolates it
        return out.clone() if out.layout == torch.strided and out.is_shared() else out
    host = HOST_COPIES.get(id(tensor))
    return host if host is not None else out.to("cpu")


def _known_tensors(ctx: ProbeContext) -> Iterator[torch.Tensor]:
    """The tensors of the failing step a probe may read: the modules', the batch and the calls' arguments."""
    for owner in (ctx.model, ctx.module, ctx.loss_fn):
        if isinstance(owner, nn.Module):
            for module in owner.modules():
                yield from (t for t in module._parameters.values() if t is not None)
                yield from (t for t in module._buffers.values() if t is not None)
                yield from (v for v in vars(module).values() if isinstance(v, torch.Tensor))
    for value in (ctx.batch, ctx.model_args, ctx.model_kwargs, ctx.module_args, ctx.module_kwargs, ctx.loss_args,
                  ctx.loss_kwargs):
        yield from (t for _, t in iter_tensors(value))


@contextlib.contextmanager
def host_copies(ctx: ProbeContext, poisoned: bool) -> Iterator[list[str]]:
    """Copy the context's CUDA tensors to the host for the experiment forked inside (and drop them after).

    After an asynchronous CUDA error nothing is copied: the child uses zeros or the CPU batch instead. Past
    MAX_COPY_BYTES nothing is copied either, and the experiment says the model is too large to copy."""
    notes: list[str] = []
    device = {id(t): t for t in _known_tensors(ctx) if t.device.type not in ("cpu", "meta")}
    size = sum(t.numel() * t.element_size() for t in device.values())
    if device and poisoned:
        notes.append("the device's tensors are unreadable after the CUDA error")
    elif device and size > MAX_COPY_BYTES:
        notes.append(f"the step's device tensors take {size / 1024**3:.1f} GB, over the "
                     f"{MAX_COPY_BYTES / 1024**3:.0f} GB copied to the host")
    elif device:
        with torch.no_grad():
            for key, tensor in device.items():
                HOST_COPIES[key] = tensor.detach().to("cpu")
    try:
        yield notes
    finally:
        HOST_COPIES.clear()


def map_structure(obj: Any, leaf: Callable[[torch.Tensor, str], Any], path: str = "") -> Any:
    """Rebuild nested dicts/lists/tuples with each tensor replaced by leaf(tensor, path)."""
    if isinstance(obj, torch.Tensor):
        return leaf(obj, path or "tensor")
    if isinstance(obj, dict):
        out = {k: map_structure(v, leaf, f"{path}[{k!r}]" if path else str(k)) for k, v in obj.items()}
        try:
            return type(obj)(out)
        except Exception:
            return out
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(map_structure(v, leaf, f"{path}.{f}") for f, v in zip(obj._fields, obj)))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_structure(v, leaf, f"{path}[{i}]" if path else f"[{i}]") for i, v in enumerate(obj))
    if hasattr(obj, "items") and hasattr(obj, "keys") and not isinstance(obj, nn.Module):
        try:
            data = {k: map_structure(v, leaf, f"{path}[{k!r}]") for k, v in obj.items()}
        except Exception:
            return obj
        try:
            return type(obj)(data)
        except Exception:
            return data
    return obj


@dataclass
class Inputs:
    """A call's arguments rebuilt on the CPU, with how each unreadable tensor was recovered."""

    args: tuple
    kwargs: dict[str, Any]
    notes: list[str]
    missing: list[str]


def cpu_inputs(args: tuple, kwargs: dict[str, Any], batch: Any, poisoned: bool) -> Inputs:
    """A call's arguments on the CPU (the tensors themselves, in an experiment's child; see to_cpu).

    A tensor that cannot be read (on a poisoned device) is recovered from the
    CPU batch the DataLoader yielded, matched by shape: that is the data the
    user moved to the device. A floating tensor with no match is replaced by
    zeros of its shape (values rarely matter for index and shape bugs); an
    integer one is listed as missing, since made-up indices would hide the bug.
    """
    candidates = [(p, t) for p, t in iter_tensors(batch) if t.device.type == "cpu"]
    notes: list[str] = []
    missing: list[str] = []

    def leaf(tensor: torch.Tensor, path: str) -> Any:
        if readable(tensor, poisoned):
            copied = to_cpu(tensor)
            return copied.requires_grad_(True) if tensor.requires_grad and copied.is_floating_point() else copied
        for batch_path, candidate in candidates:
            if tuple(candidate.shape) == tuple(tensor.shape):
                notes.append(f"{path} taken from the batch's {batch_path} (the CPU copy of {describe(tensor)})")
                return to_cpu(candidate).to(tensor.dtype)
        if tensor.is_floating_point() or tensor.is_complex():
            notes.append(f"{path} ({describe(tensor)}) unreadable on the device; zeros used")
            return torch.zeros(tensor.shape, dtype=tensor.dtype)
        missing.append(f"{path} ({describe(tensor)})")
        return torch.zeros(tensor.shape, dtype=tensor.dtype)

    new_args = tuple(map_structure(a, leaf, f"arg{i}") for i, a in enumerate(args))
    new_kwargs = {k: map_structure(v, leaf, k) for k, v in (kwargs or {}).items()}
    return Inputs(new_args, new_kwargs, notes, missing)


# ---------------------------------------------------------------------------- modules


def module_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters and buffers (metadata only)."""
    total = 0
    for tensor in list(module.parameters()) + list(module.buffers()):
        total += tensor.numel() * tensor.element_size()
    return total


@dataclass
class ModuleCopy:
    """A CPU copy of a user module, and whether its weights are the real ones."""

    module: nn.Module
    real_weights: bool
    note: str


def cpu_copy(module: nn.Module, poisoned: bool, max_bytes: int | None = None, device: str = "cpu",
             memo: dict[int, Any] | None = None) -> ModuleCopy:
    """`module` with every parameter, buffer and tensor attribute on the CPU (or on `meta`, for shapes only).

    In an experiment's child a CPU module is used as it is: fork made it the child's own. Otherwise it is
    deep-copied with its tensors mapped through deepcopy's memo: to their host copies (see host_copies), to
    zeros of the same shapes where the device cannot be read (after a CUDA error; enough to replay index and
    shape errors), to private copies where they sit in shared memory. Copies made with one `memo` share what
    their originals share.
    """
    tensors = _module_tensors(module)
    if device == "cpu" and all(t.device.type == "cpu" and not t.is_shared() for t in tensors):
        return ModuleCopy(module, True, "the model itself, in the experiment's own process")
    max_bytes = MAX_COPY_BYTES if max_bytes is None else max_bytes
    size = sum(t.numel() * t.element_size() for t in tensors if t.device.type != "cpu" or t.is_shared())
    if device != "meta" and size > max_bytes:
        raise Unavailable(f"the model has {size / 1024**3:.1f} GB of parameters and buffers off the CPU, over the "
                          f"{max_bytes / 1024**3:.0f} GB a probe copies")
    memo = {} if memo is None else memo
    zeros = False

    def clone(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal zeros
        if device == "meta":
            return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
        if tensor.device.type == "cpu":
            return tensor.detach().clone() if tensor.is_shared() else tensor.detach()
        if readable(tensor, poisoned):
            return to_cpu(tensor)
        zeros = True
        return torch.zeros(tensor.shape, dtype=tensor.dtype)

    for sub in module.modules():
        for param in sub._parameters.values():
            if param is not None and id(param) not in memo:
                memo[id(param)] = nn.Parameter(clone(param), requires_grad=param.requires_grad)
        for value in [*sub._buffers.values(), *vars(sub).values()]:
            if isinstance(value, torch.Tensor) and id(value) not in memo:
                memo[id(value)] = clone(value)
    with torch.no_grad():
        copied = copy.deepcopy(module, memo)
    if device == "meta":
        note = "shapes only (meta tensors)"
    elif zeros:
        note = "weights unreadable (after a CUDA error, or on the meta device): zeros of the same shapes used"
    else:
        note = "weights copied to the CPU"
    return ModuleCopy(copied, not zeros and device != "meta", note)


def _module_tensors(module: nn.Module) -> list[torch.Tensor]:
    found: dict[int, torch.Tensor] = {}
    for sub in module.modules():
        for value in [*sub._parameters.values(), *sub._buffers.values(), *vars(sub).values()]:
            if isinstance(value, torch.Tensor):
                found[id(value)] = value
    return list(found.values())


def module_names(root: nn.Module | None) -> dict[int, str]:
    """id(submodule) -> dotted path inside root ('' for root itself)."""
    if root is None:
        return {}
    try:
        return {id(m): name for name, m in root.named_modules(remove_duplicate=False)}
    except Exception:
        return {}


def display_name(path: str, module: nn.Module) -> str:
    """`encoder.embed (Embedding)`; the class alone for the root."""
    return f"{path} ({type(module).__name__})" if path else type(module).__name__


def result(name: str, status: str, detail: str, **facts: Any) -> ProbeResult:
    artifacts = facts.pop("artifacts", [])
    return ProbeResult(name=name, status=status, detail=detail, facts=facts, artifacts=artifacts)


def exception_line(exc: BaseException) -> str:
    """`IndexError: index out of range in self` (first line of the message)."""
    message = str(exc).strip().split("\n", 1)[0]
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def no_batch_hint() -> str:
    """Why no batch is known, for a skipped probe: under the runner every DataLoader is followed, so the script
    used none; in a script of one's own, the wrapper has to be told."""
    if tracking.capture_owner == "runner":
        return "no DataLoader yielded a batch in this run"
    return "use `triage.track(loader)` or run under `python -m triage`"


def loader_from_traceback(exception: BaseException | None) -> Any:
    """The live DataLoader iterator on the traceback (it knows the dataset, sampler and collate_fn): the innermost
    one, when several loaders were being iterated."""
    tb = exception.__traceback__ if exception is not None else None
    found = None
    while tb is not None:
        candidate = tb.tb_frame.f_locals.get("self")
        if type(candidate).__name__.endswith("DataLoaderIter") and hasattr(candidate, "_dataset"):
            found = candidate
        tb = tb.tb_next
    return found
