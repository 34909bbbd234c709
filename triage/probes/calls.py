"""The nn.Module calls a failure belongs to: those running when it was raised, read from its traceback, and the
model's own call, recorded by the runner, when the failure came after it returned.

torch's `Module._call_impl(self, *args, **kwargs)` frame keeps the exact
arguments a module was called with (the user's `forward` may have reassigned
its own parameter names since), so the traceback alone is enough to re-run the
failing layer (the innermost call) or the whole model (the outermost one).
A failure in the loss, in backward() or in the loop's own code holds no model
call; the runner records every outermost module call (runner/hooks.py), and
`recorded_model_call` picks the one the failure belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from ..incident import is_user_path


@dataclass
class ModuleCall:
    """One module call on the failing stack."""

    module: Any
    args: tuple
    kwargs: dict[str, Any] = field(default_factory=dict)


def _is_call_impl(frame) -> bool:
    code = frame.f_code
    return code.co_name == "_call_impl" and code.co_filename.replace("\\", "/").endswith("torch/nn/modules/module.py")


def module_calls(tb: TracebackType | None) -> list[ModuleCall]:
    """Module calls on the traceback, outermost first (the model), innermost last (the failing layer)."""
    calls: list[ModuleCall] = []
    while tb is not None:
        frame = tb.tb_frame
        if _is_call_impl(frame):
            local = frame.f_locals
            module = local.get("self")
            args = local.get("args", ())
            kwargs = local.get("kwargs", {})
            if module is not None and isinstance(args, tuple) and isinstance(kwargs, dict):
                calls.append(ModuleCall(module, args, dict(kwargs)))
        tb = tb.tb_next
    return calls


def failing_calls(exc: BaseException | None) -> tuple[ModuleCall | None, ModuleCall | None]:
    """(outermost, innermost) module calls of an exception's traceback, or None for each when there are none."""
    if exc is None:
        return None, None
    calls = module_calls(exc.__traceback__)
    if not calls:
        return None, None
    return calls[0], calls[-1]


def is_loss(module: Any) -> bool:
    """A loss module (`nn.CrossEntropyLoss`, a user's `FocalLoss`): called like a model, never the model."""
    return any(cls.__name__ == "_Loss" for cls in type(module).__mro__) or type(module).__name__.endswith("Loss")


def recorded_model_call(tracker: Any, exc: BaseException | None, given: tuple = ()) -> tuple[ModuleCall | None, str]:
    """The model call a failure outside every model's forward belongs to, from the tracker's recorded outermost
    calls, and why there is none ('' when there is one, or when nothing was recorded).

    The model whose output the failing call was given (`given`, e.g. the loss module's arguments, or the
    arguments of the torch function the user's line called, read from the traceback) comes first: in a GAN
    that tells the discriminator's output from the generator's. Otherwise the latest model called, unless its
    input is another recorded call's output (`head(blocks(embed(tokens)))`), other modules were called in the
    same step (a teacher and a student), it was called several times in the step (a siamese encoder) or the
    loss was computed by plain code (no loss module was called): no one recorded call replays the step, and
    picking one would test the wrong code. With no exception (a silent failure) the latest model call is it.
    """
    calls = [c for c in tracker.latest_calls() if not is_loss(c.module)] if tracker is not None else []
    if not calls:
        return None, ""
    passed = {id(value) for value in given} | _callee_values(exc)
    outputs = [(c, c.output() if c.output is not None else None) for c in calls]
    chosen = next((c for c, output in reversed(outputs) if output is not None and id(output) in passed), None)
    if chosen is None and exc is None:
        # No failure to reproduce (a run that finished without learning): the experiments compare the model's own
        # last call with itself (eager against compiled, run against run), so that call is the one to replay.
        chosen = calls[-1]
    elif chosen is None:
        chosen = calls[-1]
        inputs = {id(value) for value in _shallow(chosen.args) + _shallow(tuple(chosen.kwargs.values()))}
        feeders = [c for c, output in outputs[:-1] if output is not None and id(output) in inputs]
        if feeders:
            chain = " → ".join(type(c.module).__name__ for c in [*feeders, chosen])
            return None, (f"the step chains modules ({chain}) and the failure came after them: no one recorded "
                          "call replays it")
        together = [c for c in calls if c.step == chosen.step]
        if len(together) > 1:  # a teacher and a student, a generator and a discriminator: the failure needs both
            names = ", ".join(type(c.module).__name__ for c in together)
            return None, (f"the step calls several modules ({names}) and the failure came after them: no one "
                          "recorded call replays it")
        if chosen.repeats > 1:
            return None, (f"{type(chosen.module).__name__} was called {chosen.repeats} times since the last optimizer "
                          "step and the failure came after: its last call alone does not replay the step")
        if not any(is_loss(c.module) and c.step == chosen.step for c in tracker.latest_calls()):
            return None, (f"the failure came after {type(chosen.module).__name__} returned, and the loss is no module "
                          "the runner saw called: the model's call alone does not replay the step")
    return ModuleCall(chosen.module, chosen.args, dict(chosen.kwargs)), ""


def _shallow(values: tuple) -> list[Any]:
    """The values and the items of those that are tuples or lists (an LSTM's (h, c), a list of images)."""
    out = list(values)
    for value in values:
        if isinstance(value, (tuple, list)):
            out.extend(value[:16])
    return out


def recorded_loss_call(tracker: Any) -> ModuleCall | None:
    """The latest recorded call of a loss module (for a failure after it, in backward() or the optimizer's step)."""
    calls = [c for c in tracker.latest_calls() if is_loss(c.module)] if tracker is not None else []
    return ModuleCall(calls[-1].module, calls[-1].args, dict(calls[-1].kwargs)) if calls else None


def _is_user_code(path: str) -> bool:
    return is_user_path(path) and "/triage/" not in path.replace("\\", "/")


def _callee_values(exc: BaseException | None) -> set[int]:
    """ids of the values (and of their direct items) in the frames below the user's innermost one: what the
    user's failing line handed to torch (`F.cross_entropy(logits, y)` keeps `input` and `target` there)."""
    frames = []
    tb = exc.__traceback__ if exc is not None else None
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    last_user = max((i for i, f in enumerate(frames) if _is_user_code(f.f_code.co_filename)), default=-1)
    ids: set[int] = set()
    for frame in frames[last_user + 1:]:
        try:
            values = list(frame.f_locals.values())
        except Exception:
            continue
        ids.update(id(value) for value in _shallow(tuple(values)))
    return ids
