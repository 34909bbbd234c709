"""shape_trace: run the failing input through CPU copies with hooks on every layer, and say where the sizes part.

Each layer's input and output shapes are recorded up to the layer that raises;
the report names that layer and the arithmetic that breaks ("conv3 outputs
64×30×30 = 57600 features; fc1 expects 64"). Large models are traced on the
meta device, where shapes propagate without computing or allocating anything.
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..diagnosis import ProbeResult
from ._support import (Unavailable, cuda_poisoned, exception_line, innermost_user_frame, iter_tensors, module_bytes,
                       result, where)
from .calls import module_calls
from .context import ProbeContext
from .step import ModelOutput, Step, call, first_tensor, rebuild

NAME = "shape_trace"
META_ABOVE_BYTES = 512 * 1024**2


@dataclass
class Record:
    """One layer call: its path, class and the shapes that went in and came out."""

    path: str
    module: nn.Module
    inputs: list[list[int]]
    outputs: list[list[int]] = field(default_factory=list)
    done: bool = False
    leaf: bool = True

    @property
    def label(self) -> str:
        return self.path or type(self.module).__name__

    def line(self) -> str:
        ins = ", ".join(_fmt(s) for s in self.inputs) or "-"
        outs = ", ".join(_fmt(s) for s in self.outputs) if self.done else "raised"
        return f"{self.label} ({type(self.module).__name__}): {ins} -> {outs}"


def _fmt(shape: list[int]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _times(shape) -> str:
    return "×".join(str(s) for s in shape)


def shape_trace(ctx: ProbeContext) -> ProbeResult:
    poisoned = cuda_poisoned(ctx)
    model = ctx.model if isinstance(ctx.model, nn.Module) else None
    device = "meta" if model is not None and module_bytes(model) > META_ABOVE_BYTES else "cpu"
    try:
        step = rebuild(ctx, poisoned, device=device)
    except Unavailable as exc:
        return result(NAME, "skipped", str(exc))
    records: list[Record] = []
    with torch.no_grad():
        outcome = _trace(step, records)
    artifacts = _write(ctx, records)
    facts = {"trace": [r.line() for r in records if r.leaf or not r.done][:200], "device": device,
             "model_inputs": step.model_inputs, "artifacts": artifacts}
    error, stage, output = outcome
    if error is None:
        return _clean(ctx, step, output, facts)
    failing = _failing_record(error, records, step)
    explanation = _arithmetic(failing, records) if failing is not None else None
    frame = innermost_user_frame(traceback.extract_tb(error.__traceback__))
    at = f" ({where(frame)})" if frame else ""
    layer = f"{failing.label} ({type(failing.module).__name__})" if failing is not None else f"the {stage}"
    detail = f"{explanation}; " if explanation else ""
    detail += f"{layer} raises {exception_line(error)}{at}" + _guessed(step)
    original = ctx.incident.exception
    same = original is None or original.short_type == type(error).__name__
    facts.update(layer=failing.label if failing else stage, exception=type(error).__name__)
    if failing is not None:
        facts.update(_layer_facts(failing, records))
    elif stage == "loss":
        facts.update(_loss_facts(step, output))
    return result(NAME, "confirmed" if same else "inconclusive", detail, **facts)


# What each layer type expects of its input: (the constructor argument, the input dimension that must match it).
_EXPECTS = ((nn.Linear, "in_features", -1), (nn.Bilinear, "in1_features", -1), (nn.RNNBase, "input_size", -1),
            (nn.RNNCellBase, "input_size", -1), (nn.modules.conv._ConvNd, "in_channels", None),
            (nn.modules.batchnorm._BatchNorm, "num_features", 1), (nn.GroupNorm, "num_channels", 1))


def _loss_facts(step: Step, output) -> dict:
    """For a loss that raises: `layer_class` (the loss), `input_shape` (the model's output as the loss got it) and
    `target_shape` (its other tensor argument)."""
    loss = step.loss_call
    name = type(loss.fn).__name__ if isinstance(loss.fn, nn.Module) else getattr(loss.fn, "__name__", "loss")
    tensors = [a for a in loss.inputs.args if isinstance(a, torch.Tensor)]
    if any(a is ModelOutput for a in loss.inputs.args):
        tensors.insert(0, first_tensor(output))  # _trace gave the loss the replayed model's output there
    given = tensors[0] if tensors else None
    target = loss.inputs.kwargs.get("target", tensors[1] if len(tensors) >= 2 else None)
    return {"layer_path": None, "layer_class": name, "input_shape": list(given.shape) if given is not None else None,
            "target_shape": list(target.shape) if isinstance(target, torch.Tensor) else None}


def _layer_facts(failing: Record, records: list[Record]) -> dict:
    """Facts about the layer that raised, for the rules: `layer_path`, `layer_class`, `input_shape`; where the
    layer type has one, `expects` (its constructor argument: in_features, in_channels, num_features, input_size,
    normalized_shape), `in_features` (the size it expects) and `received` (the size it got); and the layer that
    produced its input: `producer`, `producer_class`, `producer_shape` (null when it was the model's input)."""
    module = failing.module
    x = failing.inputs[0] if failing.inputs else None
    facts: dict = {"layer_path": failing.path, "layer_class": type(module).__name__, "input_shape": x,
                   "expects": None, "in_features": None, "received": None}
    for kind, argument, dim in _EXPECTS:
        if isinstance(module, kind) and x:
            if dim is None:  # a conv: channels are dim 1 of a batched input, dim 0 of an unbatched one
                dim = 1 if len(x) == len(module.kernel_size) + 2 else 0
            facts.update(expects=argument, in_features=getattr(module, argument),
                         received=x[dim] if -len(x) <= dim < len(x) else None)
            break
    else:
        if isinstance(module, nn.LayerNorm) and x:
            want = list(module.normalized_shape)
            facts.update(expects="normalized_shape", in_features=want, received=x[-len(want):])
    wanted = facts["received"] if facts["expects"] in ("in_features", "in1_features") else None
    per_sample = math.prod(x[1:]) if x and len(x) >= 2 else None
    found = (_producer(records, failing, size) for size in (wanted, per_sample) if size is not None)
    source = next((record for record in found if record is not None), None)
    facts.update(producer=source.label if source else None,
                 producer_class=type(source.module).__name__ if source else None,
                 producer_shape=source.outputs[0] if source and source.outputs else None)
    return facts


def _guessed(step: Step) -> str:
    if step.model_inputs != "batch" or step.model is None:
        return ""
    return f" (no call of {type(step.model.module).__name__} was recorded: its inputs were taken from the batch)"


def _trace(step: Step, records: list[Record]):
    """Run model then loss with hooks; (exception or None, stage, model output)."""
    names = step.names
    root = step.model.module if step.model else step.failing_call.fn
    open_calls: list[Record] = []
    handles = []

    def pre(module, args, kwargs=None):
        shapes = [list(t.shape) for _, t in iter_tensors((args, kwargs or {}))]
        record = Record(names.get(id(module), ""), module, shapes, leaf=not any(True for _ in module.children()))
        records.append(record)
        open_calls.append(record)

    def post(module, args, output):
        for record in reversed(open_calls):
            if record.module is module:
                record.outputs = [list(t.shape) for _, t in iter_tensors(output)]
                record.done = True
                open_calls.remove(record)
                break

    for module in root.modules():
        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post))
    output = None
    try:
        first = step.model_call or step.failing_call
        try:
            output = call(first)
        except Exception as exc:
            return exc, first.label, None
        if step.loss_call is not None:
            try:
                loss_input = output if any(a is ModelOutput for a in step.loss_call.inputs.args) else None
                call(step.loss_call, loss_input)
            except Unavailable:
                pass
            except Exception as exc:
                return exc, "loss", output
        return None, "", output
    finally:
        for handle in handles:
            handle.remove()


