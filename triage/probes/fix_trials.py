"""Fix trials: apply one candidate fix to the failing step's objects in an experiment's child and run the step again.

Each trial is a function of the ProbeContext and the diagnosis's values that
returns a Verdict: "verified" (the step runs and its loss is finite, saying
what was changed), "fails" (the new error's first line) or "not tried" (why:
nothing recorded to replay, the fix does not apply here, or the step as
recorded does not fail). A trial changes the objects it is given, so it runs
only in a child forked at the failure (runner.run_isolated), where they are
the child's own. `try_fixes` runs a diagnosis's candidate fixes in order, one
child each, and stops at the first verified one.

Three kinds of failing step are replayed:
- a model step, rebuilt from the recorded calls (step.rebuild): forward, loss,
  and backward when the model is training; the fix edits a layer, the model's
  inputs, the loss or its inputs;
- the failing loop's own statements (source_step), for a backward that fails
  outside any model call (a recurrent state or a GAN's fake batch kept across
  two backward passes);
- the failing `torch.load` or `load_state_dict` call, re-made from its frame's
  arguments.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import importlib
import inspect
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..diagnosis import Diagnosis, ProbeResult
from ..incident import is_user_path
from . import source_step
from ._support import Inputs, Unavailable, cuda_poisoned, iter_tensors, map_structure
from .context import ProbeContext
from .step import _TARGET_KEYS, Call, ModelOutput, Step, call, first_tensor, rebuild

NAME = "fix_trial"
# The most modules with inplace=True that relu-not-inplace turns off one at a time, to name the one that matters.
_MOST_SINGLE_TRIES = 8
# Most unsupported globals safe-globals allows before it gives up (each needs one more load).
_MOST_GLOBALS = 20
_UNSUPPORTED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


@dataclass
class Verdict:
    """What one trial found: "verified", "fails" or "not tried", and the sentence that says it."""

    verdict: str
    detail: str


class NotApplicable(Exception):
    """Raised by a fix when it does not apply to this step; the message says why (the trial is "not tried")."""


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Lines of a long message that say more than its first one: the weights-only unpickler's own reason.
_TELLING_LINE = re.compile(r"^\s*(WeightsUnpickler error: .*)$", re.MULTILINE)


def one_line(exc: BaseException) -> str:
    """`IndexError: Target 12 is out of bounds.`: the error's type and the line of its message that says what
    happened (colour codes removed)."""
    message = _ANSI.sub("", str(exc)).strip()
    telling = _TELLING_LINE.search(message)
    line = telling[1].strip().split(". ", 1)[0].rstrip(".") + "." if telling else message.split("\n", 1)[0].strip()
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def verified(detail: str) -> Verdict:
    return Verdict("verified", detail)


def fails(error: str) -> Verdict:
    return Verdict("fails", error)


def not_tried(why: str) -> Verdict:
    return Verdict("not tried", why)


# ---------------------------------------------------------------------------- replaying a model step


@dataclass
class Edits:
    """What a fix changes at the step's boundaries (besides the modules it replaces before the run)."""

    inputs: Callable[[Inputs], Inputs] | None = None  # the first call's arguments (the model's, or the layer's)
    prediction: Callable[[torch.Tensor], torch.Tensor] | None = None  # the loss's input
    target: Callable[[torch.Tensor], torch.Tensor] | None = None  # the loss's target
    loss_kwargs: dict[str, Any] | None = None  # settings of the loss to override (ignore_index)
    mode: Callable[[], Any] | None = None  # a context (a TorchFunctionMode) the whole step runs in


@dataclass
class Attempt:
    """One run of a rebuilt step: the error it raised (and where), or its loss; what the loss was given."""

    error: BaseException | None = None
    stage: str = ""
    loss: float | None = None
    stand_in_loss: bool = False
    backward: bool = False
    output: torch.Tensor | None = None
    prediction: torch.Tensor | None = None
    target: torch.Tensor | None = None
    connection: str | None = None
    replay: Callable[[Edits], Attempt] | None = None  # runs the same step again with other edits
    loss_tensor: torch.Tensor | None = None  # the first loss a replay of the loop's statements computed

    @property
    def clean(self) -> bool:
        return self.error is None and (self.loss is None or math.isfinite(self.loss))

    def outcome(self) -> str:
        """`the step runs and the loss is 2.31` (or what went wrong, for a failed attempt)."""
        if self.error is not None:
            return one_line(self.error)
        if self.loss is None:
            return "the step runs"
        if not math.isfinite(self.loss):
            return f"the step runs but the loss is {self.loss}"
        what = "the output's sum (standing in for the loss)" if self.stand_in_loss else "the loss"
        return f"the step runs{' with its backward' if self.backward else ''} and {what} is {self.loss:.4g}"


def _is_loss(fn: Any, step: Step) -> bool:
    if step.loss_call is not None and fn is step.loss_call.fn:
        return True
    name = type(fn).__name__ if isinstance(fn, nn.Module) else getattr(fn, "__name__", "")
    return name.endswith("Loss") or name.endswith("_loss") or name in ("cross_entropy", "nll_loss",
                                                                       "binary_cross_entropy")


class _WatchedLoss:
    """The step's loss, called with the fix's edits to its prediction and target; it notes what it was given."""

    def __init__(self, fn: Any, edits: Edits, seen: Attempt) -> None:
        self.fn, self.edits, self.seen = fn, edits, seen

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args = list(args)
        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        prediction = next((i for i in tensors if args[i].is_floating_point()), tensors[0] if tensors else None)
        if prediction is not None and self.edits.prediction is not None:
            args[prediction] = self.edits.prediction(args[prediction])
        if prediction is not None:
            self.seen.prediction = args[prediction].detach()
        target_index = next((i for i in tensors if i != prediction), None)
        key = next((k for k in ("target", "labels", "label") if isinstance(kwargs.get(k), torch.Tensor)), None)
        if target_index is not None:
            if self.edits.target is not None:
                args[target_index] = self.edits.target(args[target_index])
            self.seen.target = args[target_index].detach()
        elif key is not None:
            if self.edits.target is not None:
                kwargs[key] = self.edits.target(kwargs[key])
            self.seen.target = kwargs[key].detach()
        fn = self.fn
        for key, value in (self.edits.loss_kwargs or {}).items():
            if isinstance(fn, nn.Module) and hasattr(fn, key):
                fn = copy.copy(fn)
                setattr(fn, key, value)
            elif key in _parameters(fn):
                kwargs[key] = value
            else:
                raise NotApplicable(f"the loss {_callable_name(fn)} takes no {key}")
        return fn(*args, **kwargs)


def _callable_name(fn: Any) -> str:
    return type(fn).__name__ if isinstance(fn, nn.Module) else getattr(fn, "__name__", type(fn).__name__)


# The functional losses whose (input, target) a fix may edit in a replay of the user's own statements.
_FUNCTIONAL_LOSSES = ("cross_entropy", "nll_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
                      "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "poisson_nll_loss",
                      "multi_margin_loss", "multilabel_soft_margin_loss", "soft_margin_loss", "hinge_embedding_loss")


