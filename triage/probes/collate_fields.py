"""collate_fields: the lengths of each field of the samples a collate_fn was given, and which field is ragged.

"expected sequence of length 12 at dim 1 (got 13)" and "stack expects each tensor to be equal size" say two
samples differ in size, not which field or by how much. The DataLoader's fetcher holds the samples it passed to
the collate_fn (`data` in torch's fetch frame); this experiment reads each field's size in every sample (a
tensor's or array's shape, a list's length, nested lists' lengths) and confirms when a field's sizes differ,
naming it with its lengths; it refutes when every field has one size in the whole batch (the collate failed for
another reason). It reads sizes only, never copies a value.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..diagnosis import ProbeResult
from ._support import result, torch_frame_locals
from .context import ProbeContext

NAME = "collate_fields"
_MAX_FIELDS = 50


def collate_fields(ctx: ProbeContext) -> ProbeResult:
    samples = _samples(ctx)
    if samples is None:
        return result(NAME, "skipped", "the samples given to the collate_fn are not on the traceback (no DataLoader "
                      "fetch frame)")
    if not samples:
        return result(NAME, "skipped", "the DataLoader gave the collate_fn an empty batch")
    fields = _fields(samples[0])
    sizes: dict[str, Counter] = {}
    for name, pick in fields[:_MAX_FIELDS]:
        counted: Counter = Counter()
        for sample in samples:
            try:
                counted[_size(pick(sample))] += 1
            except Exception:
                counted["missing"] += 1
        sizes[name] = counted
    ragged = {name: counted for name, counted in sizes.items() if len(counted) > 1}
    facts: dict[str, Any] = {"samples": len(samples), "fields": {n: _shown(c) for n, c in sizes.items()},
                             "ragged": [{"field": n, "sizes": _shown(c), **_span(c)} for n, c in ragged.items()]}
    if not ragged:
        uniform = "; ".join(f"{name}: {_shown(counted)}" for name, counted in list(sizes.items())[:6])
        return result(NAME, "refuted", f"every field has one size in all {len(samples)} samples ({uniform})",
                      **facts)
    parts = [f"`{name}` has sizes {_shown(counted)}{_range(counted)}" for name, counted in list(ragged.items())[:4]]
    same = [name for name in sizes if name not in ragged]
    tail = f"; {', '.join(f'`{n}`' for n in same[:4])} {'is' if len(same) == 1 else 'are'} uniform" if same else ""
    return result(NAME, "confirmed", f"of the {len(samples)} samples given to the collate_fn, " + "; ".join(parts)
                  + tail, **facts)


def _samples(ctx: ProbeContext) -> list | None:
    """The list of samples torch's fetcher passed to the collate_fn (its `data`)."""
    local = torch_frame_locals(ctx.exception, "fetch.py", "fetch")
    data = local.get("data") if local is not None else None
    return list(data) if isinstance(data, (list, tuple)) else None


def _fields(sample: Any) -> list[tuple[str, Any]]:
    """(name, getter) for each field of a sample: a dict's keys, a tuple's positions, else the sample itself."""
    if isinstance(sample, dict) or (hasattr(sample, "keys") and hasattr(sample, "__getitem__")):
        return [(str(key), lambda s, k=key: s[k]) for key in list(sample.keys())]
    if isinstance(sample, tuple) and sample and any(_is_sized(v) for v in sample):
        names = getattr(sample, "_fields", None) or [f"[{i}]" for i in range(len(sample))]
        return [(str(name), lambda s, i=i: s[i]) for i, name in enumerate(names)]
    return [("sample", lambda s: s)]


def _is_sized(value: Any) -> bool:
    return hasattr(value, "shape") or isinstance(value, (list, tuple))


def _size(value: Any) -> Any:
    """A tensor's or array's shape; a list's length, with its rows' lengths when it nests lists; '-' for a scalar."""
    shape = getattr(value, "shape", None)
    if shape is not None and not callable(shape):
        return tuple(int(s) for s in shape)
    if isinstance(value, (list, tuple)):
        inner = {_size(v) for v in value}
        if inner <= {"-"}:
            return (len(value),)
        return (len(value), *next(iter(inner))) if len(inner) == 1 else (len(value), "ragged")
    return "-"


def _shown(counted: Counter) -> str:
    """`12 (5 samples), 13 (3)`: each size with how many samples have it, the most common first."""
    parts = []
    for index, (size, count) in enumerate(counted.most_common(6)):
        text = "x".join(str(s) for s in size) if isinstance(size, tuple) else str(size)
        parts.append(f"{text} ({count} sample{'s' if count != 1 else ''})" if index == 0 else f"{text} ({count})")
    more = f", and {len(counted) - 6} more sizes" if len(counted) > 6 else ""
    return ", ".join(parts) + more


def _span(counted: Counter) -> dict[str, int]:
    """The shortest and longest first dimension of a ragged field (what padding must reach)."""
    firsts = [size[0] for size in counted if isinstance(size, tuple) and size and isinstance(size[0], int)]
    return {"min": min(firsts), "max": max(firsts)} if firsts else {}


def _range(counted: Counter) -> str:
    span = _span(counted)
    return f" (from {span['min']} to {span['max']})" if span and span["min"] != span["max"] else ""
