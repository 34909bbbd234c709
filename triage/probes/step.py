"""Rebuild the failing training step on the CPU: the model call, the loss call and the failing layer's call.

In an experiment's child (sandbox.py) the user's own CPU modules and tensors are
used as they are; only device tensors are replaced (see _support.cpu_copy).

The model is replayed with the call the script really made: from the traceback
when the failure is inside its forward, else as the runner recorded it (see
calls.py), or as `triage.watch(record_calls=True)` recorded it. Only without
any record does the batch stand in (`(inputs, targets)` tuples,
`{"input_ids": ..., "labels": ...}` dicts, or a single tensor), and only where
it fits the forward's signature; a step that cannot be rebuilt says why.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ._support import (Inputs, ModuleCopy, Unavailable, cpu_copy, cpu_inputs, describe, iter_tensors, module_names,
                       no_batch_hint)
from .context import ProbeContext

_TARGET_KEYS = ("labels", "label", "targets", "target", "y", "mask_labels", "class_labels")


class ModelOutput:
    """Placeholder for 'the model's output' in a loss call rebuilt from the batch."""


@dataclass
class Call:
    """One call to replay: what to call (a CPU copy), with what, and where it sits in the model."""

    label: str
    fn: Any
    inputs: Inputs
    path: str = ""


@dataclass
class Step:
    """The pieces of a training step, rebuilt on CPU copies."""

    model: ModuleCopy | None = None
    model_call: Call | None = None
    loss_call: Call | None = None
    failing_call: Call | None = None
    notes: list[str] = field(default_factory=list)
    # Where the model call's inputs came from: "call" (the call the script made) or "batch" (a guess); None: no call.
    model_inputs: str | None = None

    @property
    def names(self) -> dict[int, str]:
        return module_names(self.model.module) if self.model else {}


def batch_parts(ctx: ProbeContext, forward: Any = None) -> tuple[tuple | None, dict[str, Any], Any]:
    """(model args, model kwargs, target) guessed from the batch; args None when the batch gives none."""
    batch = ctx.batch
    if isinstance(batch, torch.Tensor):
        return (batch,), {}, None
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], torch.Tensor):
        target = batch[-1] if len(batch) >= 2 and isinstance(batch[-1], torch.Tensor) else None
        return (batch[0],), {}, target
    if isinstance(batch, dict) or (hasattr(batch, "keys") and hasattr(batch, "items")):
        items = dict(batch.items())
        target = next((items[k] for k in _TARGET_KEYS if isinstance(items.get(k), torch.Tensor)), None)
        if forward is not None:
            try:
                params = inspect.signature(forward).parameters
            except (TypeError, ValueError):
                params = {}
            takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
            if items and (takes_any or all(k in params for k in items)):
                return (), items, target
            inputs = [v for k, v in items.items() if isinstance(v, torch.Tensor) and k not in _TARGET_KEYS]
            if len(inputs) == 1:
                return (inputs[0],), {}, target
        return None, {}, target
    return None, {}, None


def rebuild(ctx: ProbeContext, poisoned: bool, device: str = "cpu", with_failing: bool = True) -> Step:
    """Copies of the model, loss and failing layer with their inputs on `device` (cpu, or meta for shapes only)."""
    step = Step()
    names = module_names(ctx.model) if isinstance(ctx.model, nn.Module) else {}
    if isinstance(ctx.model, nn.Module):
        step.model = cpu_copy(ctx.model, poisoned, device=device)
        args, kwargs, target = _model_inputs(ctx, step.notes)
        if args is not None:
            step.model_inputs = "call" if ctx.model_args is not None else "batch"
            inputs = cpu_inputs(args, kwargs, ctx.batch, poisoned)
            step.model_call = Call("model", step.model.module, _to_device(inputs, device))
        loss = _loss_copy(ctx.loss_fn, poisoned, device)
        if loss is not None:
            if ctx.loss_args is not None:
                inputs = cpu_inputs(ctx.loss_args, ctx.loss_kwargs or {}, ctx.batch, poisoned)
                step.loss_call = Call("loss", loss, _to_device(inputs, device))
            elif target is not None and step.model_call is not None:
                targets = cpu_inputs((target,), {}, ctx.batch, poisoned)
                inputs = Inputs((ModelOutput, targets.args[0]), {}, targets.notes, targets.missing)
                step.loss_call = Call("loss", loss, _to_device(inputs, device))
    if with_failing and isinstance(ctx.module, nn.Module):
        path = names.get(id(ctx.module))
        if path is not None and step.model is not None:
            module = step.model.module.get_submodule(path) if path else step.model.module
        else:
            path = ctx.module_name or ""
            module = cpu_copy(ctx.module, poisoned, device=device).module
        inputs = cpu_inputs(tuple(ctx.module_args or ()), ctx.module_kwargs or {}, ctx.batch, poisoned)
        step.failing_call = Call("failing call", module, _to_device(inputs, device), path)
    if step.model_call is None and step.failing_call is None:
        raise Unavailable(_why_nothing_to_run(ctx, step.notes))
    return step


