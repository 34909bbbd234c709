"""lr_replay: a few optimizer steps on the last batch, at the run's learning rate and at a tenth of it.

A loss that grows step after step is overshooting, when the learning rate is
too large for the curvature the inputs give the loss, or it grows for another
reason (gradients that pile up, a wrong sign, data that shifts). From the
weights and optimizer state the run ended with, the probe takes STEPS steps on
the model's last recorded batch (zero_grad, forward, the step's loss, backward,
step: a correct loop), once at the learning rate of each param group and once
at a tenth of it, each from the same starting state. The learning rate is the
cause when the loss grows at the run's rate and stops growing at a tenth; if it
grows at a tenth as well, the learning rate alone is not the cause.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch

from ..diagnosis import ProbeResult
from ..live_objects import live_objects
from ._support import Unavailable, exception_line, result
from .context import ProbeContext
from .step import Step, call, first_tensor
from .step_measures import last_step

NAME = "lr_replay"
STEPS = 5
SCALE = 0.1
GROWS = 1.01  # the loss after STEPS steps above this multiple of the first: it grows


def lr_replay(ctx: ProbeContext) -> ProbeResult:
    try:
        step = last_step(ctx)
    except Unavailable as exc:
        return result(NAME, "skipped", str(exc))
    if step.loss_call is None:
        return result(NAME, "skipped", "the loss was not computed by a module the runner saw called, so the step "
                      "cannot be replayed with its own loss")
    model = step.model.module
    optimizer = _optimizer(ctx, model)
    if optimizer is None:
        return result(NAME, "skipped", f"no live optimizer holds the parameters of {type(model).__name__}")
    rates = [_float(g.get("lr")) for g in optimizer.param_groups]
    if not rates or any(r is None or r <= 0 for r in rates):
        return result(NAME, "skipped", f"{type(optimizer).__name__} has no positive learning rate to scale")
    weights = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
    state = copy.deepcopy(optimizer.state_dict())
    try:
        at_rate = _run(step, optimizer, weights, state, 1.0)
        at_tenth = _run(step, optimizer, weights, state, SCALE)
    except Unavailable as exc:
        return result(NAME, "skipped", str(exc))
    except Exception as exc:
        return result(NAME, "inconclusive", f"replaying {STEPS} steps raised {exception_line(exc)}")
    lr = ", ".join(f"{r:.3g}" for r in dict.fromkeys(rates))
    lr_tenth = ", ".join(f"{r * SCALE:.3g}" for r in dict.fromkeys(rates))
    facts: dict[str, Any] = {"lr": rates, "losses": at_rate, "losses_lr_tenth": at_tenth, "steps": STEPS}
    measured = (f"{STEPS} {type(optimizer).__name__} steps on the last batch from the weights the run ended with: at "
                f"lr={lr} the loss goes {_trend(at_rate)}; at lr={lr_tenth} it goes {_trend(at_tenth)}")
    if not _grows(at_rate):
        return result(NAME, "inconclusive", f"{measured}: on this batch the loss does not grow at the run's rate",
                      **facts)
    if not _grows(at_tenth):
        return result(NAME, "confirmed", f"{measured}: the step size makes the loss diverge", **facts)
    return result(NAME, "refuted", f"{measured}: it grows at a tenth of the learning rate too, so the learning rate "
                  "alone does not explain it", **facts)


def _optimizer(ctx: ProbeContext, model: torch.nn.Module) -> Any:
    params = {id(p) for p in model.parameters()}
    candidates = [ctx.optimizer] if ctx.optimizer is not None else live_objects(torch.optim.Optimizer)
    for optimizer in candidates:
        if any(id(p) in params for g in optimizer.param_groups for p in g["params"]):
            return optimizer
    return None


def _float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _run(step: Step, optimizer: Any, weights: dict[str, torch.Tensor], state: dict, scale: float) -> list[float]:
    """The loss before each of STEPS correct steps and after the last, from the same weights and optimizer state."""
    model = step.model.module
    with torch.no_grad():
        for key, value in model.state_dict(keep_vars=True).items():
            value.copy_(weights[key])
    optimizer.load_state_dict(copy.deepcopy(state))
    for group in optimizer.param_groups:
        lr = group["lr"]
        group["lr"] = lr * scale if not isinstance(lr, torch.Tensor) else lr.mul(scale)
    losses = []
    for index in range(STEPS + 1):
        optimizer.zero_grad()
        with torch.enable_grad():
            loss = first_tensor(call(step.loss_call, call(step.model_call)))
        if loss is None or loss.numel() != 1:
            raise Unavailable("the step's loss is not a scalar")
        value = float(loss.detach())
        losses.append(value)
        if index == STEPS or not math.isfinite(value):
            break
        loss.backward()
        optimizer.step()
    return losses


def _grows(losses: list[float]) -> bool:
    return not math.isfinite(losses[-1]) or losses[-1] > GROWS * losses[0]


def _trend(losses: list[float]) -> str:
    return f"{losses[0]:.4g} → {losses[-1]:.4g}"
