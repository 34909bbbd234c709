"""Run the probes the diagnoses name, each in a disposable child under a time limit, and re-rank the diagnoses.

`context_from_failure` builds the ProbeContext from an exception and the live
Tracker; `run_probes` fills each diagnosis's `probes` and moves confirmed
hypotheses up and refuted ones down. A probe that runs user code runs in a
child forked at the failure (sandbox.py), so nothing it does reaches the
user's objects, files or exit status. Nothing a probe does escapes as an
exception: a probe that raises, cannot be loaded or runs out of time is a
result with status `error`; one that runs out of memory is `inconclusive`.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ..diagnosis import PROBE_STATUSES, Diagnosis, ProbeResult
from ..incident import Incident
from . import PROBES
from ._support import loader_from_traceback
from .context import ProbeContext

# Probes that record something (an artifact) rather than test the hypothesis: they do not move ranks.
NEUTRAL = frozenset({"save_batch"})


def run_probes(diagnoses: list[Diagnosis], ctx: ProbeContext, *,
               on_result: Callable[[], None] | None = None) -> None:
    """Run every probe each diagnosis names (once per probe and hypothesis), then re-rank `diagnoses` in place.

    `on_result` is called after each result is recorded (to rewrite the report as the experiments go)."""
    start = time.monotonic()
    done: dict[tuple, ProbeResult] = {}
    for diagnosis in diagnoses:
        for name in diagnosis.probe_names:
            key = (name, diagnosis.category, _values_key(diagnosis.values))
            if key in done:
                diagnosis.probes.append(dataclasses.replace(done[key]))
            else:
                remaining = ctx.total_time_s - (time.monotonic() - start)
                if remaining <= 0.05:
                    outcome = ProbeResult(name, "skipped", f"the probes' time budget of {ctx.total_time_s:g} s is spent")
                else:
                    outcome = run_probe(name, dataclasses.replace(ctx, diagnosis=diagnosis),
                                        min(ctx.time_limit_s, remaining))
                done[key] = outcome
                diagnosis.probes.append(outcome)
            if on_result is not None:
                on_result()
    rerank(diagnoses)


def _values_key(values: dict[str, Any]) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in values.items() if isinstance(v, (str, int, float, bool))))


def verdict(diagnosis: Diagnosis) -> str | None:
    """'confirmed' or 'refuted' when the probes agree on one, else None."""
    statuses = {p.status for p in diagnosis.probes if p.name not in NEUTRAL}
    if "confirmed" in statuses and "refuted" not in statuses:
        return "confirmed"
    if "refuted" in statuses and "confirmed" not in statuses:
        return "refuted"
    return None


# What a confirming experiment adds to a hypothesis's confidence. It is evidence, not a trump:
# a probe often confirms a fact several hypotheses share (the worker's exception reproduces in
# the main process), so a confirmed hypothesis overtakes only those close to it in confidence.
CONFIRMED_BOOST = 0.1


def rerank(diagnoses: list[Diagnosis]) -> None:
    """Refuted hypotheses give up their rank; confirmed ones rank as if more confident; ties keep the matcher's order."""

    def weight(diagnosis: Diagnosis) -> tuple[bool, float]:
        outcome = verdict(diagnosis)
        boost = CONFIRMED_BOOST if outcome == "confirmed" else 0.0
        return outcome == "refuted", -round(min(0.99, diagnosis.confidence + boost), 6)

    diagnoses.sort(key=weight)


# Probes that call no user code run in this process: they read metadata, the CUDA allocator's counters (which a
# forked child cannot read) or write the batch into the report folder. Every other probe, custom ones included,
# runs in a disposable child (sandbox.py).
IN_PROCESS = frozenset({"save_batch", "device_census", "dtype_census", "memory_breakdown", "backend_census"})


def run_probe(name: str, ctx: ProbeContext, limit_s: float) -> ProbeResult:
    """One probe, in a disposable child under a time limit (or here, for IN_PROCESS); whatever happens, a ProbeResult."""
    from . import sandbox

    started = time.monotonic()
    try:
        function = load(name)
    except Exception as exc:
        return ProbeResult(name, "error", f"cannot load the probe: {type(exc).__name__}: {exc}",
                           seconds=time.monotonic() - started)
    if name in IN_PROCESS:
        outcome = sandbox.call_here(lambda: function(ctx))
    else:
        outcome = run_isolated(lambda: function(ctx), ctx, limit_s)
    return _result(name, outcome, limit_s)


