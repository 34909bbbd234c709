"""Measurements on the tensors the failing line itself handles, re-read in the failing frame (line_values.py).

Each experiment answers one question about the tensor the failing call or in-place op was given, and can come
out either way:

- numpy_grad: does the tensor `.numpy()` was called on require grad, and where does it come from?
- inplace_leaf: is the in-place op's target a leaf that requires grad, with grad mode on at that line?
- inplace_view: is the in-place op's target a view, and of what (the op that made it)?
- view_contiguity: is the tensor `.view()` was called on non-contiguous, and does `.contiguous().view()` run?
- index_bounds: do the indices of a `gather`/`index_select`/`scatter`/`take_along_dim` call fall inside the
  size of the dimension they index?

They run in an experiment's child: evaluating the line's expressions re-runs the user's code.
"""

from __future__ import annotations

import ast
from typing import Any

import torch
from torch import nn

from ..diagnosis import ProbeResult
from ._support import Unavailable, describe, result
from .context import ProbeContext
from .line_values import FailingLine, failing_line


def _line(ctx: ProbeContext, name: str) -> FailingLine | ProbeResult:
    try:
        return failing_line(ctx)
    except Unavailable as exc:
        return result(name, "skipped", str(exc))


def _tensor(line: FailingLine, node: ast.expr) -> torch.Tensor | None:
    try:
        value = line.value(node)
    except Exception:
        return None
    return value if isinstance(value, torch.Tensor) else None


def _origin(tensor: torch.Tensor) -> str:
    """`a leaf that requires grad (a parameter)`, `the output of AddmmBackward0` or `a tensor outside the graph`."""
    if tensor.grad_fn is not None:
        return f"the output of {type(tensor.grad_fn).__name__}"
    if tensor.requires_grad:
        return "a leaf that requires grad" + (" (a parameter)" if isinstance(tensor, nn.Parameter) else "")
    return "a tensor outside the autograd graph"


def _method_receiver(ctx: ProbeContext, name: str, method: str,
                     shown_call: str) -> tuple[FailingLine, ast.Call, str, torch.Tensor] | ProbeResult:
    """The failing line, its first `.METHOD(...)` call, and that call's receiver as text and as the tensor it gives
    when re-read; or why there is none."""
    line = _line(ctx, name)
    if isinstance(line, ProbeResult):
        return line
    calls = [c for c in line.calls(method) if isinstance(c.func, ast.Attribute)]
    if not calls:
        return result(name, "skipped", f"no {shown_call} call at {line.where}")
    receiver = calls[0].func.value  # type: ignore[attr-defined]
    tensor = _tensor(line, receiver)
    shown = line.text(receiver)
    if tensor is None:
        return result(name, "skipped", f"`{shown}` at {line.where} does not give a tensor when re-read")
    return line, calls[0], shown, tensor


# ---------------------------------------------------------------------------- numpy_grad


def numpy_grad(ctx: ProbeContext) -> ProbeResult:
    name = "numpy_grad"
    found = _method_receiver(ctx, name, "numpy", "`.numpy()`")
    if isinstance(found, ProbeResult):
        return found
    line, _, shown, tensor = found
    facts = {"tensor": shown, "requires_grad": tensor.requires_grad, "is_leaf": tensor.is_leaf,
             "grad_fn": type(tensor.grad_fn).__name__ if tensor.grad_fn is not None else None,
             "parameter": isinstance(tensor, nn.Parameter), "grad_enabled": line.grad_enabled}
    if not tensor.requires_grad:
        return result(name, "refuted", f"`{shown}` ({describe(tensor)}) at {line.where} does not require grad: "
                      f"numpy() is not refused for that reason", **facts)
    try:
        tensor.detach().numpy()
        facts["detached_reads"] = True
        works = "; `.detach().numpy()` reads it"
    except Exception as exc:  # noqa: BLE001 - a second reason (a device, a dtype) is worth stating
        facts["detached_reads"] = False
        works = f"; `.detach().numpy()` fails too: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    return result(name, "confirmed", f"`{shown}` ({describe(tensor)}) at {line.where} requires grad: it is "
                  f"{_origin(tensor)}, still tied to the autograd graph{works}", **facts)