class _LossCalls(TorchFunctionMode):
    """Functional losses (which nn losses call too) with the fix's edits to their input, target and settings; the
    first call's input, target and value are noted."""

    def __init__(self, edits: Edits, seen: Attempt) -> None:
        super().__init__()
        self.edits, self.seen = edits, seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") not in _FUNCTIONAL_LOSSES or \
                getattr(func, "__module__", "") != "torch.nn.functional":
            return func(*args, **kwargs)
        try:
            bound = inspect.signature(func).bind(*args, **kwargs)
        except (TypeError, ValueError):
            return func(*args, **kwargs)
        names = list(bound.signature.parameters)
        prediction, target = names[0], names[1]
        values = bound.arguments
        if self.edits.prediction is not None:
            values[prediction] = self.edits.prediction(values[prediction])
        if self.edits.target is not None:
            values[target] = self.edits.target(values[target])
        for key, value in (self.edits.loss_kwargs or {}).items():
            if key not in bound.signature.parameters:
                raise NotApplicable(f"the loss {func.__name__} takes no {key}")
            values[key] = value
        first = self.seen.prediction is None
        if first and isinstance(values[prediction], torch.Tensor):
            self.seen.prediction = values[prediction].detach()
            self.seen.target = values[target].detach() if isinstance(values[target], torch.Tensor) else None
        out = func(*bound.args, **bound.kwargs)
        if first and isinstance(out, torch.Tensor) and out.numel():
            self.seen.loss = float(out.detach().float().mean())
            self.seen.loss_tensor = out
        return out


def _connected(args: tuple, output: torch.Tensor | None, connection: str | None) -> tuple[list, str]:
    """The loss's arguments with the model's output in place of its prediction, and how it was put there.

    How ("as is", "reshaped", "recorded": the loss got something else, made from the output) is decided on the
    step as recorded and kept for the fixed run, whose output may have another shape (a resized head)."""
    args = list(args)
    index = next((i for i, a in enumerate(args) if a is ModelOutput
                  or (isinstance(a, torch.Tensor) and a.is_floating_point())), None)
    if index is None or output is None:
        if index is not None and args[index] is ModelOutput:
            raise Unavailable("the model's output holds no tensor to give the loss")
        return args, "recorded"
    recorded = args[index]
    if connection is None:
        if recorded is ModelOutput or recorded.shape == output.shape:
            connection = "as is"
        elif recorded.numel() == output.numel() and output.is_floating_point():
            connection = "reshaped"
        else:
            connection = "recorded"
    if connection == "as is":
        args[index] = output
    elif connection == "reshaped":
        args[index] = output.reshape(recorded.shape) if output.numel() == recorded.numel() else output
    return args, connection


def run_step(step: Step, edits: Edits | None = None, connection: str | None = None) -> Attempt:
    """Forward, loss and (for a model in training mode) backward of a rebuilt step, with `edits` applied;
    `connection` is how the baseline's loss took the model's output (see _connected)."""
    edits = edits or Edits()
    seen = Attempt()
    root = step.model.module if step.model is not None else step.failing_call.fn
    for param in root.parameters():
        param.grad = None
    first = step.model_call or step.failing_call
    inputs = edits.inputs(first.inputs) if edits.inputs is not None else first.inputs
    fn = first.fn
    if first is step.failing_call and _is_loss(fn, step):  # the failing call is the loss itself
        fn = _WatchedLoss(fn, edits, seen)
    try:
        with torch.enable_grad(), (edits.mode() if edits.mode is not None else contextlib.nullcontext()):
            seen.stage = "forward"
            output = call(Call(first.label, fn, inputs, first.path))
            main = first_tensor(output)
            seen.output = main.detach() if main is not None else None
            loss = main if isinstance(fn, _WatchedLoss) else None
            if loss is None and step.loss_call is not None and first is step.model_call:
                seen.stage = "loss"
                watched = _WatchedLoss(step.loss_call.fn, edits, seen)
                args, seen.connection = _connected(step.loss_call.inputs.args, main, connection)
                loss = first_tensor(watched(*args, **step.loss_call.inputs.kwargs))
            if loss is None and main is not None and main.is_floating_point() and main.requires_grad:
                loss, seen.stand_in_loss = main.float().sum(), True
            if loss is not None:
                seen.loss = float(loss.detach().float().mean())
                if loss.requires_grad and root.training:
                    seen.stage, seen.backward = "backward", True
                    (loss if loss.numel() == 1 else loss.sum()).backward()
    except (Unavailable, NotApplicable):
        raise
    except Exception as exc:  # the finding: the step still fails
        seen.error = exc
    return seen


def _only_in_a_child() -> None:
    """A trial changes the model, the loss and the state dict it is given: the user's own, outside a child."""
    from .sandbox import in_sandbox

    if not in_sandbox():
        raise RuntimeError("a fix trial changes the objects it replays: run it through run_trial (a forked child)")


def _original(ctx: ProbeContext) -> str:
    exc = ctx.incident.exception
    return exc.short_type if exc is not None else ""


class _Replay:
    """The failing step to run as it was, then with a fix: rebuilt from the recorded calls, or, where that does not
    fail as the script did (a functional loss is no recorded call), the failing loop's own statements."""

    def __init__(self, ctx: ProbeContext, prepare: Callable[[Step], None] | None) -> None:
        self.ctx = ctx
        self.source: source_step.SourceStep | None = None
        self.connection: str | None = None
        try:
            self.step = rebuild(ctx, cuda_poisoned(ctx))
            if prepare is not None:
                prepare(self.step)
            self.why_not_calls = ""
        except Unavailable as exc:
            self.step, self.why_not_calls = self._bare_step(ctx), str(exc)

    @staticmethod
    def _bare_step(ctx: ProbeContext) -> Step:
        """The model alone (what a fix edits), for a step only the loop's statements can replay."""
        from ._support import cpu_copy

        if not isinstance(ctx.model, nn.Module):
            raise Unavailable("no live model: run under `python -m triage` or `triage.watch(model=...)`")
        return Step(model=cpu_copy(ctx.model, cuda_poisoned(ctx)))

    def baseline(self) -> Attempt:
        """The step as recorded; it must fail as the script did (else the loop's statements are tried)."""
        original = _original(self.ctx)
        reasons = []
        if not self.why_not_calls:
            attempt = run_step(self.step)
            if self._reproduces(attempt, original):
                self.connection = attempt.connection
                return attempt
            reasons.append(self._why_not(attempt, original, "the step as recorded"))
        else:
            reasons.append(self.why_not_calls)
        try:
            self.source = source_step.find(self.ctx.frames)
        except Unavailable as exc:
            raise Unavailable(f"{reasons[0]}; {exc}") from None
        attempt = self.run(Edits())
        if self._reproduces(attempt, original):
            return attempt
        raise Unavailable(f"{reasons[0]}; {self._why_not(attempt, original, f'the step at {self.source.where}')}")

    @staticmethod
    def _reproduces(attempt: Attempt, original: str) -> bool:
        if attempt.clean:
            return False
        return attempt.error is None or not original or type(attempt.error).__name__ == original

    @staticmethod
    def _why_not(attempt: Attempt, original: str, what: str) -> str:
        if attempt.clean:
            return f"{what} does not fail ({attempt.outcome()}), so a trial cannot tell"
        return f"{what} raises {one_line(attempt.error)}, not the {original} the script raised"

    def run(self, edits: Edits) -> Attempt:
        if self.source is None:
            return run_step(self.step, edits, self.connection)
        return _run_source(self.source, self.source.code, edits=edits, model=self.step.model)