def run_isolated(fn: Callable[[], Any], ctx: ProbeContext, limit_s: float) -> Any:
    """fn() in a disposable child (sandbox.Outcome), with the context's CUDA tensors copied to the host first:
    CUDA cannot be used in a forked child. The report folder is the one place outside its own it may write."""
    from . import sandbox
    from ._support import cuda_poisoned, host_copies

    if not sandbox.fork_available():
        return sandbox.run(fn, limit_s)  # says why not
    allowed = [str(ctx.report_dir)] if ctx.report_dir is not None else []
    if ctx.report_dir is not None:
        try:
            Path(ctx.report_dir).mkdir(parents=True, exist_ok=True)
        except OSError:
            allowed = []
    with host_copies(ctx, cuda_poisoned(ctx)):
        return sandbox.run(lambda: _quietly(fn, ctx), limit_s, allowed=allowed)


def _quietly(fn: Callable[[], Any], ctx: ProbeContext) -> Any:
    """In the child: triage's own hooks and the Tracker's listeners (the heartbeat is shared memory) stay out of it."""
    from ..tracking import TRACKER

    TRACKER.suspended += 1
    TRACKER.listeners = []
    for owner in (ctx.model, ctx.module, ctx.loss_fn):
        for module in owner.modules() if hasattr(owner, "modules") and callable(owner.modules) else ():
            for hooks in (getattr(module, "_forward_pre_hooks", {}), getattr(module, "_forward_hooks", {})):
                for key in [k for k, h in hooks.items() if getattr(h, "_triage_hook", False)]:
                    del hooks[key]
    return fn()


def _result(name: str, outcome: Any, limit_s: float) -> ProbeResult:
    """A sandbox.Outcome as the probe's result."""
    from ._support import innermost_user_frame, where

    if outcome.stopped == "time":
        frame = innermost_user_frame(outcome.stack) or (outcome.stack[-1] if outcome.stack else None)
        at = f" (it was at {where(frame)})" if frame else ""
        return ProbeResult(name, "error", f"stopped at its time limit of {limit_s:.3g} s{at}", seconds=outcome.seconds)
    if outcome.stopped == "unavailable":  # (an experiment that reached CUDA it could not use says where)
        frame = innermost_user_frame(outcome.stack)
        at = f" (at {where(frame)})" if frame else ""
        return ProbeResult(name, "skipped", f"{outcome.reason}{at}", seconds=outcome.seconds)
    if outcome.stopped is not None:
        status = "inconclusive" if outcome.stopped == "memory" else "error"
        return ProbeResult(name, status, outcome.reason, seconds=outcome.seconds)
    if outcome.error is not None:
        facts = {"traceback": outcome.error_traceback[-4000:]} if os.environ.get("TRIAGE_DEBUG") else {}
        return ProbeResult(name, "error", f"the probe failed: {outcome.error}", facts=facts, seconds=outcome.seconds)
    value = outcome.value
    if not isinstance(value, ProbeResult) or value.status not in PROBE_STATUSES:
        return ProbeResult(name, "error", f"the probe returned {type(value).__name__}, not a ProbeResult with a "
                           f"status in {PROBE_STATUSES}", seconds=outcome.seconds)
    value.seconds = outcome.seconds
    value.name = value.name or name
    if outcome.redirected:
        value.facts["writes_kept_in_the_experiment"] = outcome.redirected[:20]
    if outcome.refused:
        value.facts["refused"] = outcome.refused[:20]
        if value.status not in ("confirmed", "refuted") and "triage's experiment refused" not in value.detail:
            value.detail += f" (the experiment was not allowed to {'; '.join(outcome.refused[:3])})"
    return value


def load(name: str) -> Callable[[ProbeContext], ProbeResult]:
    """The function behind a probe name (built-in, or custom where the registry supports it)."""
    from .. import probes as registry

    loader = getattr(registry, "load_probe", None)
    if loader is not None:
        return loader(name)
    target = PROBES.get(name)
    if target is None:
        raise LookupError(f"unknown probe '{name}'")
    module_name, _, function_name = target.partition(":")
    return getattr(importlib.import_module(module_name), function_name)