def _failing_record(error: BaseException, records: list[Record], step: Step) -> Record | None:
    calls = module_calls(error.__traceback__)
    if calls:
        innermost = calls[-1].module
        for record in reversed(records):
            if record.module is innermost and not record.done:
                return record
    unfinished = [r for r in records if not r.done]
    return unfinished[-1] if unfinished else None


def _arithmetic(failing: Record, records: list[Record]) -> str | None:
    """The sentence that shows the mismatch, by layer type."""
    module = failing.module
    x = failing.inputs[0] if failing.inputs else None
    if x is None:
        return None
    name = failing.label
    if isinstance(module, nn.Linear) and x:
        got = x[-1]
        source = _producer(records, failing, got)
        if source is not None:
            per_sample = source.outputs[0][1:]
            shown = f"{_times(per_sample)} = {math.prod(per_sample)}" if len(per_sample) > 1 else str(per_sample[0])
            return (f"{source.label} outputs {shown} features per sample; {name} expects "
                    f"{module.in_features} (in_features), so nn.Linear({got}, {module.out_features}) would fit")
        return f"{name} receives {_fmt(x)}: {got} features; it expects in_features={module.in_features}"
    if isinstance(module, nn.modules.conv._ConvNd):
        want = module.in_channels
        rank = len(module.kernel_size)
        if len(x) not in (rank + 1, rank + 2):
            return (f"{name} ({type(module).__name__}) takes {rank + 1}D or {rank + 2}D input but receives "
                    f"{_fmt(x)} ({len(x)}D)")
        got = x[1] if len(x) == rank + 2 else x[0]
        if got != want:
            source = _producer(records, failing, None)
            origin = f"{source.label} outputs {_fmt(source.outputs[0])}" if source else f"its input is {_fmt(x)}"
            return f"{origin}: {got} channels; {name} expects in_channels={want}"
        return None
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and len(x) >= 2 and x[1] != module.num_features:
        return f"{name} receives {_fmt(x)}: {x[1]} features in dimension 1; it expects num_features={module.num_features}"
    if isinstance(module, nn.RNNBase) and x[-1] != module.input_size:
        return f"{name} receives {_fmt(x)}: {x[-1]} features; it expects input_size={module.input_size}"
    if isinstance(module, nn.LayerNorm):
        want = list(module.normalized_shape)
        if x[-len(want):] != want:
            return f"{name} receives {_fmt(x)}; its trailing dimensions should be {_fmt(want)} (normalized_shape)"
    return f"{name} receives {', '.join(_fmt(s) for s in failing.inputs)}"


