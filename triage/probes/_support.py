"""What every probe needs: CPU copies that leave the user's objects alone, RNG guards, time limits.

The rule every helper here keeps: a probe works on copies, on the CPU, and puts
back any global state it touched (RNG, grad mode). After an asynchronous CUDA
error every CUDA call raises, so CUDA tensors are read only when the incident's
text says the CUDA context is still usable; their shape and dtype (host-side
metadata) are always safe.
"""

from __future__ import annotations

import contextlib
import copy
import random
import re
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import nn

from .. import tracking
from ..diagnosis import ProbeResult
from ..incident import is_user_path
from .context import ProbeContext

# Largest model (parameters and buffers) a probe copies to the CPU.
MAX_COPY_BYTES = 2 * 1024**3

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


@contextlib.contextmanager
def preserved_state() -> Iterator[None]:
    """Put back Python, NumPy and torch (CPU) RNG states and grad mode, whatever happens inside."""
    python_state = random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    torch_state = torch.get_rng_state()
    grad_enabled = torch.is_grad_enabled()
    anomaly = torch.is_anomaly_enabled()
    try:
        yield
    finally:
        random.setstate(python_state)
        if numpy_state is not None:
            numpy.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        torch.set_grad_enabled(grad_enabled)
        torch.set_anomaly_enabled(anomaly)


@contextlib.contextmanager
def tracker_paused() -> Iterator[None]:
    """Keep probe work (DataLoader iteration, forward passes) out of the live Tracker's counters."""
    from ..tracking import TRACKER

    TRACKER.suspended += 1
    try:
        yield
    finally:
        TRACKER.suspended -= 1


# ---------------------------------------------------------------------------- time limits


class ProbeTimeout(BaseException):
    """Raised inside a probe running on the main thread when its time limit is up.

    A BaseException, so that a probe's `except Exception` around the user's code
    cannot take the time limit for a finding.
    """


@dataclass
class Outcome:
    """What a call under a time limit did: its value, or its exception, or that it ran out of time."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    seconds: float = 0.0
    stack: list[traceback.FrameSummary] | None = None  # where a timed-out call was


def call_with_time_limit(fn: Callable[[], Any], seconds: float, preempt: bool = True) -> Outcome:
    """Run fn() for at most `seconds`.

    On the main thread (with `preempt`), SIGALRM raises ProbeTimeout inside fn, so
    nothing keeps running afterwards; the user's own alarm is put back. Elsewhere fn
    runs on a daemon thread that is abandoned when late (it works on copies only).
    """
    import signal

    start = time.monotonic()
    seconds = max(float(seconds), 0.001)
    main = threading.current_thread() is threading.main_thread()
    if preempt and main and hasattr(signal, "setitimer"):
        return _call_with_alarm(fn, seconds, start)
    return _call_on_thread(fn, seconds, start)


def _call_with_alarm(fn: Callable[[], Any], seconds: float, start: float) -> Outcome:
    import signal

    def on_alarm(signum, frame):
        raise ProbeTimeout(f"time limit of {seconds:g} s reached")

    previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    previous_timer = signal.setitimer(signal.ITIMER_REAL, seconds)
    outcome = Outcome()
    try:
        outcome.value = fn()
    except ProbeTimeout as exc:
        outcome.timed_out = True
        outcome.stack = traceback.extract_tb(exc.__traceback__)
    except BaseException as exc:  # noqa: BLE001 - a probe's failure is a result, not a crash
        if isinstance(exc, KeyboardInterrupt):
            raise
        outcome.error = exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        elapsed = time.monotonic() - start
        if previous_timer[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, max(previous_timer[0] - elapsed, 0.001), previous_timer[1])
    outcome.seconds = time.monotonic() - start
    return outcome


def _call_on_thread(fn: Callable[[], Any], seconds: float, start: float) -> Outcome:
    outcome = Outcome()

    def target() -> None:
        try:
            outcome.value = fn()
        except BaseException as exc:  # noqa: BLE001
            outcome.error = exc

    worker = threading.Thread(target=target, name="triage-probe", daemon=True)
    worker.start()
    worker.join(seconds)
    outcome.seconds = time.monotonic() - start
    if worker.is_alive():
        outcome.timed_out = True
        frame = sys._current_frames().get(worker.ident)
        outcome.stack = traceback.extract_stack(frame) if frame is not None else None
        outcome.value, outcome.error = None, None
    return outcome


def innermost_user_frame(stack: list[traceback.FrameSummary] | None) -> traceback.FrameSummary | None:
    """The innermost frame of `stack` in the user's code (not torch, not the stdlib, not triage)."""
    for frame in reversed(stack or []):
        if is_user_path(frame.filename) and "/triage/" not in frame.filename.replace("\\", "/"):
            return frame
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
    """Whether a tensor's values can be read without a CUDA call that would raise."""
    if tensor.device.type == "meta":
        return False
    return tensor.device.type == "cpu" or not poisoned