# ---------------------------------------------------------------------------- in-place targets


def _inplace_target(ctx: ProbeContext, name: str) -> tuple[FailingLine, str, torch.Tensor] | ProbeResult:
    """The failing line, the text and the value of the first tensor it changes in place; or why there is none."""
    line = _line(ctx, name)
    if isinstance(line, ProbeResult):
        return line
    for node in line.inplace_targets():
        tensor = _tensor(line, node)
        if tensor is not None:
            return line, line.text(node), tensor
    return result(name, "skipped", f"no tensor changed in place at {line.where}")


def inplace_leaf(ctx: ProbeContext) -> ProbeResult:
    name = "inplace_leaf"
    found = _inplace_target(ctx, name)
    if isinstance(found, ProbeResult):
        return found
    line, shown, tensor = found
    reads_grad = any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in ast.walk(line.statement))
    facts = {"target": shown, "is_leaf": tensor.is_leaf, "requires_grad": tensor.requires_grad,
             "grad_enabled": line.grad_enabled, "parameter": isinstance(tensor, nn.Parameter),
             "reads_grad": reads_grad}
    what = f"`{shown}` ({describe(tensor)}) at {line.where}"
    if not (tensor.is_leaf and tensor.requires_grad):
        return result(name, "refuted", f"{what} is {_origin(tensor)}, not a leaf that requires grad", **facts)
    if not line.grad_enabled:
        return result(name, "refuted", f"{what} is a leaf that requires grad, but grad mode is off at that line "
                      f"(inside torch.no_grad()), where changing it in place is allowed", **facts)
    update = " and the statement reads `.grad`: a hand-written update step" if reads_grad else ""
    return result(name, "confirmed", f"{what} is a leaf that requires grad"
                  f"{' (a parameter)' if facts['parameter'] else ''}, changed in place with grad mode on (no "
                  f"torch.no_grad() around the line){update}", **facts)


def inplace_view(ctx: ProbeContext) -> ProbeResult:
    name = "inplace_view"
    found = _inplace_target(ctx, name)
    if isinstance(found, ProbeResult):
        return found
    line, shown, tensor = found
    what = f"`{shown}` ({describe(tensor)}) at {line.where}"
    base = tensor._base
    facts: dict[str, Any] = {"target": shown, "view": tensor._is_view(), "requires_grad": tensor.requires_grad,
                             "grad_fn": type(tensor.grad_fn).__name__ if tensor.grad_fn is not None else None,
                             "grad_enabled": line.grad_enabled}
    if not tensor._is_view() or base is None:
        return result(name, "refuted", f"{what} is not a view of another tensor", **facts)
    made_by = facts["grad_fn"] or "an op run outside the autograd graph"
    facts.update(base=describe(base), base_requires_grad=base.requires_grad,
                 base_grad_fn=type(base.grad_fn).__name__ if base.grad_fn is not None else None,
                 multi_output=bool(facts["grad_fn"]) and facts["grad_fn"].startswith(
                     ("Unbind", "Split", "SplitWithSizes", "Chunk", "Unsafe")))
    several = " (an op that returns several views, whose outputs may not be changed in place)" \
        if facts["multi_output"] else ""
    return result(name, "confirmed", f"{what} is a view of another tensor ({describe(base)}"
                  f"{', which requires grad' if base.requires_grad else ''}), made by {made_by}{several}", **facts)


# ---------------------------------------------------------------------------- view_contiguity


