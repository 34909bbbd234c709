"""Bounded, safe, one-line-plus-facts summaries of live values: tensors, modules, optimizers, loaders, arrays.

Every summary is a small JSON-safe dict with a `type` and a one-line `text`,
plus the facts rules and probes use (shape, dtype, device, devices of a
model's parameters, a loader's configuration). Nothing here copies a large
tensor, touches a CUDA tensor's data, or lets a user object's `__repr__`
raise or hang through: statistics are computed only for small CPU tensors,
and a repr runs under a time limit (main thread) or not at all (other threads).
"""

from __future__ import annotations

import math
import signal
import sys
import threading
from collections import Counter
from contextlib import contextmanager
from itertools import islice
from typing import Any

from .secrets import SCRUBBED, is_secret_name, scrub_strings, scrub_text

MAX_STRING = 120
MAX_ITEMS = 8
MAX_DEPTH = 2
MAX_SCRUBBED_STRING = 4096  # of a string local, this much is scrubbed; far more than a summary shows
MAX_STATS_ELEMENTS = 65_536
MAX_OUTLIERS = 8
MAX_MODULE_ENTRIES = 20_000  # parameters and buffers walked per model
REPR_SECONDS = 0.25


def summarize(value: Any, *, depth: int = 0, cuda_usable: bool = True) -> dict[str, Any]:
    """A bounded summary of any value; never raises."""
    try:
        return _summarize(value, depth, cuda_usable)
    except Exception as exc:  # a property that raises, a half-built object
        return {"type": _type_name(value), "text": f"<summary failed: {type(exc).__name__}>"}


def _summarize(value: Any, depth: int, cuda_usable: bool) -> dict[str, Any]:
    if value is None or isinstance(value, (bool, int, float, complex)):
        return {"type": type(value).__name__, "text": _clip(repr(value))}
    if isinstance(value, str):
        # Scrubbed before clipping: a token cut in half no longer looks like one.
        return {"type": "str", "text": _clip(repr(scrub_text(value[:MAX_SCRUBBED_STRING])[: MAX_STRING + 1])), "len": len(value)}
    if isinstance(value, (bytes, bytearray)):
        return {"type": type(value).__name__, "text": f"<{len(value)} bytes>", "len": len(value)}
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(value, torch.Tensor):
            return summarize_tensor(value, cuda_usable=cuda_usable)
        if isinstance(value, torch.nn.Module):
            return summarize_module(value)
        if isinstance(value, torch.optim.Optimizer):
            return summarize_optimizer(value)
        data = sys.modules.get("torch.utils.data")
        if data is not None and isinstance(value, data.DataLoader):
            return summarize_loader(value)
        if isinstance(value, (torch.device, torch.dtype, torch.Size)):
            return {"type": type(value).__name__, "text": str(value)}
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        return summarize_array(value)
    if isinstance(value, dict):
        return _summarize_mapping(value, depth, cuda_usable)
    if isinstance(value, (list, tuple, set, frozenset)):
        return _summarize_sequence(value, depth, cuda_usable)
    return {"type": _type_name(value), "text": safe_repr(value)}


def _summarize_mapping(value: dict, depth: int, cuda_usable: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"type": _type_name(value), "len": len(value)}
    if depth >= MAX_DEPTH:
        out["text"] = f"{_type_name(value)} with {len(value)} keys"
        return out
    items: dict[str, Any] = {}
    for index, (key, item) in enumerate(islice(value.items(), MAX_ITEMS)):
        if isinstance(key, str):
            name = key
        elif isinstance(key, (int, float, bool)) or key is None:
            name = _clip(repr(key), 40)
        else:
            name = f"<{_type_name(key)} key {index}>"
        items[name] = {"type": "secret", "text": SCRUBBED} if is_secret_name(name) else summarize(item, depth=depth + 1, cuda_usable=cuda_usable)
    out["items"] = items
    more = f", … {len(value) - MAX_ITEMS} more" if len(value) > MAX_ITEMS else ""
    out["text"] = _clip("{" + ", ".join(f"{k}: {v['text']}" for k, v in items.items()) + more + "}")
    return out