def _producer(records: list[Record], failing: Record, features: int | None) -> Record | None:
    """The latest finished leaf before `failing` whose per-sample size is `features` (or any, for None)."""
    index = records.index(failing)
    for record in reversed(records[:index]):
        if not (record.done and record.leaf and record.outputs):
            continue
        shape = record.outputs[0]
        if features is None or (len(shape) >= 2 and math.prod(shape[1:]) == features):
            return record
    return None


def _clean(ctx: ProbeContext, step: Step, output, facts: dict) -> ProbeResult:
    main = first_tensor(output)
    shape = _fmt(list(main.shape)) if main is not None else "no tensor"
    what = "the model and the loss run" if step.loss_call is not None else "the model runs"
    detail = f"{what} on this input without a size error (output {shape})"
    outside = _raised_outside_the_replay(ctx)
    if outside is not None:
        # (a metric or a reshape in the loop: the replay never reaches that line, so its passing decides nothing)
        return result(NAME, "skipped", f"{detail}, but the failure was raised at {where(outside)}, outside every "
                      f"module call and the loss: replaying them does not reach that line{_guessed(step)}", **facts)
    original = ctx.incident.exception
    if original is not None and step.model_call is None:
        detail = f"the failing layer runs on these inputs without a size error (output {shape})"
    return result(NAME, "refuted", detail + ": the sizes that failed are not in this step" + _guessed(step), **facts)


def _raised_outside_the_replay(ctx: ProbeContext) -> traceback.FrameSummary | None:
    """The user's line that raised, when neither a module's call, torch.nn.functional nor the run's own loss function
    was running under it; None when one was (or there is no live failure)."""
    if ctx.exception is None:
        return None
    stack = traceback.extract_tb(ctx.exception.__traceback__)
    paths = [frame.filename.replace("\\", "/") for frame in stack]
    if any(path.endswith(("/torch/nn/modules/module.py", "/torch/nn/functional.py")) for path in paths):
        return None
    loss_code = getattr(ctx.loss_fn, "__code__", None)  # a plain function given as the loss, which the replay runs
    if loss_code is not None and any(frame.name == loss_code.co_name and frame.filename == loss_code.co_filename
                                     for frame in stack):
        return None
    return innermost_user_frame(stack)


def _write(ctx: ProbeContext, records: list[Record]) -> list[str]:
    if ctx.report_dir is None or not records:
        return []
    path = Path(ctx.report_dir) / "shape_trace.txt"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(r.line() for r in records) + "\n", encoding="utf-8")
    except OSError:
        return []
    return [str(path)]
