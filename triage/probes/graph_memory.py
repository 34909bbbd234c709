"""graph_memory: how much memory the autograd graphs kept by a growing container hold, against what the run grew.

The memory check (health.py) names a global of the script that holds tensors
with a grad_fn (a list of validation losses, say). That they have a grad_fn
says nothing about size: a loss computed from a leaf through two ops keeps a few
bytes, one computed through a network without `torch.no_grad()` keeps every
activation its backward would need. The probe walks each tensor's graph and
adds up the distinct storages its nodes saved for backward (parameters and
buffers excluded: the model holds those anyway), then compares the sum with the
growth the memory check measured. Nothing is copied: storages are counted by
their address and size. The walk (`walk_graphs`) also counts how many graph
nodes consume each parameter, which tells how many forward passes a graph
spans; memory_breakdown runs the same walk at an out-of-memory error.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..diagnosis import ProbeResult
from ..live_objects import live_objects
from ._support import result
from .context import ProbeContext

NAME = "graph_memory"
MIB = 2**20
HOLDS_MOST = 0.5  # the graphs hold at least this share of the growth: they are what grew
HOLDS_LITTLE = 0.1  # at most this share: something else holds the memory
MAX_NODES = 200_000


def graph_memory(ctx: ProbeContext) -> ProbeResult:
    values = ctx.diagnosis.values if ctx.diagnosis is not None else {}
    holder = str(values.get("holder") or "")
    scope = getattr(sys.modules.get("__main__"), "__dict__", {})
    if not holder or holder not in scope:
        return result(NAME, "skipped", f"the script has no global `{holder}` to measure" if holder else
                      "the finding names no container that keeps graphs")
    container = scope[holder]
    items = (list(container.values()) if isinstance(container, dict) else
             [container] if isinstance(container, torch.Tensor) else list(container))
    roots = [t for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    if not roots:
        return result(NAME, "refuted", f"`{holder}` holds no tensor with a grad_fn now: it keeps no autograd graph")
    growth = _growth_bytes(ctx, values)
    walk = walk_graphs([t.grad_fn for t in roots], model_storages())
    held, nodes, saved = walk.held_bytes, walk.nodes, walk.storages
    facts: dict[str, Any] = {"holder": holder, "tensors": len(roots), "graph_nodes": nodes, "saved_tensors": saved,
                             "held_bytes": held, "growth_bytes": growth}
    measured = (f"the {len(roots)} tensors in `{holder}` keep autograd graphs of {nodes} nodes holding "
                f"{held / MIB:.1f} MiB of saved tensors ({saved} distinct storages, parameters excluded)")
    if growth is None or growth <= 0:
        return result(NAME, "inconclusive", f"{measured}; the growth to compare with is unknown", **facts)
    share = held / growth
    facts["share"] = share
    against = f"against the {growth / MIB:.1f} MiB the process grew ({share:.0%})"
    if share >= HOLDS_MOST:
        return result(NAME, "confirmed", f"{measured}, {against}: the kept graphs are what grows", **facts)
    if share <= HOLDS_LITTLE:
        return result(NAME, "refuted", f"{measured}, only {against}: something else holds the memory", **facts)
    return result(NAME, "inconclusive", f"{measured}, {against}: part of the growth", **facts)


def _growth_bytes(ctx: ProbeContext, values: dict[str, Any]) -> float | None:
    """The growth the memory check measured: from the finding's facts, else the rule's `growth` (MiB)."""
    health = (ctx.incident.facts or {}).get("health") or {}
    for finding in health.get("findings") or []:
        if finding.get("check") == "memory-growing" and finding.get("growth_bytes"):
            return float(finding["growth_bytes"])
    try:
        return float(values["growth"]) * MIB
    except (KeyError, TypeError, ValueError):
        return None


def model_storages() -> set[tuple[str, int]]:
    """(device, address) of every live module's parameters and buffers: graphs save them, but do not keep them alive."""
    found: set[tuple[str, int]] = set()
    for module in live_objects(nn.Module):
        for tensor in [*module._parameters.values(), *module._buffers.values()]:
            if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
                found.add(_storage_key(tensor))
    return found


