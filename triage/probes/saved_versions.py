"""saved_versions: which tensor saved for backward was changed in place, read from the graph that failed.

"one of the variables needed for gradient computation has been modified by an inplace operation: [Float [128,
128]] ... is at version 2; expected version 1" gives a shape and two version counters. The graph of the loss
being backpropagated still holds every node's saved tensors, and reading a saved tensor whose version moved on
raises that same error: so this experiment walks the graph from the loss, reads each node's saved tensors, and
names the node (`AddmmBackward0`, saved `mat2`) whose saved tensor is stale. A leaf the node reaches whose
version is the one the error reports (a weight, updated by `optimizer.step()` or a `clamp_`) is named too; else
the stale tensor is an intermediate result (an activation, a normalised batch). It confirms when a stale saved
tensor is found and refutes when every saved tensor reads back at its saved version. Reading saved tensors
copies nothing; the graph is walked in an experiment's child.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from ..diagnosis import ProbeResult
from ..graph_walk import autograd_nodes
from ._support import describe, result, torch_frame_locals
from .context import ProbeContext

NAME = "saved_versions"
_MAX_NODES = 50_000
_STALE = "modified by an inplace operation"
_FREED = re.compile(r"backward through the graph a second time|after they have already been freed")
_VERSIONS = re.compile(r"is at version (\d+); expected version (\d+)")
_SHAPE = re.compile(r"\[torch\.\w+ \[([\d, ]*)\]\]")


def saved_versions(ctx: ProbeContext) -> ProbeResult:
    roots = _roots(ctx)
    if not roots:
        return result(NAME, "skipped", "the tensor given to backward() is not on the traceback")
    message = str(ctx.exception or "")
    versions = _VERSIONS.search(message)
    stale, freed, walked = _walk(roots)
    facts: dict[str, Any] = {"nodes": walked, "freed_nodes": freed}
    if versions:
        facts.update(version=int(versions.group(1)), expected_version=int(versions.group(2)))
    shape = _SHAPE.search(message)
    if shape:
        facts["shape"] = [int(s) for s in shape.group(1).replace(",", " ").split()]
    if not stale:
        if freed:
            return result(NAME, "inconclusive", f"no stale saved tensor among the {walked} graph nodes still "
                          f"holding theirs ({freed} were already freed by the backward)", **facts)
        return result(NAME, "refuted", f"every tensor the {walked} nodes of the loss's graph saved reads back at "
                      f"its saved version: none was changed in place", **facts)
    found = [(n, f, leaf) for n, f in stale if (leaf := _leaf(n, facts.get("version"), facts.get("shape"))) is not None]
    node, field, leaf = found[0] if found else (*stale[0], None)
    facts.update(node=type(node).__name__, saved=field, stale=[f"{type(n).__name__}.{f}" for n, f in stale][:10])
    where = f"{type(node).__name__} saved `{field}` for backward, and it has been changed in place since"
    if leaf is None:
        facts.update(parameter=None, leaf=False)
        return result(NAME, "confirmed", f"{where}: an intermediate result of the forward pass (no leaf such as a "
                      f"weight at version {facts.get('version', '?')} behind it)", **facts)
    name = _parameter_name(ctx, leaf)
    held = _held_by_optimizer(ctx, leaf)
    facts.update(parameter=name, leaf=True, held_by_optimizer=held, leaf_version=leaf._version)
    by = " (a parameter the optimizer updates: an optimizer.step() or a direct write such as `clamp_` after the " \
         "forward pass changed it)" if held else ""
    return result(NAME, "confirmed", f"{where}: it is {name} ({describe(leaf)}), now at version {leaf._version}"
                  f"{by}", **facts)


def _roots(ctx: ProbeContext) -> list[Any]:
    """The grad_fn of each tensor backward() was called on (`loss.backward()` or `torch.autograd.backward`)."""
    local = torch_frame_locals(ctx.exception, "_tensor.py", "backward")
    tensors: Any = local.get("self") if local is not None else None
    if tensors is None:
        local = torch_frame_locals(ctx.exception, "__init__.py", "backward") or torch_frame_locals(
            ctx.exception, "__init__.py", "grad")
        tensors = (local or {}).get("tensors") or (local or {}).get("outputs")
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    return [t.grad_fn for t in tensors or () if isinstance(t, torch.Tensor) and t.grad_fn is not None]


def _walk(roots: list[Any]) -> tuple[list[tuple[Any, str]], int, int]:
    """(nodes whose saved tensor is stale, with the field; nodes whose saved tensors were freed; nodes walked)."""
    stale: list[tuple[Any, str]] = []
    freed = walked = 0
    for node in autograd_nodes(roots, _MAX_NODES, breadth_first=True):
        walked += 1
        node_freed = False
        for field in (a for a in dir(node) if a.startswith("_saved_")):
            try:
                getattr(node, field)
            except RuntimeError as exc:
                if _STALE in str(exc):
                    stale.append((node, field[len("_saved_"):]))
                elif _FREED.search(str(exc)):
                    node_freed = True
        freed += node_freed
    return stale, freed, walked


def _leaf(node: Any, version: int | None, shape: list[int] | None, depth: int = 3) -> torch.Tensor | None:
    """A leaf within `depth` steps of `node` (through views such as TBackward0) at the version and of the shape (or
    its reverse, for a transposed weight) the error reports."""
    shapes = None if shape is None else (shape, shape[::-1])
    frontier = [node]
    for _ in range(depth):
        following = []
        for current in frontier:
            for child, _ in getattr(current, "next_functions", ()):
                variable = getattr(child, "variable", None)
                if isinstance(variable, torch.Tensor) and (version is None or variable._version == version) and (
                        shapes is None or list(variable.shape) in shapes):
                    return variable
                if child is not None and type(child).__name__ in _VIEWS:
                    following.append(child)
        frontier = following
    return None


_VIEWS = {"TBackward0", "TransposeBackward0", "ViewBackward0", "PermuteBackward0", "ExpandBackward0",
          "AsStridedBackward0", "UnsqueezeBackward0", "SqueezeBackward0", "SqueezeBackward1", "ReshapeAliasBackward0",
          "UnsafeViewBackward0"}


def _parameter_name(ctx: ProbeContext, leaf: torch.Tensor) -> str:
    """`parameter `affine1.weight` of Policy`, or `a leaf tensor` when no known model holds it."""
    owners = [ctx.model] if isinstance(ctx.model, nn.Module) else []
    for frame, _ in reversed(ctx.frames):
        owners += [v for v in frame.f_locals.values() if isinstance(v, nn.Module)]
        owners += [v for v in frame.f_globals.values() if isinstance(v, nn.Module)]
    seen: set[int] = set()
    for owner in owners:
        if id(owner) in seen:
            continue
        seen.add(id(owner))
        for path, param in owner.named_parameters():
            if param is leaf:
                return f"parameter `{path}` of {type(owner).__name__}"
    return "a leaf tensor that requires grad"


def _held_by_optimizer(ctx: ProbeContext, leaf: torch.Tensor) -> bool:
    optimizers = [ctx.optimizer] if ctx.optimizer is not None else []
    for frame, _ in reversed(ctx.frames):
        optimizers += [v for v in {**frame.f_globals, **frame.f_locals}.values()
                       if isinstance(v, torch.optim.Optimizer)]
    for optimizer in optimizers:
        try:
            if any(p is leaf for group in optimizer.param_groups for p in group["params"]):
                return True
        except Exception:
            continue
    return False
