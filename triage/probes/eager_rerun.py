"""eager_rerun: replay the failing step with torch.compile switched off, to tell a compiler failure from a model bug.

A failure raised while Dynamo traces or Inductor compiles says little about the
model: the same step may run eagerly (the compiler's limitation: a graph break
under fullgraph=True, an unsupported call, a backend error) or fail eagerly too
(a bug in the model that compiling merely surfaced first). The experiment's child
sets `torch.compiler.set_stance("force_eager")`, which makes every compiled
function and module run its original code, and replays the step: the model's
recorded call (and the loss), else the failing loop's own statements.
"""

from __future__ import annotations

import torch

from ..diagnosis import ProbeResult
from . import source_step
from ._support import Unavailable, exception_line, result
from .context import ProbeContext
from .step import ModelOutput, call, rebuild

NAME = "eager_rerun"


def eager_rerun(ctx: ProbeContext) -> ProbeResult:
    original = ctx.incident.exception
    if original is None:
        return result(NAME, "skipped", "no exception to compare the eager run with")
    try:
        _force_eager()
    except Unavailable as exc:
        return result(NAME, "skipped", str(exc))
    try:
        ran = _replay(ctx)
    except Unavailable as exc:
        return result(NAME, "skipped", str(exc))
    except Exception as exc:  # the experiment's finding: eager fails too, and its error is the one to fix
        line = exception_line(exc)
        return result(NAME, "refuted", f"without torch.compile the step fails too, with {line}: the bug is in the "
                      "model or the step (compiling only surfaced it first, in the compiler's words)",
                      eager_error=line, eager_error_type=type(exc).__name__)
    return result(NAME, "confirmed", f"with torch.compile switched off ({ran}) the step runs without error: the "
                  "failure is the compiler's, not the model's", eager="ran", replayed=ran)


def _force_eager() -> None:
    """Every compiled function and module runs its original code from now on (this process is the child's)."""
    set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    if set_stance is not None:
        set_stance("force_eager")
        return
    try:
        from torch import _dynamo
    except ImportError as exc:  # a build without Dynamo cannot have compiled anything
        raise Unavailable(f"torch._dynamo is not available: {exc}") from None
    _dynamo.config.disable = True


def _replay(ctx: ProbeContext) -> str:
    """Run the step eagerly; what it raises propagates. Returns what ran."""
    try:
        step = rebuild(ctx, poisoned=False, with_failing=False)
    except Unavailable as rebuilt_not:
        source = _source_step(ctx, str(rebuilt_not))
        namespace, _modules = source.namespace()
        source.run(namespace)
        return f"the statements at {source.where} replayed"
    output = call(step.model_call)
    if step.loss_call is not None:
        args = step.loss_call.inputs.args
        loss = call(step.loss_call, output) if any(a is ModelOutput for a in args) else call(step.loss_call)
        if isinstance(loss, torch.Tensor) and loss.requires_grad and loss.numel() == 1:
            loss.backward()
        return "the model, the loss and backward replayed"
    return "the model's call replayed"


def _source_step(ctx: ProbeContext, why_not_rebuilt: str) -> source_step.SourceStep:
    try:
        return source_step.find(ctx.frames)
    except Unavailable as exc:
        raise Unavailable(f"{why_not_rebuilt}; {exc}") from None
