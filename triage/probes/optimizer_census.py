"""Experiments on the live optimizers and modules at the end of a run that did not learn.

In the experiment's child (the user's objects are its own there) each takes a
census and then acts once, as the fix would, to see the cause at work:

- optimizer_stepped: has each optimizer ever stepped? Optimizers that keep
  per-parameter state (Adam's moments and step count, SGD's momentum) create it
  at their first step(); one step in the experiment shows whether this one does.
- optimizer_membership: parameters that have a gradient but sit in no
  optimizer's param_groups; one optimizer.step() shows which tensors it moves.
- requires_grad_flags: modules with `requires_grad` set as a plain attribute
  instead of on their parameters; with `requires_grad_(value)` applied, does a
  replay of the last step give their parameters gradients?
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..diagnosis import ProbeResult
from ..live_objects import live_objects
from ._support import Unavailable, exception_line, result
from .context import ProbeContext
from .step_measures import last_step, replay_backward, script_prefix, shown

def _optimizers(ctx: ProbeContext) -> list[torch.optim.Optimizer]:
    """The run's optimizer, else every live one (an optimizer that never stepped is unknown to the Tracker)."""
    if ctx.optimizer is not None:
        return [ctx.optimizer]
    return live_objects(torch.optim.Optimizer)


def _label(optimizer: torch.optim.Optimizer) -> str:
    tensors = sum(len(g["params"]) for g in optimizer.param_groups)
    return f"{type(optimizer).__name__} over {tensors} tensors"


def _fill_gradients(ctx: ProbeContext, params: list[torch.Tensor]) -> str:
    """Give `params` gradients from a replay of the last step when none has one (zero_grad(set_to_none) after the
    last step); returns what was done, '' when they had gradients already."""
    if any(p.grad is not None for p in params):
        return ""
    try:
        replay_backward(last_step(ctx))
    except Unavailable as exc:
        raise Unavailable(f"the parameters have no gradient at the end of the run, and {exc}") from None
    return " (gradients from a replay of the last step)"


# ---------------------------------------------------------------------------- optimizer_stepped


def optimizer_stepped(ctx: ProbeContext) -> ProbeResult:
    """Read each optimizer's per-parameter state; where it is empty, step once to see whether a step creates it."""
    name = "optimizer_stepped"
    optimizers = [o for o in _optimizers(ctx) if any(g["params"] for g in o.param_groups)]
    if not optimizers:
        return result(name, "skipped", "no live optimizer holds any parameter")
    stepped, never, stateless = [], [], []
    for optimizer in optimizers:
        state = [s for s in optimizer.state.values() if s]
        if state:
            counts = [int(s["step"]) for s in state if isinstance(s.get("step"), (int, float, torch.Tensor))]
            stepped.append(f"{_label(optimizer)} holds state for {len(state)} tensors" +
                           (f" after {max(counts)} steps" if counts else ""))
            continue
        params = [p for g in optimizer.param_groups for p in g["params"]]
        try:
            note = _fill_gradients(ctx, params)
        except Unavailable as exc:
            return result(name, "skipped", str(exc))
        before = [p.detach().clone() for p in params]
        try:
            optimizer.step()
        except Exception as exc:
            return result(name, "inconclusive", f"one {type(optimizer).__name__}.step() in the experiment raised "
                          f"{exception_line(exc)}")
        moved = sum(1 for p, b in zip(params, before) if not torch.equal(p.detach(), b))
        created = sum(1 for s in optimizer.state.values() if s)
        if created:
            never.append(f"{_label(optimizer)} has no per-parameter state, which its first step() creates (one step in "
                         f"the experiment created it for {created} tensors and moved {moved}{note})")
        else:
            stateless.append(type(optimizer).__name__)
    facts = {"stepped": stepped, "never_stepped": never, "stateless": stateless}
    if stepped:
        return result(name, "refuted", f"{'; '.join(stepped)}: the optimizer did step", **facts)
    if never:
        return result(name, "confirmed", f"{'; '.join(never)}: it never stepped during the run", **facts)
    return result(name, "inconclusive", f"{', '.join(stateless)} keeps no per-parameter state (no momentum), so its "
                  "state cannot tell whether it ever stepped", **facts)


# ---------------------------------------------------------------------------- optimizer_membership