def view_contiguity(ctx: ProbeContext) -> ProbeResult:
    name = "view_contiguity"
    found = _method_receiver(ctx, name, "view", "`.view(...)`")
    if isinstance(found, ProbeResult):
        return found
    line, call, shown, tensor = found
    try:
        args = [line.value(a) for a in call.args]
    except Exception as exc:
        return result(name, "skipped", f"the arguments of `{line.text(call)}` cannot be re-read: {exc}")
    facts: dict[str, Any] = {"tensor": shown, "shape": list(tensor.shape), "stride": list(tensor.stride()),
                             "contiguous": tensor.is_contiguous(), "view_args": [repr(a) for a in args]}
    what = f"`{shown}` ({describe(tensor)}, strides {tuple(tensor.stride())}) at {line.where}"
    if tensor.is_contiguous():
        return result(name, "refuted", f"{what} is contiguous: .view is not refused for its memory layout", **facts)
    try:
        shape = tuple(tensor.contiguous().view(*args).shape)
        facts["contiguous_view"] = list(shape)
        then = f"; `.contiguous().view(...)` runs and gives {list(shape)}"
    except Exception as exc:  # noqa: BLE001 - the sizes themselves are wrong too
        facts["contiguous_view"] = None
        then = f"; `.contiguous().view(...)` fails too: {str(exc).splitlines()[0]}"
    return result(name, "confirmed", f"{what} is not contiguous (a slice, transpose or expand of another tensor), "
                  f"so .view cannot reinterpret it{then}", **facts)


# ---------------------------------------------------------------------------- index_bounds

_INDEXING = ("gather", "index_select", "take_along_dim", "scatter", "scatter_", "scatter_add", "scatter_add_",
             "scatter_reduce", "scatter_reduce_", "index_add", "index_add_", "index_copy", "index_copy_",
             "index_fill", "index_fill_")


def _indexing_call(line: FailingLine, call: ast.Call) -> tuple[ast.expr, ast.expr | None, ast.expr] | None:
    """(input, dim, index) expressions of `x.gather(dim, index)` or `torch.gather(x, dim, index)`."""
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    method = isinstance(call.func, ast.Attribute) and not (
        isinstance(call.func.value, ast.Name) and call.func.value.id == "torch")
    args = list(call.args)
    if method:
        source: ast.expr | None = call.func.value  # type: ignore[attr-defined]
    else:
        source = args.pop(0) if args else keywords.get("input")
    dim = args[0] if args else keywords.get("dim")
    index = args[1] if len(args) > 1 else keywords.get("index") or keywords.get("indices")
    if source is None or index is None:
        return None
    return source, dim, index


def index_bounds(ctx: ProbeContext) -> ProbeResult:
    name = "index_bounds"
    line = _line(ctx, name)
    if isinstance(line, ProbeResult):
        return line
    checked = []
    for call in line.calls(*_INDEXING):
        parts = _indexing_call(line, call)
        if parts is None:
            continue
        source, dim_node, index_node = parts
        tensor, index = _tensor(line, source), _tensor(line, index_node)
        try:
            dim = int(line.value(dim_node)) if dim_node is not None else 0
        except Exception:
            continue
        if tensor is None or index is None or index.dtype.is_floating_point or tensor.dim() == 0:
            continue
        size = tensor.shape[dim]
        low, high = (int(index.min()), int(index.max())) if index.numel() else (0, 0)
        bad = int(((index < 0) | (index >= size)).sum())
        checked.append({"call": line.text(call), "input": line.text(source), "index": line.text(index_node),
                        "dim": dim, "size": int(size), "index_min": low, "index_max": high, "outside": bad,
                        "count": index.numel(), "input_shape": list(tensor.shape), "index_shape": list(index.shape)})
    if not checked:
        return result(name, "skipped", f"no gather/index_select/scatter call with tensor indices at {line.where}")
    facts = {"checked": checked, **{k: checked[0][k] for k in ("dim", "size", "index_min", "index_max")}}
    bad = [c for c in checked if c["outside"]]
    if not bad:
        shown = "; ".join(f"`{c['index']}` runs {c['index_min']}..{c['index_max']} within dim {c['dim']} of size "
                          f"{c['size']}" for c in checked)
        return result(name, "refuted", f"every index is in range at {line.where}: {shown}", **facts)
    first = bad[0]
    facts.update({k: first[k] for k in ("dim", "size", "index_min", "index_max")})
    return result(name, "confirmed", f"`{first['index']}` (values {first['index_min']}..{first['index_max']}) indexes "
                  f"dim {first['dim']} of `{first['input']}` ({'x'.join(map(str, first['input_shape']))}, size "
                  f"{first['size']}) at {line.where}: {first['outside']} of {first['count']} indices fall outside "
                  f"[0, {first['size']})", **facts)
