"""graph_memory: how much memory the autograd graphs kept by a growing container hold, against what the run grew.

The memory check (health.py) names a global of the script that holds tensors
with a grad_fn (a list of validation losses, say). That they have a grad_fn
says nothing about size: a loss computed from a leaf through two ops keeps a few
bytes, one computed through a network without `torch.no_grad()` keeps every
activation its backward would need. The probe walks each tensor's graph and
adds up the distinct storages its nodes saved for backward (parameters and
buffers excluded: the model holds those anyway), then compares the sum with the
growth the memory check measured. Nothing is copied: storages are counted by
their address and size.
"""

from __future__ import annotations

import sys
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
    held, nodes, saved = _saved_bytes([t.grad_fn for t in roots], _model_storages())
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


def _model_storages() -> set[int]:
    """Addresses of every live module's parameters and buffers: graphs save them, but do not keep them alive."""
    found: set[int] = set()
    for module in live_objects(nn.Module):
        for tensor in [*module._parameters.values(), *module._buffers.values()]:
            if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
                found.add(tensor.untyped_storage().data_ptr())
    return found


def _saved_bytes(roots: list[Any], exclude: set[int]) -> tuple[int, int, int]:
    """(bytes, nodes, storages): the distinct storages the graphs' nodes saved for backward, `exclude` left out."""
    storages: dict[int, int] = {}
    visited: set[int] = set()
    stack = list(roots)
    while stack and len(visited) < MAX_NODES:
        node = stack.pop()
        if node is None or id(node) in visited:
            continue
        visited.add(id(node))
        for attribute in dir(node):
            if not attribute.startswith("_saved_"):
                continue
            try:
                value = getattr(node, attribute)
            except Exception:  # freed by a backward already run, or not readable
                continue
            for tensor in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
                    storage = tensor.untyped_storage()
                    address = storage.data_ptr()
                    if address and address not in exclude:
                        storages[address] = storage.nbytes()
        stack.extend(n for n, _ in node.next_functions)
    return sum(storages.values()), len(visited), len(storages)