def _summarize_sequence(value, depth: int, cuda_usable: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"type": _type_name(value), "len": len(value)}
    if depth >= MAX_DEPTH:
        out["text"] = f"{_type_name(value)} of {len(value)} items"
        return out
    head = list(islice(value, MAX_ITEMS))
    if head and all(isinstance(item, str) for item in head):
        head = scrub_strings(head)  # a copied argv, ("api_key", "...") pairs: a value follows its name
    items = [summarize(item, depth=depth + 1, cuda_usable=cuda_usable) for item in head]
    out["items"] = items
    more = f", … {len(value) - MAX_ITEMS} more" if len(value) > MAX_ITEMS else ""
    brackets = {"list": "[]", "tuple": "()"}.get(type(value).__name__, "{}")
    out["text"] = _clip(brackets[0] + ", ".join(item["text"] for item in items) + more + brackets[1])
    return out


def summarize_tensor(tensor, *, cuda_usable: bool = True) -> dict[str, Any]:
    """Metadata of any tensor; statistics only for small strided CPU tensors (never touches device memory)."""
    import torch

    out: dict[str, Any] = {"type": "Parameter" if isinstance(tensor, torch.nn.Parameter) else "Tensor"}
    shape = _attempt(lambda: list(tensor.shape))
    device = _attempt(lambda: str(tensor.device))
    dtype = _attempt(lambda: str(tensor.dtype).replace("torch.", ""))
    out.update(shape=shape, dtype=dtype, device=device)
    out["requires_grad"] = _attempt(lambda: bool(tensor.requires_grad))
    grad_fn = _attempt(lambda: tensor.grad_fn)
    out["grad_fn"] = type(grad_fn).__name__ if grad_fn is not None else None
    out["is_leaf"] = _attempt(lambda: bool(tensor.is_leaf))
    out["version"] = _attempt(lambda: int(tensor._version))
    layout = _attempt(lambda: tensor.layout)
    strided = layout is torch.strided
    out["contiguous"] = _attempt(lambda: bool(tensor.is_contiguous())) if strided else None
    if not strided and layout is not None:
        out["layout"] = str(layout).replace("torch.", "")
    numel = _attempt(lambda: int(tensor.numel()))
    out["numel"] = numel
    if (
        strided and device == "cpu" and isinstance(numel, int) and 0 < numel <= MAX_STATS_ELEMENTS
        and not _attempt(lambda: tensor.is_quantized, True)
    ):  # fmt: skip
        stats = _tensor_stats(tensor)
        if stats:
            out["stats"] = stats
    out["text"] = _tensor_line(out)
    return out


def _tensor_stats(tensor) -> dict[str, Any] | None:
    import torch

    try:
        with torch.no_grad():
            data = tensor.detach()
            if data.is_complex():
                data = data.abs()
            if data.dtype == torch.bool:
                return {"true": int(data.sum().item())}
            if data.is_floating_point():
                nan = int(torch.isnan(data).sum().item())
                inf = int(torch.isinf(data).sum().item())
                finite = data[torch.isfinite(data)].double()
                stats: dict[str, Any] = {"nan": nan, "inf": inf}
                if finite.numel():
                    stats.update(min=_num(finite.min().item()), max=_num(finite.max().item()), mean=_num(finite.mean().item()))
                return stats
            return {"min": int(data.min().item()), "max": int(data.max().item())}
    except Exception:
        return None


def _tensor_line(info: dict[str, Any]) -> str:
    shape = info.get("shape")
    parts = [f"tensor[{', '.join(str(d) for d in shape)}]" if isinstance(shape, list) else "tensor[?]"]
    parts.append(str(info.get("dtype")))
    parts.append(str(info.get("device")))
    if info.get("grad_fn"):
        parts.append(f"grad_fn={info['grad_fn']}")
    elif info.get("requires_grad"):
        parts.append("requires_grad")
    if info.get("version"):
        parts.append(f"v{info['version']}")
    if info.get("contiguous") is False:
        parts.append("non-contiguous")
    stats = info.get("stats") or {}
    if "min" in stats:
        parts.append(f"x∈[{_fmt(stats['min'])}, {_fmt(stats['max'])}]")
    if "mean" in stats:
        parts.append(f"μ={_fmt(stats['mean'])}")
    if stats.get("nan"):
        parts.append(f"NaN×{stats['nan']}")
    if stats.get("inf"):
        parts.append(f"Inf×{stats['inf']}")
    if "true" in stats:
        parts.append(f"true×{stats['true']}")
    return " ".join(parts)


