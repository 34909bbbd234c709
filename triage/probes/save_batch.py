"""save_batch: keep the failing batch, its step and the RNG states, so that the failure can be replayed at once.

Written to `<report_dir>/batch.pt` as plain containers of CPU tensors (and ints,
floats, strings), loadable with `torch.load(path, weights_only=True)`;
`triage/replay.py` loads it for `python -m triage --replay DIR script.py`. A loop
fed by no DataLoader gets its failing step's inputs saved instead, to
`step_inputs.pt`: the failing call's arguments, or the tensors the failing step
reads (see source_step.py); a replay could not feed those to the script. The
file is read back and compared before the probe says it is saved.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import torch

from ..diagnosis import ProbeResult
from . import source_step
from ._support import Unavailable, cuda_poisoned, describe, iter_tensors, no_batch_hint, readable, result
from .context import ProbeContext

NAME = "save_batch"
FORMAT = "triage.batch/1"
FILENAME = "batch.pt"  # a DataLoader's batch: `--replay` feeds it to the script
INPUTS_FILENAME = "step_inputs.pt"  # the failing step's inputs when no DataLoader gave them: loadable, not replayable
# The most bytes of tensors saved (and read back to check). A larger batch is cut to its first rows, every
# tensor of the batch's size alike, so that the rows still belong together.
SAVE_LIMIT_BYTES = 128 * 1024**2
_PLAIN = (int, float, bool, str, bytes, type(None))


def rng_states(include_cuda: bool) -> dict[str, Any]:
    """Python, NumPy and torch RNG states as weights_only-loadable values."""
    states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        name, keys, pos, has_gauss, cached = numpy.random.get_state()
        states["numpy"] = (name, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached))
    if include_cuda and torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = [s.clone() for s in torch.cuda.get_rng_state_all()]
    return states


def _rows_kept(batch: Any) -> tuple[int, int] | None:
    """(batch size, rows to keep) when the batch's tensors are over SAVE_LIMIT_BYTES; None when they fit."""
    tensors = [t for _, t in iter_tensors(batch)]
    total = sum(t.numel() * t.element_size() for t in tensors)
    if total <= SAVE_LIMIT_BYTES:
        return None
    sizes = [t.shape[0] for t in tensors if t.dim() >= 1]
    rows = max(set(sizes), key=sizes.count) if sizes else 0
    return (rows, max(int(rows * SAVE_LIMIT_BYTES / total), 1)) if rows > 1 else None


