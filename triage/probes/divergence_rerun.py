"""divergence_rerun: replay the training loop's step from the first step's weights, as run and with a smaller update.

A loss that diverged is explained by the size of the updates: a learning rate too high, or gradients that
exploded with nothing to clip them. This experiment tests that in an experiment's child: it restores the
weights the run had before its first update (kept by loss_watch), resets the optimizer's state, and runs the
user's own loop body again several times on the failing iteration's batch: once as the script ran it, then with
the learning rate divided by 10, 100, ... until the loss settles, and, where the gradients grew before the loss did, once with
`clip_grad_norm_(..., 0.25)` (the clip of pytorch/examples' RNNs) after each backward. The hypothesis is confirmed when the replay as run diverges
again and the smaller update does not.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..diagnosis import ProbeResult
from ._support import Unavailable, result
from . import source_step
from .context import ProbeContext
from .nonfinite import compile_step, parse_scope, runnable

NAME = "divergence_rerun"
MAX_STEPS = 12
GREW = 10.0  # a replay whose loss grows this much (or turns non-finite) diverged again...
SETTLED = 2.0  # ...and one that ends within this multiple of its first loss was stopped
CLIP_NORM = 0.25
MAX_LR_DIVISOR_EXPONENT = 7  # learning rates down to lr / 1e7 are tried, until one stops the divergence


def divergence_rerun(ctx: ProbeContext) -> ProbeResult:
    from .. import loss_watch
    from .runner import run_isolated

    trend = loss_watch.TREND
    facts = ctx.incident.facts.get("loss_trend") or {}
    if not facts.get("diverged"):
        return result(NAME, "skipped", "the run's loss trend shows no divergence to replay")
    if trend is None or not trend.initial:
        return result(NAME, "skipped", "the weights of the first step were not kept (no loss trend under this run, "
                                       f"or a model over {loss_watch.MAX_INITIAL_BYTES >> 20} MB)")
    frames = ctx.frames or (source_step.user_frames(ctx.exception) if ctx.exception is not None
                            else source_step.user_frames(None))
    try:
        step = loop_body(frames)
    except Unavailable as exc:
        return result(NAME, "skipped", str(exc))
    steps = min(MAX_STEPS, max(3, int(facts.get("peak_at") or 3)))
    variants = [("as run", 1.0, False)]
    if facts.get("gradient_led") and not facts.get("clip_calls"):
        variants.append(("clipped at norm 0.25", 1.0, True))
    variants += [(f"lr / {10 ** n:g}", 10.0 ** -n, False) for n in range(1, MAX_LR_DIVISOR_EXPONENT + 1)]
    outcome = run_isolated(lambda: _compare(step, trend.initial, facts, variants, steps), ctx, ctx.time_limit_s)
    runs = outcome.value if isinstance(outcome.value, dict) else None
    if runs is None:
        return result(NAME, "error", outcome.reason or outcome.error or "the replay returned nothing")
    return _verdict(runs, step.where, steps)


def loop_body(frames: list[tuple[Any, int]]) -> source_step.SourceStep:
    """The body of the innermost loop around a user frame's line, from its first to its last statement that touches
    a model, an optimizer or a user function: one training step, update included, to run several times (the
    logging after it reads accumulators that the replays would only corrupt)."""
    for frame, line in reversed(frames):
        try:
            scope = parse_scope(frame)
        except Unavailable:
            continue
        loop = source_step._innermost_loop(scope, line)
        if loop is None:
            continue
        values = source_step._frame_values(frame)
        touching = [i for i, stmt in enumerate(loop.body) if source_step._touches_step(stmt, values)]
        statements = loop.body[touching[0]:touching[-1] + 1] if touching else []
        if statements and runnable(statements):
            return compile_step(frame, statements)
    raise Unavailable("no loop of the user's code around the failure to replay the training step from")


def _compare(step: source_step.SourceStep, initial: list, facts: dict, variants: list, steps: int) -> dict:
    """In the child: each variant's losses over `steps` replays of the loop body from the first step's weights."""
    namespace = {**step.frame.f_globals, **step.frame.f_locals}
    optimizers = [value for value in namespace.values() if isinstance(value, torch.optim.Optimizer)]
    rates = [[group["lr"] for group in opt.param_groups] for opt in optimizers]
    script_lr = next((name for name in ("lr", "learning_rate") if isinstance(namespace.get(name), (int, float))
                      and str(facts.get("lr_source", "")).startswith("the script's")), None)
    params = [ref() for ref, _ in initial]
    losses: list[float] = []
    clip = [False]
    original = torch.autograd.backward

    def backward(tensors, *args, **kwargs):
        loss = tensors[0] if isinstance(tensors, (tuple, list)) else tensors
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            losses.append(float(loss.detach()))
        out = original(tensors, *args, **kwargs)
        if clip[0]:
            torch.nn.utils.clip_grad_norm_([p for p in params if p is not None], CLIP_NORM)
        return out

    torch.autograd.backward = backward
    runs: dict[str, dict[str, Any]] = {}
    for label, scale, clipped in variants:
        with torch.no_grad():
            for (ref, value), param in zip(initial, params):
                if param is not None:
                    param.copy_(value)
                    param.grad = None
        for opt, group_rates in zip(optimizers, rates):
            opt.state.clear()
            for group, rate in zip(opt.param_groups, group_rates):
                group["lr"] = rate * scale
        if script_lr is not None:
            namespace[script_lr] = float(step.frame.f_globals.get(script_lr, facts.get("lr", 0))) * scale
        clip[0] = clipped
        losses.clear()
        error = ""
        try:
            for _ in range(steps):
                step.run(namespace)
        except Exception as exc:  # a diverged replay may crash as the run did
            error = f"{type(exc).__name__}"
        runs[label] = {"losses": list(losses), "error": error, "scale": scale}
        if scale < 1.0 and _settled(runs[label]):
            break  # the largest smaller learning rate that stops it is the answer
    torch.autograd.backward = original
    return runs


def _diverged(losses: list[float], error: str) -> bool:
    finite = [abs(v) for v in losses if math.isfinite(v)]
    return bool(error) or len(finite) < len(losses) or (len(finite) >= 2 and finite[0] > 0 and max(finite) / finite[0] >= GREW)


def _settled(run: dict[str, Any]) -> bool:
    losses = run["losses"]
    return (len(losses) >= 2 and not _diverged(losses, run["error"])
            and abs(losses[-1]) <= SETTLED * abs(losses[0]))


def _trace(run: dict[str, Any]) -> str:
    values = run["losses"]
    shown = [values[0], max(values, key=lambda v: abs(v) if math.isfinite(v) else math.inf), values[-1]] if values else []
    text = " -> ".join(f"{v:.3g}" for v in shown) if shown else "no loss"
    return text + (f", then {run['error']}" if run["error"] else "")


def _verdict(runs: dict[str, dict[str, Any]], where: str, steps: int) -> ProbeResult:
    base = runs["as run"]
    clipped = runs.get("clipped at norm 0.25")
    again = _diverged(base["losses"], base["error"])
    stopping = next((label for label, run in runs.items() if run["scale"] < 1.0 and _settled(run)), None)
    lower_stops = stopping is not None
    clip_stops = clipped is not None and _settled(clipped)
    shown = [label for label in runs if label in ("as run", "clipped at norm 0.25", stopping)] or list(runs)
    tried = len([label for label in runs if runs[label]["scale"] < 1.0])
    detail = (f"replayed {where} {steps} times on the failing batch from the first step's weights: "
              + "; ".join(f"{label} {_trace(runs[label])}" for label in shown)
              + (f" ({tried} smaller learning rates tried)" if tried > 1 else ""))
    facts = {"diverged_again": again, "lower_lr_stops": lower_stops, "clip_stops": clip_stops,
             "stopped_by": "clipping" if clip_stops else stopping, "as_run": base["losses"]}
    if not again:
        return result(NAME, "inconclusive", f"{detail}: the replay on one batch does not diverge", **facts)
    if lower_stops or clip_stops:
        return result(NAME, "confirmed", f"{detail}: {facts['stopped_by']} stops the divergence", **facts)
    return result(NAME, "refuted", f"{detail}: it diverges with the smaller update too", **facts)