@dataclass
class GraphWalk:
    """What a walk of autograd graphs found: the storages their nodes saved for backward, and each parameter's uses."""

    held_bytes: int = 0
    nodes: int = 0
    storages: int = 0
    # parameter (device, address) -> how many graph nodes consume it
    parameter_uses: dict[tuple[str, int], int] = field(default_factory=dict)
    # False when the node budget ran out first: the figures are then lower bounds
    complete: bool = True

    @property
    def passes(self) -> int:
        """How many forward passes the graphs span: the fewest uses of any parameter they reach (one forward uses
        each weight once; the losses of 40 batches summed into one tensor use it 40 times). 0 when none is reached."""
        return min(self.parameter_uses.values(), default=0)


def walk_graphs(roots: list[Any], exclude: set[tuple[str, int]], device_type: str | None = None,
                max_nodes: int = MAX_NODES) -> GraphWalk:
    """Walk the graphs from `roots` (grad_fn nodes), at most `max_nodes` nodes, adding up the distinct storages their
    nodes saved for backward (those in `exclude`, the parameters and buffers, and those on another device than
    `device_type` left out) and counting how many nodes consume each parameter in `exclude`. Nothing is copied:
    storages are counted by address and size."""
    storages: dict[tuple[str, int], int] = {}
    uses: dict[tuple[str, int], int] = {}
    visited: dict[int, Any] = {}  # holds the nodes, so that no id is reused during the walk
    stack = [root for root in roots if root is not None]
    while stack:
        node = stack.pop()
        if id(node) in visited:
            continue
        if len(visited) >= max_nodes:
            return _walk(storages, uses, len(visited), complete=False)
        visited[id(node)] = node
        for tensor in _saved_tensors(node):
            if device_type is not None and tensor.device.type != device_type:
                continue
            key = _storage_key(tensor)
            if key[1] and key not in exclude:
                storages[key] = tensor.untyped_storage().nbytes()
        consumed: set[tuple[str, int]] = set()
        for child, _ in getattr(node, "next_functions", ()):
            if child is None:
                continue
            variable = getattr(child, "variable", None)  # an AccumulateGrad: the leaf it accumulates into
            if isinstance(variable, torch.Tensor) and (key := _storage_key(variable)) in exclude:
                consumed.add(key)
            else:
                stack.append(child)
        for key in consumed:
            uses[key] = uses.get(key, 0) + 1
    return _walk(storages, uses, len(visited), complete=True)


def _walk(storages: dict[tuple[str, int], int], uses: dict[tuple[str, int], int], nodes: int,
          complete: bool) -> GraphWalk:
    return GraphWalk(sum(storages.values()), nodes, len(storages), uses, complete)


def _storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    return str(tensor.device), tensor.untyped_storage().data_ptr()


# node type -> the names of its saved-tensor attributes (read once per type, not with dir() on every node)
_SAVED_ATTRIBUTES: dict[type, tuple[str, ...]] = {}
# SavedTensor.data reads what was stored without unpacking it (torch >= 2.4); older torch is read through `_saved_*`
_RAW_READABLE = hasattr(torch._C._autograd, "SavedTensor") and hasattr(torch._C._autograd.SavedTensor, "data")


def _saved_tensors(node: Any) -> list[torch.Tensor]:
    """The tensors a node saved for backward, as they are stored. Under a saved-tensor hook (`save_on_cpu`, an
    offloader) that is the hook's packed value, counted where it lives; its unpack hook is never called, since
    unpacking could copy every saved activation back to the device."""
    kind = type(node)
    names = _SAVED_ATTRIBUTES.get(kind)
    if names is None:
        prefix = "_raw_saved_" if _RAW_READABLE else "_saved_"
        names = _SAVED_ATTRIBUTES[kind] = tuple(a for a in dir(kind) if a.startswith(prefix))
    found: list[torch.Tensor] = []
    for attribute in names:
        try:
            value = getattr(node, attribute)
            items = value if isinstance(value, (tuple, list)) else (value,)
            stored = [item.data for item in items] if _RAW_READABLE else list(items)
        except Exception:  # freed by a backward already run, or not readable
            continue
        for item in stored:
            for tensor in item if isinstance(item, (tuple, list)) else (item,):
                if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
                    found.append(tensor)
    return found