def _model_trial(ctx: ProbeContext, fix: Callable[[Step, Attempt], tuple[Any, Edits]],
                 prepare: Callable[[Step], None] | None = None) -> Verdict:
    """Replay the step (`prepare` adjusts the rebuilt one), check that it fails as the script did, apply `fix` (what
    it changed, or a function that says so once the step ran or raises NotApplicable, and the edits of the run),
    and run it again."""
    _only_in_a_child()
    try:
        replay = _Replay(ctx, prepare)
        step = replay.step
        if step.model is not None and not step.model.real_weights:
            return not_tried(f"the model's weights cannot be read ({step.model.note})")
        baseline = replay.baseline()
        baseline.replay = replay.run
        change, edits = fix(step, baseline)
        attempt = replay.run(edits)
        change = change() if callable(change) else change
    except (Unavailable, NotApplicable) as exc:
        return not_tried(str(exc))
    if attempt.clean:
        return verified(f"with {change} {attempt.outcome()}")
    if attempt.error is None:
        return fails(f"with {change} {attempt.outcome()}")
    return fails(one_line(attempt.error))


def _replace_module(step: Step, path: str, new: nn.Module) -> None:
    """Put `new` at `path` in the step's model (and wherever a rebuilt call calls the old module)."""
    old = step.model.module.get_submodule(path) if step.model is not None else step.failing_call.fn
    if step.model is not None:
        if path:
            parent, _, leaf = path.rpartition(".")
            setattr(step.model.module.get_submodule(parent), leaf, new)
        else:
            step.model.module = new
    for c in (step.model_call, step.failing_call, step.loss_call):
        if c is not None and c.fn is old:
            c.fn = new


def _shown(path: str, module: nn.Module) -> str:
    return path or type(module).__name__


def _modules(step: Step) -> list[tuple[str, nn.Module]]:
    if step.model is not None:
        return list(step.model.module.named_modules())
    return [(step.failing_call.path, step.failing_call.fn)] if step.failing_call is not None else []


def _weight_dtype(module: nn.Module) -> torch.dtype:
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.get_default_dtype())


# ---------------------------------------------------------------------------- layer sizes


def resize_linear_in(ctx: ProbeContext, values: dict[str, Any]) -> Verdict:
    """The failing nn.Linear's in_features set to the number of features it receives."""

    def fix(step: Step, baseline: Attempt) -> tuple[str, Edits]:
        failing = step.failing_call
        path, layer, got = "", None, None
        if failing is not None and isinstance(failing.fn, nn.Linear) and failing.inputs.args:
            x = failing.inputs.args[0]
            if isinstance(x, torch.Tensor) and x.dim() >= 1:
                path, layer, got = failing.path, failing.fn, x.shape[-1]
        if layer is None and _int(values.get("got")) and _int(values.get("want")):
            wanted = [(p, m) for p, m in _modules(step)
                      if isinstance(m, nn.Linear) and m.in_features == _int(values["want"])]
            if len(wanted) == 1:
                (path, layer), got = wanted[0], _int(values["got"])
        if layer is None:
            raise NotApplicable("the failing call is not an nn.Linear of the model, and no single Linear expects "
                                "the features the error names")
        if got == layer.in_features:
            raise NotApplicable(f"{_shown(path, layer)} already takes {got} features")
        torch.manual_seed(0)
        new = nn.Linear(got, layer.out_features, bias=layer.bias is not None, dtype=layer.weight.dtype)
        new.train(layer.training)
        _replace_module(step, path, new)
        return f"nn.Linear({got}, {layer.out_features}) as {_shown(path, layer)}", Edits()

    return _model_trial(ctx, fix)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _target_of(step: Step, baseline: Attempt) -> torch.Tensor | None:
    """The loss's target as the replay gave it, else as recorded (the second tensor of the loss call)."""
    if baseline.target is not None:
        return baseline.target
    c = step.loss_call or (step.failing_call if step.failing_call and _is_loss(step.failing_call.fn, step) else None)
    if c is None:
        return None
    tensors = [a for a in c.inputs.args if isinstance(a, torch.Tensor)]
    if len(tensors) >= 2:
        return tensors[1]
    return next((c.inputs.kwargs[k] for k in ("target", "labels") if isinstance(c.inputs.kwargs.get(k), torch.Tensor)),
                None)


def _model_labels(step: Step) -> str | None:
    """The key of the labels the model's own call takes (a model that computes its loss: `labels=`)."""
    if step.model_call is None:
        return None
    return next((k for k in _TARGET_KEYS if isinstance(step.model_call.inputs.kwargs.get(k), torch.Tensor)), None)


def _labels(step: Step, baseline: Attempt) -> tuple[torch.Tensor, Edits, str]:
    """The integer labels of the step, and how to edit them: at the loss, or in the model's `labels=` argument.
    Returns (labels, an Edits to fill, which of the two)."""
    target = _target_of(step, baseline)
    if target is not None and not target.is_floating_point():
        return target, Edits(), "loss"
    key = _model_labels(step)
    if key is not None:
        return step.model_call.inputs.kwargs[key], Edits(), key
    if target is not None:
        raise NotApplicable(f"the loss's target is {_dtype(target)}, not integer class labels")
    raise NotApplicable("no class labels were recorded for this step (neither a loss call nor a `labels=` argument)")


def _edit_labels(edits: Edits, where: str, change: Callable[[torch.Tensor], torch.Tensor]) -> Edits:
    if where == "loss":
        edits.target = change
    else:
        edits.inputs = lambda inputs: Inputs(inputs.args, {**inputs.kwargs, where: change(inputs.kwargs[where])},
                                             inputs.notes, inputs.missing)
    return edits


def _classifier(step: Step, classes: int) -> tuple[str, nn.Module]:
    """The last layer that produces `classes` outputs: an nn.Linear, or a convolution for dense predictions."""
    found = [(p, m) for p, m in _modules(step)
             if (isinstance(m, nn.Linear) and m.out_features == classes)
             or (isinstance(m, nn.modules.conv._ConvNd) and m.out_channels == classes)]
    if not found:
        raise NotApplicable(f"no nn.Linear or convolution of the model has {classes} outputs")
    return found[-1]


def _classes(step: Step, baseline: Attempt) -> int:
    prediction = baseline.prediction if baseline.prediction is not None else baseline.output
    if prediction is None or prediction.dim() == 0:
        raise NotApplicable("the model's output was not computed, so its number of classes is unknown")
    return prediction.shape[1] if prediction.dim() >= 2 else prediction.shape[0]