def summarize_module(module) -> dict[str, Any]:
    """Class, parameter count, where parameters and buffers live, and which disagree with the rest."""
    entries: list[tuple[str, str, str, str, str]] = []  # (kind, qualified name, owner class, device, dtype)
    owners = {}
    for prefix, sub in _attempt(lambda: list(module.named_modules()), []) or []:
        owners[prefix] = type(sub).__name__
        for kind, named in (("parameter", sub._parameters), ("buffer", sub._buffers)):
            for name, tensor in list(named.items()):
                if tensor is None:
                    continue
                qualified = f"{prefix}.{name}" if prefix else name
                entries.append((kind, qualified, type(sub).__name__, str(tensor.device), str(tensor.dtype).replace("torch.", "")))
                if len(entries) >= MAX_MODULE_ENTRIES:
                    break
    params = 0
    trainable = 0
    for parameter in _attempt(lambda: list(module.parameters()), []) or []:
        count = parameter.numel()
        params += count
        trainable += count if parameter.requires_grad else 0
    devices = Counter(entry[3] for entry in entries)
    dtypes = Counter(entry[4] for entry in entries)
    out: dict[str, Any] = {
        "type": type(module).__name__,
        "kind": "module",
        "params": params,
        "trainable": trainable,
        "submodules": max(0, len(owners) - 1),
        "training": bool(getattr(module, "training", False)),
        "devices": dict(devices),
        "dtypes": dict(dtypes),
    }
    outliers = _outliers(entries, devices, 3, "on") + _outliers(entries, dtypes, 4, "of dtype")
    if outliers:
        out["outliers"] = outliers[:MAX_OUTLIERS]
    if entries:
        inside = f"{_count(params)} params, {'/'.join(devices)}, {'/'.join(dtypes)}"
    else:
        inside = "no parameters"
    out["text"] = _clip(f"{type(module).__name__} ({inside})" + (f"; {outliers[0]}" if outliers else ""), 300)
    return out


def _outliers(entries, counts: Counter, field: int, preposition: str) -> list[str]:
    """'buffer pe of PositionalEncoding (encoder.pos) is on cpu; the other 12 ... are on cuda:0'."""
    if len(counts) < 2:
        return []
    majority, majority_count = counts.most_common(1)[0]
    lines = []
    for entry in entries:
        if entry[field] == majority:
            continue
        kind, qualified, owner, *_ = entry
        name = qualified.rsplit(".", 1)[-1]
        path = qualified.rsplit(".", 1)[0] if "." in qualified else ""
        lines.append(
            f"{kind} {name} of {owner}{f' ({path})' if path else ''} is {preposition} {entry[field]}; "
            f"the other {majority_count} parameters and buffers are {preposition} {majority}"
        )
    return lines


def summarize_optimizer(optimizer) -> dict[str, Any]:
    groups = []
    for group in list(getattr(optimizer, "param_groups", []))[:MAX_ITEMS]:
        info: dict[str, Any] = {"params": len(group.get("params", []))}
        for key in ("lr", "momentum", "weight_decay", "betas", "eps", "nesterov", "amsgrad", "foreach", "fused"):
            if key in group:
                value = group[key]
                info[key] = _plain(value)
        groups.append(info)
    state = _attempt(lambda: len(optimizer.state), None)
    lrs = ", ".join(str(g.get("lr")) for g in groups)
    return {
        "type": type(optimizer).__name__,
        "kind": "optimizer",
        "param_groups": groups,
        "state_entries": state,
        "text": _clip(f"{type(optimizer).__name__} ({len(groups)} param group{'s' if len(groups) != 1 else ''}, lr={lrs})"),
    }


def summarize_loader(loader) -> dict[str, Any]:
    dataset = getattr(loader, "dataset", None)
    context = getattr(loader, "multiprocessing_context", None)
    if context is None and getattr(loader, "num_workers", 0):
        import multiprocessing

        # get_context().get_start_method() would fix the start method for the user's process; this does not.
        context = multiprocessing.get_start_method(allow_none=True) or f"{multiprocessing.get_all_start_methods()[0]} (default)"
    elif context is not None and not isinstance(context, str):
        context = _attempt(lambda: context.get_start_method(), type(context).__name__)
    out: dict[str, Any] = {
        "type": type(loader).__name__,
        "kind": "dataloader",
        "batch_size": getattr(loader, "batch_size", None),
        "num_workers": getattr(loader, "num_workers", None),
        "pin_memory": getattr(loader, "pin_memory", None),
        "timeout": getattr(loader, "timeout", None),
        "multiprocessing_context": context,
        "persistent_workers": getattr(loader, "persistent_workers", None),
        "drop_last": getattr(loader, "drop_last", None),
        "prefetch_factor": getattr(loader, "prefetch_factor", None),
        "dataset": type(dataset).__name__ if dataset is not None else None,
        "dataset_len": _dataset_len(dataset),
        "sampler": type(getattr(loader, "sampler", None)).__name__,
        "collate_fn": getattr(getattr(loader, "collate_fn", None), "__name__", None)
        or type(getattr(loader, "collate_fn", None)).__name__,
    }
    workers = out["num_workers"]
    out["text"] = _clip(
        f"DataLoader({out['dataset']} of {out['dataset_len'] if out['dataset_len'] is not None else '?'}, "
        f"batch_size={out['batch_size']}, num_workers={workers}"
        + (f", {context}" if workers else "")
        + (", pin_memory" if out["pin_memory"] else "")
        + (f", timeout={out['timeout']}" if out["timeout"] else "")
        + ")",
        200,
    )
    return out