def _plain(obj: Any, path: str, poisoned: bool, dropped: list[str], depth: int = 0, budget: list[int] | None = None,
           rows: tuple[int, int] | None = None) -> Any:
    """A copy of the batch made only of what weights_only loading accepts, within `budget` bytes of tensors;
    `rows` = (batch size, rows kept) cuts every tensor of the batch's size to its first rows."""
    budget = [SAVE_LIMIT_BYTES] if budget is None else budget
    if isinstance(obj, torch.Tensor):
        if not readable(obj, poisoned):
            dropped.append(f"{path}: {describe(obj)} unreadable after the CUDA error")
            return None
        tensor = obj.detach()
        if rows is not None and tensor.dim() >= 1 and tensor.shape[0] == rows[0]:
            tensor = tensor[:rows[1]]
            dropped.append(f"{path}: {describe(obj)} cut to its first {rows[1]} of {rows[0]} rows, to keep the "
                           f"batch under the {SAVE_LIMIT_BYTES / 1024**2:.0f} MB saved")
        size = tensor.numel() * tensor.element_size()
        if size > budget[0]:
            dropped.append(f"{path}: {describe(obj)} ({size / 1024**2:.0f} MB) over what is left of the "
                           f"{SAVE_LIMIT_BYTES / 1024**2:.0f} MB saved")
            return None
        budget[0] -= size
        if tensor.device.type != "cpu":
            return tensor.to("cpu")
        # torch.save writes a view's whole storage: a slice (or any view) is saved as a tensor of its own.
        # (a sparse tensor has no storage to measure; torch.save writes its indices and values)
        shares_storage = tensor.layout == torch.strided and tensor.untyped_storage().nbytes() > size
        return tensor.clone() if shares_storage else tensor
    if isinstance(obj, _PLAIN):
        return obj
    if depth > 8:
        dropped.append(f"{path}: nested too deep")
        return None
    if isinstance(obj, dict) or (hasattr(obj, "items") and hasattr(obj, "keys")):
        if type(obj) is not dict:
            dropped.append(f"{path}: {type(obj).__name__} saved as a dict")
        return {k if isinstance(k, _PLAIN) else str(k): _plain(v, f"{path}[{k!r}]", poisoned, dropped, depth + 1, budget,
                                                               rows)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            dropped.append(f"{path}: {type(obj).__name__} saved as a tuple")
        items = [_plain(v, f"{path}[{i}]", poisoned, dropped, depth + 1, budget, rows) for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    dropped.append(f"{path}: {type(obj).__name__} not saved")
    return None


def save_batch(ctx: ProbeContext) -> ProbeResult:
    if ctx.report_dir is None:
        return result(NAME, "skipped", "no report folder to save into")
    batch, source, filename = ctx.batch, "the batch the DataLoader yielded", FILENAME
    if batch is None:
        batch, source, why_not = _step_inputs(ctx)
        if batch is None:
            return result(NAME, "skipped", f"no batch known, and no model call failed: {no_batch_hint()}; {why_not}")
        filename = INPUTS_FILENAME  # not a DataLoader's batch: a replay would have nothing to feed it to
    poisoned = cuda_poisoned(ctx)
    dropped: list[str] = []
    plain = _plain(batch, "batch", poisoned, dropped, budget=[SAVE_LIMIT_BYTES], rows=_rows_kept(batch))
    payload = {"format": FORMAT, "batch": plain, "source": source, "batch_index": ctx.batch_index, "step": ctx.step,
               "rng": rng_states(include_cuda=not poisoned), "dropped": dropped}
    path = Path(ctx.report_dir) / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    loaded = torch.load(path, weights_only=True, mmap=True)  # read back from the file, not into a second copy
    if not _same(plain, loaded["batch"]):
        return result(NAME, "error", f"{path} does not read back as saved", artifacts=[str(path)])
    tensors = list(iter_tensors(plain))
    shown = ", ".join(f"{p} {describe(t).rsplit(' on ', 1)[0]}" for p, t in tensors[:4])
    more = f" and {len(tensors) - 4} more" if len(tensors) > 4 else ""
    where = f"batch {ctx.batch_index}" if ctx.batch_index is not None else "the batch"
    step = f" (step {ctx.step})" if ctx.step is not None else ""
    lost = f"; not saved as it was: {'; '.join(dropped[:3])}" if dropped else ""
    size = f"({path.stat().st_size / 1024:.0f} KB)"
    if filename == FILENAME:
        saved = f"{where}{step} from {source}"
        use = f"replay with `python -m triage --replay {path.parent} SCRIPT`"
    else:
        saved = f"{source}{step}"
        use = f"load with `torch.load({str(path)!r}, weights_only=True)['batch']`"
    detail = f"saved {saved}: {shown or 'no tensors'}{more}, with the RNG states, to {path} {size}; {use}{lost}"
    return result(NAME, "confirmed", detail, artifacts=[str(path)], tensors=len(tensors), dropped=dropped)


def _step_inputs(ctx: ProbeContext) -> tuple[Any, str, str]:
    """(inputs, where they came from, why there are none) when no DataLoader yielded the failing batch."""
    if ctx.model_args is not None or ctx.module_args:
        args = ctx.model_args if ctx.model_args is not None else tuple(ctx.module_args)
        kwargs = ctx.model_kwargs if ctx.model_args is not None else ctx.module_kwargs
        return {"args": tuple(args), "kwargs": dict(kwargs or {})}, "the failing call's arguments", ""
    try:
        step = source_step.find(ctx.frames)
    except Unavailable as exc:
        return None, "", str(exc)
    inputs = step.inputs()
    if not any(isinstance(value, torch.Tensor) for value in inputs.values()):
        return None, "", f"the step at {step.where} reads no tensor from before it"
    return inputs, f"the tensors the step at {step.where} reads", ""


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        if not (isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and a.layout == b.layout):
            return False
        if a.layout != torch.strided:  # torch.equal has no sparse kernel
            a, b = a.to_dense(), b.to_dense()
        return bool(torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, equal_nan=True)))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b