def resize_head(ctx: ProbeContext, values: dict[str, Any]) -> Verdict:
    """The classifier's out_features (out_channels) set to the largest label + 1."""

    def fix(step: Step, baseline: Attempt) -> tuple[str, Edits]:
        labels, _, _ = _labels(step, baseline)
        ignore = getattr(step.loss_call.fn if step.loss_call else None, "ignore_index", -100)
        kept = labels[labels != ignore]
        if kept.numel() == 0:
            raise NotApplicable("every label is the loss's ignore_index")
        top = int(kept.max())
        classes = _classes(step, baseline)
        if top < classes:
            raise NotApplicable(f"every label (max {top}) is below the {classes} outputs the model has")
        path, old = _classifier(step, classes)
        torch.manual_seed(0)
        if isinstance(old, nn.Linear):
            new = nn.Linear(old.in_features, top + 1, bias=old.bias is not None, dtype=old.weight.dtype)
            shown = f"nn.Linear({old.in_features}, {top + 1})"
        else:
            new = type(old)(old.in_channels, top + 1, old.kernel_size, stride=old.stride, padding=old.padding,
                            dilation=old.dilation, groups=old.groups, bias=old.bias is not None,
                            dtype=old.weight.dtype)
            shown = f"nn.{type(old).__name__}({old.in_channels}, {top + 1}, kernel_size={old.kernel_size})"
        new.train(old.training)
        _replace_module(step, path, new)
        return f"{shown} as {_shown(path, old)} (labels reach {top})", Edits()

    return _model_trial(ctx, fix)


def resize_embedding(ctx: ProbeContext, values: dict[str, Any]) -> Verdict:
    """Each embedding that gets an id past its table grows to the largest id + 1 (its rows kept)."""

    def fix(step: Step, baseline: Attempt) -> tuple[str, Edits]:
        changed: list[str] = []
        for _ in range(5):  # one pass per embedding the forward reaches before the next one fails
            offenders = _embedding_offenders(step, baseline.replay)
            if not offenders:
                break
            for path, module, top, low in offenders:
                if low < 0:
                    raise NotApplicable(f"{_shown(path, module)} gets id {low}: no table size fits a negative id")
                new = _grown(module, top + 1)
                _replace_module(step, path, new)
                changed.append(f"nn.{type(module).__name__}({top + 1}, {module.embedding_dim}) as {_shown(path, module)}")
        if not changed:
            raise NotApplicable("every embedding's ids fit its table in this step")
        return ", ".join(changed), Edits()

    return _model_trial(ctx, fix)


def _embedding_offenders(step: Step, replay: Callable[[Edits], Attempt]) -> list[tuple[str, nn.Module, int, int]]:
    """(path, embedding, largest id, smallest id) for each embedding whose ids do not fit, seen by a replay."""
    found: dict[int, tuple[str, nn.Module, int, int]] = {}
    names = {id(m): p for p, m in _modules(step)}

    def check(module: nn.Module, args: tuple) -> None:
        if args and isinstance(args[0], torch.Tensor) and args[0].numel() and not args[0].is_floating_point():
            top, low = int(args[0].max()), int(args[0].min())
            if top >= module.num_embeddings or low < 0:
                found.setdefault(id(module), (names.get(id(module), ""), module, top, low))

    handles = [m.register_forward_pre_hook(check) for _, m in _modules(step)
               if isinstance(m, (nn.Embedding, nn.EmbeddingBag))]
    try:
        replay(Edits())  # an out-of-range id stops it; the hook has seen it
    finally:
        for handle in handles:
            handle.remove()
    return list(found.values())


def _grown(module: nn.Module, size: int) -> nn.Module:
    if isinstance(module, nn.EmbeddingBag):
        new = nn.EmbeddingBag(size, module.embedding_dim, mode=module.mode, padding_idx=module.padding_idx,
                              dtype=module.weight.dtype)
    else:
        new = nn.Embedding(size, module.embedding_dim, padding_idx=module.padding_idx, dtype=module.weight.dtype)
    with torch.no_grad():
        new.weight[: module.num_embeddings] = module.weight
    return new


# ---------------------------------------------------------------------------- labels and targets


def shift_labels(ctx: ProbeContext, values: dict[str, Any]) -> Verdict:
    """The labels minus 1 (those equal to the loss's ignore_index left alone)."""

    def fix(step: Step, baseline: Attempt) -> tuple[str, Edits]:
        labels, edits, where = _labels(step, baseline)
        ignore = getattr(step.loss_call.fn if step.loss_call else None, "ignore_index", -100)
        kept = labels[labels != ignore]
        low, top = (int(kept.min()), int(kept.max())) if kept.numel() else (0, 0)
        shift = (lambda t: torch.where(t != ignore, t - 1, t))
        name = "labels" if where == "loss" else f"{where}="
        return f"{name} - 1 (now {low - 1}..{top - 1})", _edit_labels(edits, where, shift)

    return _model_trial(ctx, fix)


def ignore_index(ctx: ProbeContext, values: dict[str, Any]) -> Verdict:
    """The loss given ignore_index = the one label outside the classes."""

    def fix(step: Step, baseline: Attempt) -> tuple[str, Edits]:
        labels, _, where = _labels(step, baseline)
        if where != "loss":
            raise NotApplicable("the labels go into the model's own loss, whose ignore_index a trial cannot set")
        named = _int(values.get("target"))
        if named is None:
            classes = _classes(step, baseline)
            outside = sorted({int(v) for v in labels.unique() if int(v) < 0 or int(v) >= classes})
            if len(outside) != 1:
                raise NotApplicable(f"labels {outside[:5]} are outside the {classes} classes: ignore_index takes "
                                    f"one value" if outside else "no label is outside the classes")
            named = outside[0]
        loss = step.loss_call.fn if step.loss_call is not None else None
        shown = f"{_callable_name(loss)}(ignore_index={named})" if loss is not None else f"ignore_index={named}"
        return shown, Edits(loss_kwargs={"ignore_index": named})

    return _model_trial(ctx, fix)


def _parameters(fn: Any) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).replace("torch.", "")


def target_long(ctx: ProbeContext, values: dict[str, Any]) -> Verdict:
    """The loss's target as class indices: `.long()` of an integer target of another width, or of a float target
    that holds whole numbers."""

    def fix(step: Step, baseline: Attempt) -> tuple[str, Edits]:
        target = _target_of(step, baseline)
        if target is None:
            raise NotApplicable("no loss target was recorded for this step")
        if target.dtype == torch.long:
            raise NotApplicable("the target is already int64")
        if target.is_floating_point() and not bool(torch.equal(target, target.round())):
            fraction = target[target != target.round()].flatten()[0]
            raise NotApplicable(f"the target holds fractional values ({float(fraction):g}): probabilities or "
                                f"regression targets, not class indices")
        return f"target.long() (was {_dtype(target)})", Edits(target=lambda t: t.long())

    return _model_trial(ctx, fix)


def target_float(ctx: ProbeContext, values: dict[str, Any]) -> Verdict:
    """The loss's target cast to the dtype of its prediction."""

    def fix(step: Step, baseline: Attempt) -> tuple[str, Edits]:
        target = _target_of(step, baseline)
        if target is None:
            raise NotApplicable("no loss target was recorded for this step")
        prediction = baseline.prediction
        wanted = prediction.dtype if prediction is not None and prediction.is_floating_point() else torch.float32
        if target.dtype == wanted:
            raise NotApplicable(f"the target is already {_dtype(target)}")
        return f"target.to({wanted}) (was {_dtype(target)})", Edits(target=lambda t: t.to(wanted))

    return _model_trial(ctx, fix)