def _model_inputs(ctx: ProbeContext, notes: list[str]) -> tuple[tuple | None, dict[str, Any], Any]:
    """(args, kwargs, target) of the model's call: the call itself (from the traceback or the runner's record) when
    known. Without a record, the batch stands in only where it fits the forward's signature; under the runner,
    which records every call, a model with no recorded call was not called before the failure: nothing is guessed.
    The target (for a loss call rebuilt from the batch) always comes from the batch."""
    guessed_args, guessed_kwargs, target = batch_parts(ctx, ctx.model.forward)
    if ctx.model_args is not None:
        return ctx.model_args, ctx.model_kwargs or {}, target
    name = type(ctx.model).__name__
    if ctx.calls_recorded:
        notes.append(ctx.model_call_note or f"no call of {name} was recorded before the failure, so there is none "
                     "to replay")
        return None, {}, target
    if guessed_args is None:
        return None, {}, target
    signature = _signature(ctx.model.forward)
    if signature is not None:
        try:
            signature.bind(*guessed_args, **guessed_kwargs)
        except TypeError:
            given = ", ".join(describe(t) for _, t in iter_tensors((guessed_args, guessed_kwargs)))
            notes.append(f"{name}.forward{signature} cannot take the batch's {given}, and no call of the model was "
                         "recorded (run under `python -m triage`, or `triage.watch(..., record_calls=True)`)")
            return None, {}, target
    return guessed_args, guessed_kwargs, target


def _signature(forward: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(forward)
    except (TypeError, ValueError):
        return None


def _why_nothing_to_run(ctx: ProbeContext, notes: list[str]) -> str:
    if ctx.model_call_note:
        return ctx.model_call_note
    if ctx.model is None and ctx.module is None:
        return "no live model: run under `python -m triage` or `triage.watch(model=...)`"
    if notes:
        return notes[-1]
    if ctx.batch is None:
        return f"the model's inputs are unknown: the failure came outside a model call ({no_batch_hint()})"
    return "the model's inputs cannot be built from the batch"


def _loss_copy(loss_fn: Any, poisoned: bool, device: str) -> Any:
    if loss_fn is None:
        return None
    if isinstance(loss_fn, nn.Module):
        return cpu_copy(loss_fn, poisoned, device=device).module
    return loss_fn if callable(loss_fn) else None


def _to_device(inputs: Inputs, device: str) -> Inputs:
    if device == "cpu":
        return inputs
    from ._support import map_structure

    def leaf(tensor: torch.Tensor, path: str) -> torch.Tensor:
        return torch.empty(tensor.shape, dtype=tensor.dtype, device=device)

    return Inputs(tuple(map_structure(a, leaf) for a in inputs.args),
                  {k: map_structure(v, leaf) for k, v in inputs.kwargs.items()}, inputs.notes, inputs.missing)


def call(c: Call, output: Any = None) -> Any:
    """Run one rebuilt call. Given the model's `output`, the loss's first floating input becomes that output,
    so that a backward pass reaches the model's parameters."""
    args = list(c.inputs.args)
    if output is not None:
        for i, arg in enumerate(args):
            if arg is ModelOutput or (isinstance(arg, torch.Tensor) and arg.is_floating_point()):
                args[i] = _connect(arg, output)
                break
    elif any(arg is ModelOutput for arg in args):
        raise Unavailable("the loss's input is the model's output, which this re-run did not compute")
    return c.fn(*args, **c.inputs.kwargs)


def _connect(arg: Any, output: Any) -> Any:
    """The model's output in place of a loss input: as is, or reshaped when only the view differs."""
    main = first_tensor(output)
    if arg is ModelOutput:
        if main is None:
            raise Unavailable("the model's output holds no tensor to give the loss")
        return main
    if main is not None and arg.is_floating_point() and main.is_floating_point():
        if main.shape == arg.shape:
            return main
        if main.numel() == arg.numel():
            return main.reshape(arg.shape)
    return arg


def first_tensor(output: Any) -> torch.Tensor | None:
    """The tensor a model's output stands for: itself, `.logits`/`.loss` of a ModelOutput, or the first one."""
    if isinstance(output, torch.Tensor):
        return output
    for key in ("logits", "loss"):
        value = getattr(output, key, None)
        if isinstance(value, torch.Tensor):
            return value
    return next((t for _, t in iter_tensors(output)), None)


@dataclass
class StepRun:
    """What one replay of a step produced: the model's output, the loss, and each parameter's gradient."""

    output: torch.Tensor | None
    loss: torch.Tensor | None
    grads: dict[str, torch.Tensor]


def replay_from(step: Step, initial: dict[str, torch.Tensor], seed: int, through: nn.Module | None = None) -> StepRun:
    """Forward, loss and backward from the weights and buffers in `initial` with `torch.manual_seed(seed)`.

    `through` runs the forward through another module sharing the model's parameters (a torch.compile
    wrapper). The loss is the step's own when its call takes the model's output, else the output's sum.
    Used where two replays are compared (determinism, compile_compare), so each starts from the same state.
    """
    model = step.model.module
    with torch.no_grad():
        for key, value in model.state_dict(keep_vars=True).items():
            value.copy_(initial[key])  # undo what a previous replay did to running statistics
    for param in model.parameters():
        param.grad = None
    torch.manual_seed(seed)
    forward = step.model_call if through is None else Call("model", through, step.model_call.inputs)
    output = call(forward)
    main = first_tensor(output)
    loss = None
    if step.loss_call is not None and _takes_output(step.loss_call):
        loss = first_tensor(call(step.loss_call, output))
    if loss is None and main is not None and main.is_floating_point():
        loss = main.float().sum()
    if loss is not None and loss.requires_grad:
        loss.backward()
    return StepRun(output=main.detach().clone() if main is not None else None,
                   loss=loss.detach().clone() if loss is not None else None,
                   grads={n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})


def _takes_output(loss_call: Call) -> bool:
    return any(a is ModelOutput or (isinstance(a, torch.Tensor) and a.is_floating_point())
               for a in loss_call.inputs.args)
