"""worker_pickle: pickle each part a spawned DataLoader worker receives, and name the one (and its member) that fails.

With the spawn or forkserver start method, DataLoader workers are sent the Dataset, the collate_fn and the
worker_init_fn by pickle. "Can't pickle local object '<lambda>'" or "cannot pickle '_io.TextIOWrapper'" names
a type, not its owner: a lambda may be the collate_fn or a transform the Dataset holds. This experiment takes the
loader whose workers failed to start, pickles each part on its own and, for a part that fails, its members in turn,
down to the one that pickle refuses. It confirms when a part fails (naming it) and refutes when every part pickles
(the failure then came from elsewhere). Pickling runs the user's __reduce__/__getstate__, so it runs in an
experiment's child; tensors and arrays are stood in for, never serialised (they always pickle, and can be large).
"""

from __future__ import annotations

import copyreg
import functools
import pickle
from typing import Any, Iterator

import torch

from ..diagnosis import ProbeResult
from ._support import loader_from_traceback, result
from .context import ProbeContext

NAME = "worker_pickle"
# What a worker process is sent, as (part, the iterator's attribute, the DataLoader's attribute).
_PARTS = (("dataset", "_dataset", "dataset"), ("collate_fn", "_collate_fn", "collate_fn"),
          ("worker_init_fn", "_worker_init_fn", "worker_init_fn"))
_MAX_DEPTH = 4
_MAX_MEMBERS = 200


def worker_pickle(ctx: ProbeContext) -> ProbeResult:
    # the DataLoader iterator that was starting its workers (on the traceback), else the loader the run used
    loader = loader_from_traceback(ctx.exception)
    loader = ctx.loader if loader is None else loader
    if loader is None:
        return result(NAME, "skipped", "no DataLoader on the traceback or recorded in this run")
    parts: dict[str, str] = {}
    failed: list[tuple[str, Any, str]] = []
    for part, iter_attr, loader_attr in _PARTS:
        value = getattr(loader, iter_attr, getattr(loader, loader_attr, None))
        if value is None:
            continue
        error = _pickle_error(value)
        parts[part] = f"pickles ({_kind(value)})" if error is None else error
        if error is not None:
            failed.append((part, value, error))
    facts: dict[str, Any] = {"parts": parts, "start_method": _start_method(ctx, loader)}
    if not failed:
        shown = ", ".join(f"{part} ({_kind(getattr(loader, a, getattr(loader, b, None)))})"
                          for part, a, b in _PARTS if part in parts)
        return result(NAME, "refuted", f"every part a spawned worker receives pickles: {shown}", **facts)
    part, value, error = failed[0]
    path, culprit = _culprit(value, part)
    facts.update(part=part, member=path, member_type=_kind(culprit), error=error,
                 failed=[name for name, _, _ in failed])
    inside = f": its member `{path}` ({_kind(culprit)}) is what fails" if path != part else ""
    others = f"; {', '.join(name for name, _, _ in failed[1:])} fails too" if len(failed) > 1 else ""
    fine = [name for name in parts if name not in facts["failed"]]
    ok = f" ({', '.join(fine)} pickle{'s' if len(fine) == 1 else ''})" if fine else ""
    return result(NAME, "confirmed", f"the {part} ({_kind(value)}) cannot be pickled for a spawned worker{inside}: "
                  f"{error}{others}{ok}", **facts)


def _start_method(ctx: ProbeContext, loader: Any) -> str | None:
    """The workers' start method: the DataLoader's multiprocessing_context, as the starting iterator read it."""
    context = getattr(loader, "multiprocessing_context", None)
    tb = ctx.exception.__traceback__ if ctx.exception is not None else None
    while context is None and tb is not None:
        context = tb.tb_frame.f_locals.get("multiprocessing_context")
        tb = tb.tb_next
    if context is None:
        return None
    method = getattr(context, "get_start_method", None)
    return method() if callable(method) else str(context)


class _Sink:
    """A file that keeps nothing: pickling into it costs no memory for what is written."""

    def write(self, data: bytes) -> int:
        return len(data)


def _stand_in() -> None:
    return None


class _Pickler(pickle.Pickler):
    """pickle as the worker's start does (multiprocessing's reducers included), with tensors, storages and arrays
    stood in for: they always pickle, and serialising them would copy their data."""

    def __init__(self) -> None:
        super().__init__(_Sink(), protocol=pickle.HIGHEST_PROTOCOL)
        from multiprocessing.reduction import ForkingPickler

        extra = {kind: reduce for kind, reduce in getattr(ForkingPickler, "_extra_reducers", {}).items()
                 if not getattr(kind, "__module__", "").startswith("torch")}
        self.dispatch_table = {**copyreg.dispatch_table, **extra}

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)) or _is_array(obj):
            return _stand_in, ()
        return NotImplemented


def _is_array(obj: Any) -> bool:
    kind = type(obj)
    return kind.__module__ == "numpy" and kind.__name__ in ("ndarray", "memmap")


def _pickle_error(value: Any) -> str | None:
    """None when `value` pickles; else the error, as `TypeError: cannot pickle '_io.TextIOWrapper' object`."""
    try:
        _Pickler().dump(value)
    except RecursionError:
        return "RecursionError: too deeply nested to pickle"
    except Exception as exc:
        message = str(exc).strip().split("\n", 1)[0]
        return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return None


def _members(value: Any) -> Iterator[tuple[str, Any]]:
    """A value's parts that pickle would reach: attributes, items, a partial's function and arguments."""
    if isinstance(value, functools.partial):
        yield ".func", value.func
        yield from ((f".args[{i}]", a) for i, a in enumerate(value.args))
        yield from ((f".keywords[{k!r}]", v) for k, v in value.keywords.items())
    elif isinstance(value, dict):
        yield from ((f"[{k!r}]", v) for k, v in list(value.items())[:_MAX_MEMBERS])
    elif isinstance(value, (list, tuple, set, frozenset)):
        yield from ((f"[{i}]", v) for i, v in enumerate(list(value)[:_MAX_MEMBERS]))
    elif not hasattr(value, "__code__"):  # a function fails by its name, not by what it holds
        state = getattr(value, "__dict__", None)
        if isinstance(state, dict):
            yield from ((f".{k}", v) for k, v in list(state.items())[:_MAX_MEMBERS])


def _culprit(value: Any, path: str, depth: int = 0) -> tuple[str, Any]:
    """The innermost member of `value` that fails to pickle on its own (`value` itself when none of its members
    does: a lambda, an open file)."""
    if depth >= _MAX_DEPTH:
        return path, value
    for suffix, member in _members(value):
        if _pickle_error(member) is not None:
            return _culprit(member, path + suffix, depth + 1)
    return path, value


def _kind(value: Any) -> str:
    """`TextDataset`, `function main.<locals>.<lambda>`, `_io.TextIOWrapper`."""
    if callable(value) and hasattr(value, "__qualname__") and hasattr(value, "__code__"):
        return f"function {value.__qualname__}"
    kind = type(value)
    module = kind.__module__
    return kind.__qualname__ if module in ("builtins", "__main__") else f"{module}.{kind.__qualname__}"
