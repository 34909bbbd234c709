"""cpu_rerun: replay the failing step on CPU copies, where errors are synchronous and point at their real location.

A CUDA device-side assert is reported at whatever CUDA call came next; on the
CPU the same data raises at once (`IndexError: index out of range in self` at
the embedding). After such an error the model's weights cannot be read, so the
replay uses zeros of the same shapes and the CPU batch the DataLoader yielded;
index and shape errors do not depend on weight values.
"""

from __future__ import annotations

import traceback

import torch

from ..diagnosis import ProbeResult
from ._support import (Unavailable, cuda_poisoned, display_name, exception_line, innermost_user_frame, result,
                       where)
from .calls import module_calls
from .context import ProbeContext
from .step import Call, ModelOutput, Step, call, rebuild

NAME = "cpu_rerun"


def cpu_rerun(ctx: ProbeContext) -> ProbeResult:
    poisoned = cuda_poisoned(ctx)
    try:
        step = rebuild(ctx, poisoned)
    except Unavailable as exc:
        return result(NAME, "skipped", str(exc))
    calls = _order(step, poisoned)
    notes = [n for c in calls for n in c.inputs.notes]
    missing = [m for c in calls for m in c.inputs.missing]
    ran: list[str] = []
    with torch.no_grad():
        output = None
        for c in calls:
            try:
                value = call(c, output) if any(a is ModelOutput for a in c.inputs.args) else call(c)
            except Unavailable as exc:
                notes.append(f"{c.label}: {exc}")
                continue
            except Exception as exc:  # the experiment's finding
                return _raised(ctx, step, c, exc, poisoned, notes, missing, ran)
            ran.append(c.label)
            if c.label == "model":
                output = value
    return _clean(ctx, step, poisoned, ran, notes, missing)


def _order(step: Step, poisoned: bool) -> list[Call]:
    """After an asynchronous CUDA error the reported layer may be innocent: replay the whole step first."""
    whole = [c for c in (step.model_call, step.loss_call) if c is not None]
    failing = [step.failing_call] if step.failing_call is not None else []
    if step.failing_call is not None and step.model_call is not None and step.failing_call.fn is step.model_call.fn:
        failing = []
    return whole + failing if poisoned else failing + whole


def _raised(ctx: ProbeContext, step: Step, c: Call, exc: Exception, poisoned: bool,
            notes: list[str], missing: list[str], ran: list[str]) -> ProbeResult:
    module_path, module_label = _raising_module(step, c, exc)
    frame = innermost_user_frame(traceback.extract_tb(exc.__traceback__))
    line = exception_line(exc)
    at = f", called at {where(frame)}" if frame else ""
    original = ctx.incident.exception
    category = getattr(ctx.diagnosis, "category", None)
    if poisoned:
        status = "confirmed"
        detail = (f"on CPU copies the {c.label} raises {line} in {module_label}{at}: the CUDA error's real "
                  f"location, a synchronous error the GPU could only report later")
    elif original is not None and original.short_type == type(exc).__name__:
        status = "confirmed"
        detail = f"the {c.label} raises the same error on CPU copies: {line} in {module_label}{at}; it is deterministic"
    else:
        status = "inconclusive" if category != "device" else "refuted"
        detail = f"on CPU copies the {c.label} raises a different error, {line} in {module_label}{at}"
    if step.model is not None and not step.model.real_weights:
        detail += f" ({step.model.note})"
    return result(NAME, status, detail, module=module_path, exception=type(exc).__name__,
                  message=str(exc).split("\n", 1)[0][:300], location=where(frame), replayed=ran + [c.label],
                  inputs=notes, missing_inputs=missing)


def _raising_module(step: Step, c: Call, exc: Exception) -> tuple[str, str]:
    """(path, label) of the innermost module whose call raised: `encoder.embed`, `encoder.embed (Embedding)`."""
    calls = module_calls(exc.__traceback__)
    if not calls:
        return c.path, f"the {c.label}"
    innermost = calls[-1].module
    path = step.names.get(id(innermost))
    if path is None:
        path = c.path if innermost is c.fn else ""
        if innermost is not c.fn:
            return path, type(innermost).__name__
    return path, display_name(path, innermost)


def _clean(ctx: ProbeContext, step: Step, poisoned: bool, ran: list[str], notes: list[str],
           missing: list[str]) -> ProbeResult:
    category = getattr(ctx.diagnosis, "category", None)
    what = {("model",): "the model runs", ("model", "loss"): "the model and the loss run",
            ("failing call",): "the failing call runs"}.get(tuple(ran), " and ".join(ran) + " run")
    facts = dict(replayed=ran, inputs=notes, missing_inputs=missing)
    if not ran:
        return result(NAME, "skipped", "; ".join(notes) or "nothing could be replayed", **facts)
    if category == "device":
        return result(NAME, "confirmed", f"with every tensor on the CPU {what} without error: "
                      "the failure comes from where the tensors are, not from their values", **facts)
    if missing:
        return result(NAME, "inconclusive", f"{what} without error on the CPU, but integer inputs "
                      f"{', '.join(missing)} could not be recovered from the device and were zeros", **facts)
    if poisoned:
        return result(NAME, "refuted", f"{what} without error on CPU copies with the failing batch: "
                      "the CUDA error is not in this step's data or indexing", **facts)
    return result(NAME, "inconclusive", f"{what} without error on CPU copies: the failure does not "
                  "reproduce outside the original device and state", **facts)