def optimizer_membership(ctx: ProbeContext) -> ProbeResult:
    """Census: the model's parameters with a gradient that no optimizer holds; then one step shows what moves."""
    name = "optimizer_membership"
    model = ctx.model
    if not isinstance(model, nn.Module):
        return result(name, "skipped", "no live model")
    optimizers = [o for o in _optimizers(ctx) if any(g["params"] for g in o.param_groups)]
    if not optimizers:
        return result(name, "skipped", "no live optimizer holds any parameter")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    try:
        note = _fill_gradients(ctx, [p for _, p in named])
    except Unavailable as exc:
        return result(name, "skipped", str(exc))
    prefix = script_prefix(model)
    held = {id(p) for o in optimizers for g in o.param_groups for p in g["params"]}
    outside = [(n, p) for n, p in named if id(p) not in held and p.grad is not None and bool(p.grad.any())]
    model_ids = {id(p) for p in model.parameters()}
    stale = [tuple(p.shape) for o in optimizers for g in o.param_groups for p in g["params"] if id(p) not in model_ids]
    labels = ", ".join(_label(o) for o in optimizers)
    facts: dict[str, Any] = {"outside": [n for n, _ in outside], "optimizers": labels,
                             "not_in_model": [list(s) for s in stale]}
    if not outside:
        return result(name, "refuted", f"every parameter of {type(model).__name__} with a non-zero gradient{note} is "
                      f"in a param group of {labels}", **facts)
    outside_names = shown([n for n, _ in outside], prefix)
    before = {id(p): p.detach().clone() for o in optimizers for g in o.param_groups for p in g["params"]}
    before.update({id(p): p.detach().clone() for _, p in outside})
    try:
        for optimizer in optimizers:
            optimizer.step()
    except Exception as exc:
        return result(name, "inconclusive", f"{outside_names} have gradients but are in no param group; one "
                      f"optimizer step in the experiment raised {exception_line(exc)}", **facts)
    held_params = [p for o in optimizers for g in o.param_groups for p in g["params"]]
    moved = sum(1 for p in held_params if not torch.equal(p.detach(), before[id(p)]))
    unmoved = [n for n, p in outside if torch.equal(p.detach(), before[id(p)])]
    stale_text = (f"; the optimizer holds {len(stale)} tensors no longer in the model ("
                  f"{', '.join(str(list(s)) for s in stale[:4])}): those of a layer replaced after it was built"
                  if stale else "")
    detail = (f"{outside_names} have non-zero gradients{note} but are in no param group of {labels}; "
              f"one step() in the experiment moved {moved} of the {len(held_params)} tensors the optimizers hold and "
              f"left {shown(unmoved, prefix) if unmoved else 'none of them'} unchanged{stale_text}")
    status = "confirmed" if unmoved else "inconclusive"
    return result(name, status, detail, **facts)


# ---------------------------------------------------------------------------- requires_grad_flags


def requires_grad_flags(ctx: ProbeContext) -> ProbeResult:
    """Modules with a plain `requires_grad` attribute that disagrees with their parameters' flags; then the method
    applied and the last step replayed: do those parameters get gradients now?"""
    name = "requires_grad_flags"
    model = ctx.model
    if not isinstance(model, nn.Module):
        return result(name, "skipped", "no live model")
    stray = [(path, module, module.__dict__["requires_grad"]) for path, module in model.named_modules()
             if "requires_grad" in module.__dict__ and isinstance(module.__dict__["requires_grad"], bool)]
    disagree = [(path, module, value) for path, module, value in stray
                if any(p.requires_grad != value for p in module.parameters())]
    facts: dict[str, Any] = {"attributes": [f"{path or type(model).__name__}={value}" for path, _, value in stray]}
    if not disagree:
        said = (f"the plain attributes {', '.join(facts['attributes'])} agree with their parameters' flags" if stray
                else f"no module of {type(model).__name__} has `requires_grad` set as a plain attribute")
        return result(name, "refuted", said, **facts)
    path, module, value = disagree[0]
    prefix = script_prefix(model)
    label = prefix + path if path else prefix.rstrip(".") or type(model).__name__
    params = [(f"{path}.{n}" if path else n, p) for n, p in module.named_parameters()]
    flags = sum(1 for _, p in params if p.requires_grad)
    disagreeing = len(params) - flags if value else flags
    census = (f"module {label} has a plain attribute requires_grad={value}, while {disagreeing} of its {len(params)} "
              f"parameters have requires_grad={not value}")
    facts.update({"module": label, "value": value})
    if not value:  # meant to freeze: the fix's replay would only show gradients vanishing
        return result(name, "confirmed", f"{census}: the attribute did not freeze them", **facts)
    module.requires_grad_(True)
    try:
        replay_backward(last_step(ctx))
    except Unavailable as exc:
        return result(name, "inconclusive", f"{census}; {exc}", **facts)
    except Exception as exc:
        return result(name, "inconclusive", f"{census}; replaying the last step with {label}.requires_grad_(True) "
                      f"raised {exception_line(exc)}", **facts)
    got = [n for n, p in params if p.grad is not None and bool(p.grad.any())]
    facts["gradients_after_fix"] = got
    if got:
        return result(name, "confirmed", f"{census}; with {label}.requires_grad_(True) a replay of the last step gives "
                      f"{shown(got, prefix)} non-zero gradients", **facts)
    return result(name, "inconclusive", f"{census}; with {label}.requires_grad_(True) a replay of the last step still "
                  "gives them no gradient: their path to the loss is cut too", **facts)