def context_from_failure(incident: Incident, exception: BaseException | None = None, report_dir: str | Path | None = None,
                         tracker: Any = None, time_limit_s: float = 60.0, total_time_s: float = 120.0,
                         script: str | None = None, script_args: list[str] | None = None) -> ProbeContext:
    """A ProbeContext from the exception's traceback and the live Tracker.

    The traceback's innermost module call is the failing layer; its outermost
    the model's call (with the arguments it really got). The Tracker adds what the
    traceback cannot show: the batch, the step, the optimizer, the loader and the
    loss function (and the model, for an exception raised outside its forward).
    """
    from ..tracking import TRACKER
    from .calls import failing_calls, is_loss, recorded_loss_call, recorded_model_call
    from .source_step import user_frames

    tracker = TRACKER if tracker is None else tracker
    outer, inner = failing_calls(exception)
    ctx = ProbeContext(incident=incident, report_dir=Path(report_dir) if report_dir is not None else None,
                       exception=exception, batch=tracker.batch, batch_index=tracker.batch_index, step=tracker.steps,
                       loader=tracker.loader if tracker.loader is not None else loader_from_traceback(exception),
                       optimizer=tracker.optimizer,
                       loss_fn=tracker.loss_fn, time_limit_s=time_limit_s, total_time_s=total_time_s,
                       script=script, script_args=list(script_args or []), frames=user_frames(exception))
    model = tracker.model
    outer_is_loss = outer is not None and (outer.module is tracker.loss_fn or is_loss(outer.module))
    in_model = outer is not None and not outer_is_loss
    if model is None and in_model:
        model = outer.module
    recorded, unreplayable = None, ""
    if not in_model:  # failed after the model returned: the runner recorded the model's call
        recorded, unreplayable = recorded_model_call(tracker, exception, outer.args if outer_is_loss else ())
        if recorded is not None and model is not None and recorded.module is not model:
            recorded = None
        model = recorded.module if recorded is not None else model
    if model is None and tracker.optimizer is not None:
        model = _model_from_optimizer(tracker.optimizer)
    ctx.model = model
    ctx.calls_recorded = bool(getattr(tracker, "calls_recorded", False))
    ctx.model_call_note = unreplayable
    if in_model and outer.module is model:
        ctx.model_args, ctx.model_kwargs = outer.args, dict(outer.kwargs)
    elif recorded is not None:
        ctx.model_args, ctx.model_kwargs = recorded.args, dict(recorded.kwargs)
    elif tracker.model_call is not None and model is tracker.model:
        ctx.model_args, ctx.model_kwargs = tracker.model_call[0], dict(tracker.model_call[1])
    if outer_is_loss:
        ctx.loss_fn = ctx.loss_fn or outer.module
        ctx.loss_args, ctx.loss_kwargs = outer.args, dict(outer.kwargs)
    elif tracker.loss_call is not None:
        ctx.loss_args, ctx.loss_kwargs = tracker.loss_call[0], dict(tracker.loss_call[1])
    elif (loss := recorded_loss_call(tracker)) is not None and ctx.loss_fn in (None, loss.module):
        ctx.loss_fn, ctx.loss_args, ctx.loss_kwargs = loss.module, loss.args, dict(loss.kwargs)
    if inner is not None:
        ctx.module, ctx.module_args, ctx.module_kwargs = inner.module, inner.args, dict(inner.kwargs)
        if model is not None:
            try:
                ctx.module_name = next((n for n, m in model.named_modules() if m is inner.module), None)
            except Exception:
                ctx.module_name = None
    return ctx


def _model_from_optimizer(optimizer: Any) -> Any:
    """The module that owns most of the optimizer's parameters (found among live objects, once, at a failure)."""
    from torch import nn

    from ..live_objects import live_objects

    try:
        wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
    except Exception:
        return None
    # A module the script binds to a global name (`model = nn.Sequential(...)`) outranks its own layers that own the
    # same parameters (a Linear after parameterless layers), which would otherwise win on having fewer modules.
    main = sys.modules.get("__main__")
    named = {id(value) for value in getattr(main, "__dict__", {}).values() if isinstance(value, nn.Module)}
    best, best_key = None, (0, False, 0)
    for module in live_objects(nn.Module):
        try:
            owned = sum(1 for p in module.parameters() if id(p) in wanted)
        except Exception:
            continue
        key = (owned, id(module) in named, -sum(1 for _ in module.modules()))  # all of them, fewest modules: the model
        if owned and key > best_key:
            best, best_key = module, key
    return best
