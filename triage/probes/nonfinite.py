"""Where a NaN/Inf first appears in a forward pass: run once in a disposable child with a hook on every module.

Used by the wrapper when it turns a non-finite loss or gradient into an
incident: the per-step check is a single scalar, and only this one-off replay
looks inside the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ._support import Unavailable, iter_tensors
from .context import ProbeContext
from .step import ModelOutput, call, rebuild


@dataclass
class NonFiniteTrace:
    """The first module whose output held NaN/Inf, and the parameters that already did."""

    module: str | None = None
    kind: str | None = None  # "nan" or "inf"
    op: str | None = None  # "log at model.py:20: `h = torch.log(h)` produced nan from finite inputs"
    loss: float | None = None  # the loss of the replayed step, when the loss function and targets are known
    parameters: list[str] = field(default_factory=list)
    note: str = ""


def nonfinite_parameters(model: nn.Module, limit: int = 20) -> list[str]:
    """Names of parameters holding NaN/Inf (reads values: only for a usable device)."""
    bad = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.is_floating_point() and not bool(torch.isfinite(param).all()):
                bad.append(name)
                if len(bad) >= limit:
                    break
    return bad


def nonfinite_gradients(model_or_params, limit: int = 20) -> list[str]:
    """Names of parameters whose .grad holds NaN/Inf."""
    named = (model_or_params.named_parameters() if isinstance(model_or_params, nn.Module)
             else ((f"param{i}", p) for i, p in enumerate(model_or_params)))
    bad = []
    with torch.no_grad():
        for name, param in named:
            grad = param.grad
            if grad is not None and grad.is_floating_point() and not bool(torch.isfinite(grad).all()):
                bad.append(name)
                if len(bad) >= limit:
                    break
    return bad


def trace_forward(ctx: ProbeContext) -> NonFiniteTrace:
    """Replay the model's last call in an experiment's child and name the first module whose output is not finite."""
    from .runner import run_isolated

    if not isinstance(ctx.model, nn.Module):
        return NonFiniteTrace(note="no model to trace")
    parameters = nonfinite_parameters(ctx.model)
    outcome = run_isolated(lambda: _trace_forward(ctx), ctx, ctx.time_limit_s)
    found = outcome.value if isinstance(outcome.value, NonFiniteTrace) else NonFiniteTrace(
        note=outcome.reason or outcome.error or "the replay returned nothing")
    found.parameters = parameters
    return found


def _trace_forward(ctx: ProbeContext) -> NonFiniteTrace:
    found = NonFiniteTrace()
    try:
        step = rebuild(ctx, poisoned=False, with_failing=False)
    except Unavailable as exc:
        found.note = str(exc)
        return found
    if step.model_call is None:
        found.note = "the model's inputs are unknown"
        return found
    names = step.names

    def hook(module, args, output):
        if found.module is not None:
            return
        for _, tensor in iter_tensors(output):
            if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(tensor).all()):
                path = names.get(id(module), "")
                found.module = f"{path} ({type(module).__name__})" if path else type(module).__name__
                found.kind = "nan" if bool(torch.isnan(tensor).any()) else "inf"
                return

    from .anomaly_rerun import OpLog

    handles = [m.register_forward_hook(hook) for m in step.model.module.modules()]
    log = OpLog()
    try:
        with torch.no_grad(), log:
            output = call(step.model_call)
            if step.loss_call is not None:
                loss = call(step.loss_call, output if any(a is ModelOutput for a in step.loss_call.inputs.args)
                            else None)
                if isinstance(loss, torch.Tensor) and loss.numel() == 1:
                    found.loss = float(loss)
    except Exception as exc:  # a replay that fails tells nothing about where NaN starts
        found.note = f"the replay raised {type(exc).__name__}"
    finally:
        for handle in handles:
            handle.remove()
    found.op = log.first_nonfinite
    return found