def squeeze_output(ctx: ProbeContext, values: dict[str, Any]) -> Verdict:
    """The model's output squeezed in its last dimension (of size 1) before the loss."""

    def fix(step: Step, baseline: Attempt) -> tuple[str, Edits]:
        prediction = baseline.prediction
        if prediction is None:
            raise NotApplicable("the loss was not reached in the replay, so its input is unknown")
        if prediction.dim() < 2 or prediction.shape[-1] != 1:
            raise NotApplicable(f"the loss's input {list(prediction.shape)} has no last dimension of size 1")
        return f"output.squeeze(-1) ({list(prediction.shape)} -> {list(prediction.shape[:-1])})", \
            Edits(prediction=lambda p: p.squeeze(-1))

    return _model_trial(ctx, fix)


def unsqueeze_target(ctx: ProbeContext, values: dict[str, Any]) -> Verdict:
    """The loss's target given a last dimension of size 1, to match a [N, 1] prediction."""

    def fix(step: Step, baseline: Attempt) -> tuple[str, Edits]:
        prediction, target = baseline.prediction, _target_of(step, baseline)
        if prediction is None or target is None:
            raise NotApplicable("the loss was not reached in the replay, so its inputs are unknown")
        if target.dim() + 1 != prediction.dim() or prediction.shape[-1] != 1:
            raise NotApplicable(f"the target {list(target.shape)} is not the prediction {list(prediction.shape)} "
                                f"without its last dimension of size 1")
        return f"target.unsqueeze(-1) ({list(target.shape)} -> {list(target.shape) + [1]})", \
            Edits(target=lambda t: t.unsqueeze(-1))

    return _model_trial(ctx, fix)


# ---------------------------------------------------------------------------- inputs and state


def input_float(ctx: ProbeContext, values: dict[str, Any]) -> Verdict:
    """Every floating input of the model's call (data and recurrent state alike) cast to its weights' dtype, and
    at each layer, whatever the forward made in another dtype (a state created inside it)."""

    def fix(step: Step, baseline: Attempt) -> tuple[Callable[[], str], Edits]:
        root = step.model.module if step.model is not None else step.failing_call.fn
        wanted = _weight_dtype(root)
        cast: list[str] = []
        layers = _LayerInputsCast(root)

        def to_weights(inputs: Inputs) -> Inputs:
            cast.extend(f"{path} ({_dtype(t)})" for path, t in _input_tensors(inputs)
                        if t.is_floating_point() and t.dtype != wanted and f"{path} ({_dtype(t)})" not in cast)
            leaf = (lambda t, _path: t.to(wanted) if t.is_floating_point() else t)
            return Inputs(tuple(map_structure(a, leaf) for a in inputs.args),
                          {k: map_structure(v, leaf) for k, v in inputs.kwargs.items()}, inputs.notes, inputs.missing)

        def shown() -> str:
            parts = [", ".join(cast)] if cast else []
            if layers.cast:
                parts.append(f"the inputs {'made inside the forward ' if cast else ''}of "
                             f"{', '.join(layers.cast)}")
            if not parts:
                raise NotApplicable(f"every floating input of the model and its layers is already "
                                    f"{_dtype_name(wanted)}")
            return f"{' and '.join(parts)} cast to {_dtype_name(wanted)}"

        return shown, Edits(inputs=to_weights, mode=lambda: layers)

    return _model_trial(ctx, fix)


class _LayerInputsCast:
    """While entered, every layer with weights gets its floating inputs in its weights' dtype (the layers that
    needed it are noted): a state the forward itself creates in another dtype."""

    def __init__(self, root: nn.Module) -> None:
        self.root = root
        self.cast: list[str] = []
        self.handles: list[Any] = []

    def __enter__(self) -> "_LayerInputsCast":
        for path, module in self.root.named_modules():
            weight = next((p for p in module._parameters.values() if p is not None and p.is_floating_point()), None)
            if weight is not None:
                self.handles.append(module.register_forward_pre_hook(self._hook(path, module, weight.dtype),
                                                                     with_kwargs=True))
        return self

    def _hook(self, path: str, module: nn.Module, dtype: torch.dtype) -> Callable[..., Any]:
        label = f"{_shown(path, module)} ({type(module).__name__})"

        def cast(_module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
            if not any(t.is_floating_point() and t.dtype != dtype for _, t in iter_tensors((args, kwargs))):
                return None
            if label not in self.cast:
                self.cast.append(label)
            leaf = (lambda t, _path: t.to(dtype) if t.is_floating_point() else t)
            return tuple(map_structure(a, leaf) for a in args), {k: map_structure(v, leaf) for k, v in kwargs.items()}

        return cast

    def __exit__(self, *exc: Any) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _input_tensors(inputs: Inputs) -> list[tuple[str, torch.Tensor]]:
    found = []
    for i, arg in enumerate(inputs.args):
        found += [(f"arg{i}" + (path if path.startswith("[") else ""), t) for path, t in iter_tensors(arg)]
    for key, value in inputs.kwargs.items():
        found += [(key + (path if path.startswith("[") else ""), t) for path, t in iter_tensors(value)]
    return found


def detach_hidden(ctx: ProbeContext, values: dict[str, Any]) -> Verdict:
    """The recurrent state detached before the model's call: in the recorded call's arguments when they carry a
    previous step's graph, else in the failing loop's statements (the state its next iteration would read)."""
    recorded = ctx.model_args is not None and isinstance(ctx.model, nn.Module)
    carried = [path for path, t in _input_tensors(Inputs(tuple(ctx.model_args or ()), dict(ctx.model_kwargs or {}),
                                                         [], [])) if t.grad_fn is not None] if recorded else []
    if carried:
        def with_graphs(step: Step) -> None:
            """The recorded arguments themselves (rebuild detaches them): their graphs are the bug."""
            if step.model_call is None or any(t.device.type != "cpu" for _, t in iter_tensors(ctx.model_args)):
                raise Unavailable("the model's recorded arguments cannot be replayed as they were")
            step.model_call.inputs = Inputs(tuple(ctx.model_args), dict(ctx.model_kwargs or {}), [], [])

        def fix(step: Step, baseline: Attempt) -> tuple[str, Edits]:
            def detached(inputs: Inputs) -> Inputs:
                leaf = (lambda t, _path: t.detach() if t.grad_fn is not None else t)
                return Inputs(tuple(map_structure(a, leaf) for a in inputs.args),
                              {k: map_structure(v, leaf) for k, v in inputs.kwargs.items()}, inputs.notes,
                              inputs.missing)

            return f"{', '.join(carried)} detached before the model's call", Edits(inputs=detached)

        return _model_trial(ctx, fix, prepare=with_graphs)

    def detach_carried(source: source_step.SourceStep, namespace: dict[str, Any]) -> str:
        state = [name for name in source.carried if _has_graph(namespace.get(name))]
        if not state:
            raise NotApplicable("no value the loop carries from one iteration to the next holds a graph")
        for name in state:
            namespace[name] = map_structure(namespace[name], lambda t, _path: t.detach())
        return f"{', '.join(state)} detached at the start of the step"

    return _source_trial(ctx, detach_carried, carry=True)


def _has_graph(value: Any) -> bool:
    return any(t.grad_fn is not None for _, t in iter_tensors(value))


def detach_fake(ctx: ProbeContext, values: dict[str, Any]) -> Verdict:
    """The generator's output detached where the discriminator's step uses it: in each call of a network on the
    output of another network, up to the first backward() after such a call."""

    def detach_in_d_step(source: source_step.SourceStep, namespace: dict[str, Any]) -> tuple[str, ast.Module]:
        tree = copy.deepcopy(source.tree)
        made_by: dict[str, nn.Module] = {}  # names bound to a network's output, and the network
        detach = _DetachArguments(made_by, namespace, source.filename)
        for stmt in tree.body[0].body:  # the one-pass loop around the statements
            detach.apply(stmt)
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
                network = _resolve(stmt.value.func, namespace)
                for target in stmt.targets:
                    if isinstance(target, ast.Name):
                        if _network(network):
                            made_by[target.id] = network
                        else:
                            made_by.pop(target.id, None)
            if detach.sites and _calls_backward(stmt):
                break
        if not detach.sites:
            raise NotApplicable("no network is called on another network's output before a backward() in the "
                                "failing loop")
        return ", ".join(detach.sites), ast.fix_missing_locations(tree)

    return _source_trial(ctx, detach_in_d_step)


def _network(value: Any) -> bool:
    """A module with parameters of its own (a network, not a loss or an activation)."""
    return isinstance(value, nn.Module) and any(True for _ in value.parameters())


def _resolve(node: ast.AST, namespace: dict[str, Any]) -> Any:
    """The object a Name or dotted attribute (`self.netD`) refers to in the namespace, else None."""
    if isinstance(node, ast.Name):
        return namespace.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _resolve(node.value, namespace)
        return getattr(owner, node.attr, None) if owner is not None else None
    return None


class _DetachArguments(ast.NodeTransformer):
    """`D(fake)` -> `D(fake.detach())` where `fake` is another network's output (`made_by`)."""

    def __init__(self, made_by: dict[str, nn.Module], namespace: dict[str, Any], filename: str) -> None:
        self.made_by, self.namespace, self.filename = made_by, namespace, filename
        self.sites: list[str] = []

    def apply(self, stmt: ast.stmt) -> None:
        self.visit(stmt)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        network = _resolve(node.func, self.namespace)
        if not _network(network):
            return node
        for i, arg in enumerate(node.args):
            producer = self.made_by.get(arg.id) if isinstance(arg, ast.Name) else None
            if producer is not None and producer is not network:
                node.args[i] = ast.copy_location(ast.Call(ast.Attribute(ast.Name(arg.id, ast.Load()), "detach",
                                                                        ast.Load()), [], []), arg)
                self.sites.append(f"`{ast.unparse(node)}` at {self.filename}:{node.lineno}")
        return node


def _calls_backward(stmt: ast.stmt) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward"
               for n in ast.walk(stmt))