def to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """A detached CPU copy that shares nothing with the original."""
    out = tensor.detach()
    return out.clone() if out.device.type == "cpu" else out.to("cpu")


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
    """CPU copies of a call's arguments.

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
                return candidate.detach().to(tensor.dtype, copy=True)
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


def _triage_hook(hook: Any) -> bool:
    return bool(getattr(hook, "_triage_hook", False))


@dataclass
class ModuleCopy:
    """A CPU copy of a user module, and whether its weights are the real ones."""

    module: nn.Module
    real_weights: bool
    note: str


def cpu_copy(module: nn.Module, poisoned: bool, max_bytes: int | None = None, device: str = "cpu",
             memo: dict[int, Any] | None = None) -> ModuleCopy:
    """A deep copy of `module` with every parameter, buffer and tensor attribute on `device`.

    Tensors are mapped straight to the target device through deepcopy's memo, so a
    CUDA model is never duplicated on the GPU. On a poisoned device (or on `meta`)
    the weights cannot be read: the copy gets zeros of the same shapes, which is
    enough to replay index and shape errors. triage's own hooks are dropped from
    the copy so that probe runs never feed the live Tracker. Copies made with one
    `memo` share what their originals share.
    """
    max_bytes = MAX_COPY_BYTES if max_bytes is None else max_bytes
    size = module_bytes(module)
    if device != "meta" and size > max_bytes:
        raise Unavailable(f"the model has {size / 1024**3:.1f} GB of parameters and buffers, over the "
                          f"{max_bytes / 1024**3:.0f} GB a probe copies")
    memo = {} if memo is None else memo
    zeros = False

    def clone(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal zeros
        if device == "meta":
            return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
        if readable(tensor, poisoned):
            return tensor.detach().to(device, copy=True)
        zeros = True
        return torch.zeros(tensor.shape, dtype=tensor.dtype, device=device)

    for sub in module.modules():
        for name, param in sub._parameters.items():
            if param is not None and id(param) not in memo:
                memo[id(param)] = nn.Parameter(clone(param), requires_grad=param.requires_grad)
        for name, buf in sub._buffers.items():
            if buf is not None and id(buf) not in memo:
                memo[id(buf)] = clone(buf)
        for name, value in vars(sub).items():
            if isinstance(value, torch.Tensor) and id(value) not in memo:
                memo[id(value)] = clone(value)
    with torch.no_grad():
        copied = copy.deepcopy(module, memo)
    for sub in copied.modules():
        for hooks in (sub._forward_pre_hooks, sub._forward_hooks):
            for key in [k for k, h in hooks.items() if _triage_hook(h)]:
                del hooks[key]
    if device == "meta":
        note = "shapes only (meta tensors)"
    elif zeros:
        note = "weights unreadable (after a CUDA error, or on the meta device): zeros of the same shapes used"
    else:
        note = "weights copied"
    return ModuleCopy(copied, not zeros and device != "meta", note)


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