def _dataset_len(dataset) -> int | None:
    if dataset is None:
        return None
    length = getattr(type(dataset), "__len__", None)
    if length is None:
        return None
    if type(dataset).__module__.startswith("torch."):
        result = _attempt(lambda: len(dataset))
    else:  # a user __len__ may be slow or raise: it runs under the same guard as a repr
        result = _guarded(lambda: len(dataset))
    return result if isinstance(result, int) else None


def summarize_array(array) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "ndarray", "shape": list(array.shape), "dtype": str(array.dtype)}
    if 0 < array.size <= MAX_STATS_ELEMENTS and array.dtype.kind in "biuf":
        try:
            import numpy

            if array.dtype.kind == "f":
                finite = array[numpy.isfinite(array)]
                out["stats"] = {"nan": int(numpy.isnan(array).sum()), "inf": int(numpy.isinf(array).sum())}
                if finite.size:
                    out["stats"].update(min=_num(finite.min()), max=_num(finite.max()), mean=_num(finite.mean()))
            elif array.dtype.kind != "b":
                out["stats"] = {"min": int(array.min()), "max": int(array.max())}
        except Exception:
            pass
    stats = out.get("stats") or {}
    text = f"ndarray[{', '.join(str(d) for d in array.shape)}] {array.dtype}"
    if "min" in stats:
        text += f" x∈[{_fmt(stats['min'])}, {_fmt(stats['max'])}]"
    if stats.get("nan"):
        text += f" NaN×{stats['nan']}"
    out["text"] = text
    return out


def safe_repr(value: Any, limit: int = MAX_STRING) -> str:
    """repr() that cannot raise, cannot hang the main thread for long, and is clipped and scrubbed."""
    text = _guarded(lambda: repr(value))
    if not isinstance(text, str):
        text = f"<{_type_name(value)} object>" if text is _TIMED_OUT else f"<{_type_name(value)}: repr() failed>"
    return _clip(scrub_text(text[:MAX_SCRUBBED_STRING]), limit)


_TIMED_OUT = object()
_FAILED = object()


class _ReprTimeout(BaseException):
    """Raised inside a user repr that ran past REPR_SECONDS."""


def _guarded(call):
    """Run user code with exceptions contained and, where possible, a time limit.

    A SIGALRM timer can interrupt Python code only in the main thread, and only
    when nobody else is using the timer; elsewhere user code is not called.
    """
    if not _can_time_limit():
        return _TIMED_OUT
    try:
        with _alarm(REPR_SECONDS):
            return call()
    except _ReprTimeout:
        return _TIMED_OUT
    except Exception:
        return _FAILED


def _can_time_limit() -> bool:
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        return False
    if signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        return False
    return signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN, None)


@contextmanager
def _alarm(seconds: float):
    def expire(signum, frame):
        raise _ReprTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _attempt(call, default=None):
    try:
        return call()
    except Exception:
        return default


def _type_name(value: Any) -> str:
    try:
        return type(value).__name__
    except Exception:
        return "object"


def _plain(value: Any) -> Any:
    if isinstance(value, (int, float, bool, str)) or value is None:
        return value
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value][:MAX_ITEMS]
    item = getattr(value, "item", None)  # a 0-d tensor lr
    if callable(item):
        try:
            return item()
        except Exception:
            pass
    return _clip(repr(value), 40)


def _num(value: float) -> float | None:
    value = float(value)
    return round(value, 6) if math.isfinite(value) else None


def _fmt(value) -> str:
    if value is None:
        return "?"
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}"


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def _clip(text: str, limit: int = MAX_STRING) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