def _source_trial(ctx: ProbeContext, fix: Callable[..., Any], carry: bool = False) -> Verdict:
    """Replay the failing loop's statements: once as they are (they must fail as recorded), once with `fix`, which
    edits the namespace (returning what it changed) or returns (what it changed, the edited statements)."""
    _only_in_a_child()
    try:
        source = source_step.find(ctx.frames, carry=carry)
        baseline = _run_source(source, source.code)
        if baseline.error is None:
            return not_tried(f"the step at {source.where} runs as recorded ({baseline.outcome()}), so a trial "
                             f"cannot tell")
        original = _original(ctx)
        if original and type(baseline.error).__name__ != original:
            return not_tried(f"the replayed step raises {one_line(baseline.error)}, not the {original} "
                             f"the script raised")
        namespace, _ = source.namespace()
        try:
            changed = fix(source, namespace)
        except NotApplicable as exc:
            return not_tried(str(exc))
        code = source.code
        if isinstance(changed, tuple):
            changed, tree = changed
            code = compile(tree, source.filename, "exec").replace(co_name=source.code.co_name)
        attempt = _run_source(source, code, namespace)
    except Unavailable as exc:
        return not_tried(str(exc))
    if attempt.clean:
        return verified(f"with {changed} {attempt.outcome()}")
    return fails(one_line(attempt.error) if attempt.error is not None else attempt.outcome())


def _run_source(source: source_step.SourceStep, code: Any, namespace: dict[str, Any] | None = None,
                edits: Edits | None = None, model: Any = None) -> Attempt:
    """Run the loop's statements with `edits`: to the model's inputs (a pre-hook on `model`, a ModuleCopy), to the
    functional losses' input, target and settings, and the edits' mode. The loss is the value whose backward() the
    failing line calls, else the first loss computed."""
    namespace = namespace if namespace is not None else source.namespace()[0]
    edits = edits or Edits()
    seen = Attempt(stage="step")
    root = model.module if model is not None else None
    handles = []
    if root is not None:
        def noted(module: nn.Module, args: tuple, output: Any) -> None:
            main = first_tensor(output)
            if seen.output is None and main is not None:
                seen.output = main.detach()

        handles.append(root.register_forward_hook(noted))
        if edits.inputs is not None:
            def edited(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
                changed = edits.inputs(Inputs(args, kwargs, [], []))
                return changed.args, changed.kwargs

            handles.append(root.register_forward_pre_hook(edited, with_kwargs=True))
    try:
        with torch.enable_grad(), _LossCalls(edits, seen), \
                (edits.mode() if edits.mode is not None else contextlib.nullcontext()):
            exec(code, namespace)  # noqa: S102 - the user's own statements, in an experiment's child
    except (Unavailable, NotApplicable):
        raise
    except Exception as exc:  # the finding: the step still fails
        seen.error = exc
        return seen
    finally:
        for handle in handles:
            handle.remove()
    statements = source.tree.body[0].body if source.tree is not None else []
    seen.backward = any(_calls_backward(stmt) for stmt in statements)
    loss = seen.loss_tensor
    seen.loss_tensor = None
    if not seen.backward and loss is not None and loss.requires_grad and (root is None or root.training):
        try:  # the statements stop at the failing line; the loop's backward comes after it
            with torch.enable_grad():
                (loss if loss.numel() == 1 else loss.sum()).backward()
            seen.backward = True
        except Exception as exc:
            seen.error, seen.stage = exc, "backward"
            return seen
    loss_name = next((n.func.value.id for n in ast.walk(statements[-1]) if isinstance(n, ast.Call)
                      and isinstance(n.func, ast.Attribute) and n.func.attr == "backward"
                      and isinstance(n.func.value, ast.Name)), None) if statements else None
    loss = namespace.get(loss_name) if loss_name else None
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        seen.loss = float(loss.detach())
    return seen


# ---------------------------------------------------------------------------- in-place writes and views


class _ContiguousViews(TorchFunctionMode):
    """`.view` that fails on a non-contiguous tensor is retried on `.contiguous()`; the user's lines are noted."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not torch.Tensor.view or not args or not isinstance(args[0], torch.Tensor):
            return func(*args, **kwargs)
        try:
            return func(*args, **kwargs)
        except RuntimeError as exc:
            if "view size is not compatible" not in str(exc):
                raise
            site = _user_line()
            if site and site not in self.sites:
                self.sites.append(site)
            return func(args[0].contiguous(), *args[1:], **kwargs)


def _user_line() -> str:
    """`file:line (`code`)` of the innermost user frame on the stack now."""
    import linecache

    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if is_user_path(filename) and "/triage/" not in filename.replace("\\", "/"):
            code = linecache.getline(filename, frame.f_lineno).strip()
            return f"{filename}:{frame.f_lineno}" + (f" (`{code}`)" if code else "")
        frame = frame.f_back
    return ""


def contiguous(ctx: ProbeContext, values: dict[str, Any]) -> Verdict:
    """`.contiguous()` before each `.view` that fails on a non-contiguous tensor."""
    views = _ContiguousViews()

    def fix(step: Step, baseline: Attempt) -> tuple[Callable[[], str], Edits]:
        def shown() -> str:
            if not views.sites:
                raise NotApplicable("no .view in the step fails on a non-contiguous tensor")
            return f".contiguous() before .view at {', '.join(views.sites)}"

        return shown, Edits(mode=lambda: views)

    return _model_trial(ctx, fix)


class _OutOfPlaceActivations(TorchFunctionMode):
    """Functional activations called with inplace=True run out of place; the user's lines are noted."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if kwargs.get("inplace") is True and getattr(func, "__module__", "") == "torch.nn.functional":
            kwargs["inplace"] = False
            site = _user_line()
            if site and site not in self.sites:
                self.sites.append(site)
        return func(*args, **kwargs)


def relu_not_inplace(ctx: ProbeContext, values: dict[str, Any]) -> Verdict:
    """inplace=False on the activation whose in-place write breaks the backward: each module with inplace=True
    alone first (to name it), then all of them with functional calls' inplace=True too."""
    functional = _OutOfPlaceActivations()

    def fix(step: Step, baseline: Attempt) -> tuple[Callable[[], str], Edits]:
        flagged = [(p, m) for p, m in _modules(step) if getattr(m, "inplace", None) is True]
        for path, module in flagged[:_MOST_SINGLE_TRIES] if len(flagged) > 1 else ():
            module.inplace = False
            if baseline.replay(Edits()).clean:
                return (lambda: f"inplace=False on {_shown(path, module)} ({type(module).__name__})"), Edits()
            module.inplace = True
        for _, module in flagged:
            module.inplace = False

        def shown() -> str:
            changed = [f"{_shown(p, m)} ({type(m).__name__})" for p, m in flagged] + functional.sites
            if not changed:
                raise NotApplicable("no activation of the model or its calls runs in place")
            return f"inplace=False on {', '.join(changed)}"

        return shown, Edits(mode=lambda: functional)

    return _model_trial(ctx, fix)


# ---------------------------------------------------------------------------- checkpoints


def _frame_locals(ctx: ProbeContext, function: str, file_suffix: str) -> dict[str, Any] | None:
    """The locals of the innermost frame of `function` in torch's `file_suffix` on the exception's traceback."""
    tb = ctx.exception.__traceback__ if ctx.exception is not None else None
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == function and code.co_filename.replace("\\", "/").endswith(file_suffix):
            found = tb.tb_frame.f_locals
        tb = tb.tb_next
    return found


def _load_call(ctx: ProbeContext) -> dict[str, Any]:
    """The arguments of the failing torch.load, read from its frame."""
    found = _frame_locals(ctx, "load", "torch/serialization.py")
    if found is None:
        raise NotApplicable("the failure did not come from torch.load" if ctx.exception is not None
                            else "no live failure to replay (a pasted log)")
    f = found.get("f")
    if isinstance(f, (str, os.PathLike)) and not os.path.isabs(f) and _script_folder is not None:
        f = os.path.join(_script_folder, f)  # a path relative to the script's folder, not the child's
    if hasattr(f, "seek"):
        try:
            f.seek(0)
        except (OSError, ValueError) as exc:
            raise NotApplicable(f"the file torch.load read cannot be read again: {exc}") from None
    return {"f": f, "map_location": found.get("map_location"), "pickle_module": found.get("pickle_module"),
            "weights_only": found.get("weights_only"), "mmap": found.get("mmap"),
            **dict(found.get("pickle_load_args") or {})}


def _loaded(value: Any) -> str:
    if isinstance(value, dict):
        return f"a dict of {len(value)} key{'s' if len(value) != 1 else ''}"
    if isinstance(value, nn.Module):
        return f"a {type(value).__name__} module"
    if isinstance(value, torch.Tensor):
        return f"a tensor {list(value.shape)}"
    return f"a {type(value).__name__}"


def _load_trial(ctx: ProbeContext, change: Callable[[dict[str, Any]], str]) -> Verdict:
    _only_in_a_child()
    try:
        kwargs = _load_call(ctx)
        shown = change(kwargs)
    except NotApplicable as exc:
        return not_tried(str(exc))
    try:
        value = torch.load(**kwargs)
    except Exception as exc:
        return fails(one_line(exc))
    return verified(f"with {shown} torch.load reads the checkpoint ({_loaded(value)})")


def map_location_cpu(ctx: ProbeContext, values: dict[str, Any]) -> Verdict:
    """torch.load again with map_location="cpu"."""

    def change(kwargs: dict[str, Any]) -> str:
        if kwargs["map_location"] in ("cpu", torch.device("cpu")):
            raise NotApplicable("torch.load already had map_location='cpu'")
        kwargs["map_location"] = "cpu"
        return "map_location='cpu'"

    return _load_trial(ctx, change)


def weights_only_false(ctx: ProbeContext, values: dict[str, Any]) -> Verdict:
    """torch.load again with weights_only=False (only for a file one trusts; the report's fix says so)."""

    def change(kwargs: dict[str, Any]) -> str:
        if kwargs["weights_only"] is False:
            raise NotApplicable("torch.load already had weights_only=False")
        kwargs["weights_only"] = False
        return "weights_only=False"

    return _load_trial(ctx, change)


def safe_globals(ctx: ProbeContext, values: dict[str, Any]) -> Verdict:
    """torch.load again inside torch.serialization.safe_globals([...]) with each global the weights-only
    unpickler refused, found one load at a time."""
    _only_in_a_child()
    try:
        kwargs = _load_call(ctx)
    except NotApplicable as exc:
        return not_tried(str(exc))
    if kwargs["weights_only"] is False:
        return not_tried("torch.load ran with weights_only=False: no global was refused")
    allowed: list[Any] = []
    names: list[str] = []
    message = str(ctx.exception)
    for _ in range(_MOST_GLOBALS):
        refused = _UNSUPPORTED_GLOBAL.search(message)
        if refused is None:
            break
        try:
            allowed.append(_import_global(refused[1]))
        except (ImportError, AttributeError) as exc:
            return not_tried(f"the global {refused[1]} cannot be imported here: {exc}")
        names.append(refused[1])
        if hasattr(kwargs["f"], "seek"):
            kwargs["f"].seek(0)
        try:
            with torch.serialization.safe_globals(allowed):
                value = torch.load(**kwargs)
        except Exception as exc:
            message = str(exc)
            if not _UNSUPPORTED_GLOBAL.search(message):
                return fails(one_line(exc))
            continue
        return verified(f"with torch.serialization.safe_globals([{', '.join(names)}]) torch.load reads the "
                        f"checkpoint ({_loaded(value)})")
    if not names:
        return not_tried("the error names no unsupported global")
    return fails(f"more than {_MOST_GLOBALS} globals refused; the last: {_ANSI.sub('', message).splitlines()[0]}")


def _import_global(dotted: str) -> Any:
    """`pkg.module.Class.Inner` -> the object, importing the longest module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            value = sys.modules.get(module_name) or importlib.import_module(module_name)
        except ImportError:
            continue
        for attr in parts[cut:]:
            value = getattr(value, attr)
        return value
    raise ImportError(f"no module of {dotted} can be imported")


def strip_module_prefix(ctx: ProbeContext, values: dict[str, Any]) -> Verdict:
    """load_state_dict again with the `module.` prefix (DataParallel's, DistributedDataParallel's) stripped."""
    _only_in_a_child()
    found = _frame_locals(ctx, "load_state_dict", "torch/nn/modules/module.py")
    if found is None or not isinstance(found.get("self"), nn.Module):
        return not_tried("the failure did not come from load_state_dict" if ctx.exception is not None
                         else "no live failure to replay (a pasted log)")
    module, state = found["self"], found.get("state_dict")
    if not hasattr(state, "items"):
        return not_tried("the state dict load_state_dict was given is not readable")
    prefixed = [k for k in state if isinstance(k, str) and k.startswith("module.")]
    if not prefixed:
        return not_tried("no key of the state dict starts with `module.`")
    stripped = type(state)((k[len("module."):] if isinstance(k, str) and k.startswith("module.") else k, v)
                           for k, v in state.items())
    if hasattr(state, "_metadata"):
        stripped._metadata = type(state._metadata)(
            (k[len("module."):] if k.startswith("module.") else ("" if k == "module" else k), v)
            for k, v in state._metadata.items())
    strict = found.get("strict", True)
    try:
        module.load_state_dict(stripped, strict=strict, assign=found.get("assign", False))
    except Exception as exc:
        return fails(one_line(exc))
    return verified(f"with `module.` stripped from {len(prefixed)} of {len(state)} keys, "
                    f"{type(module).__name__}.load_state_dict(strict={strict}) loads them")


# ---------------------------------------------------------------------------- running the trials


TRIALS: dict[str, Callable[[ProbeContext, dict[str, Any]], Verdict]] = {
    "resize-linear-in": resize_linear_in, "resize-head": resize_head, "resize-embedding": resize_embedding,
    "shift-labels": shift_labels, "ignore-index": ignore_index, "target-long": target_long,
    "target-float": target_float, "input-float": input_float, "squeeze-output": squeeze_output,
    "unsqueeze-target": unsqueeze_target, "contiguous": contiguous, "relu-not-inplace": relu_not_inplace,
    "detach-hidden": detach_hidden, "detach-fake": detach_fake, "strip-module-prefix": strip_module_prefix,
    "map-location-cpu": map_location_cpu, "weights-only-false": weights_only_false, "safe-globals": safe_globals,
}  # fmt: skip


def run_trial(name: str, ctx: ProbeContext, values: dict[str, Any], limit_s: float) -> Verdict:
    """One trial in a disposable child forked from this process (its changes stay there); always a Verdict."""
    from .runner import run_isolated

    trial = TRIALS.get(name)
    if trial is None:
        return not_tried(f"no fix trial is named '{name}'")
    if not ctx.live:
        return not_tried("no live model, batch or failure was recorded (a pasted log)")
    folder = os.getcwd()
    outcome = run_isolated(lambda: _in_child(trial, ctx, values, folder), ctx, limit_s)
    if outcome.stopped == "time":
        return not_tried(f"the trial ran past its time limit of {limit_s:.3g} s")
    if outcome.stopped is not None:
        return not_tried(outcome.reason)
    if outcome.error is not None:
        return not_tried(f"the trial itself failed: {outcome.error}")
    value = outcome.value
    if not isinstance(value, Verdict):
        return not_tried(f"the trial returned {type(value).__name__}, not a Verdict")
    return value


# The script's working folder, in a trial's child (which works in a private folder of its own).
_script_folder: str | None = None


def _in_child(trial: Callable[[ProbeContext, dict[str, Any]], Verdict], ctx: ProbeContext, values: dict[str, Any],
              folder: str) -> Verdict:
    global _script_folder
    _script_folder = folder  # the child's own copy of the module: the parent's stays None
    return trial(ctx, values)


def try_fixes(diagnosis: Diagnosis, ctx: ProbeContext, limit_s: float | None = None,
              total_s: float | None = None) -> ProbeResult | None:
    """Run the diagnosis's candidate fixes that have a trial, in order, each in its own child, until one is
    verified; record each verdict on its Fix and return the `fix_trial` result (None when no fix has a trial).

    The result is confirmed when a fix was verified, refuted when every fix tried failed, skipped otherwise."""
    limit_s = ctx.time_limit_s if limit_s is None else limit_s
    total_s = ctx.total_time_s if total_s is None else total_s
    trials = [fix for fix in diagnosis.fixes if fix.trial]
    if not trials:
        return None
    started = time.monotonic()
    for fix in trials:
        left = total_s - (time.monotonic() - started)
        if left <= 0.05:
            fix.verdict, fix.detail = "not tried", f"the trials' time budget of {total_s:g} s is spent"
            continue
        outcome = run_trial(fix.trial, ctx, dict(diagnosis.values), min(limit_s, left))
        fix.verdict, fix.detail = outcome.verdict, outcome.detail
        if outcome.verdict == "verified":
            break
    tried = [fix for fix in trials if fix.verdict is not None]
    lines = "; ".join(f"{fix.id} {'fails: now' if fix.verdict == 'fails' else fix.verdict + ':'} {fix.detail}"
                      for fix in tried)
    verdicts = {fix.verdict for fix in tried}
    status = "confirmed" if "verified" in verdicts else "refuted" if "fails" in verdicts else "skipped"
    return ProbeResult(NAME, status, lines, facts={"fixes": {fix.id: fix.verdict for fix in tried}},
                       seconds=time.monotonic() - started)


def order_fixes(diagnosis: Diagnosis) -> None:
    """A verified fix leads; a fix that failed goes below the candidates not shown to fail. The diagnosis's
    `fix` text is the leading one's."""
    rank = {"verified": 0, "fails": 2}
    diagnosis.fixes.sort(key=lambda fix: rank.get(fix.verdict, 1))
    if diagnosis.fixes:
        diagnosis.fix = diagnosis.fixes[0].text
