"""anomaly_rerun: replay forward, loss and backward on CPU copies under torch.autograd.detect_anomaly.

Three observers watch the replay: a TorchFunctionMode that notes, for every torch
call, the user's line, which tensor it wrote in place, and the first call that
turned finite inputs into NaN/Inf; forward hooks for the first module whose
output is non-finite; and anomaly mode for the backward function that returned
NaN (with the forward line that created it) or the tensor an in-place write
invalidated.
"""

from __future__ import annotations

import math
import re
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..diagnosis import ProbeResult
from ..incident import is_user_path
from ..logparse import side_stack_in_text
from ._support import Unavailable, cuda_poisoned, exception_line, iter_tensors, result
from . import source_step
from .context import ProbeContext
from .step import Step, call, first_tensor, rebuild

NAME = "anomaly_rerun"
_INPLACE_DUNDERS = {"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__ipow__", "__iand__",
                    "__ior__", "__ixor__", "__imatmul__", "__setitem__"}
_REPLAY_BOUNDARY = ("triage/probes/step.py", "triage/probes/source_step.py")  # where replayed code is called
_INPLACE_FLAG = {"relu", "relu6", "leaky_relu", "elu", "selu", "celu", "hardtanh", "threshold", "rrelu", "silu",
                 "hardswish", "hardsigmoid", "mish", "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout"}
_VERSION_ERROR = re.compile(r"\[torch\.\w+ \[(?P<shape>[\d, ]*)\]\], which is output (?P<index>\d+) of "
                            r"(?P<producer>\w+?)(?:Backward\d*)?, is at version (?P<version>\d+)")
_NAN_BACKWARD = re.compile(r"Function '(?P<fn>\w+)' returned nan values in its (?P<index>\d+)th output")


def _user_site() -> str:
    """`file:line: `code`` of the innermost user frame calling into torch right now."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        normalized = filename.replace("\\", "/")
        if normalized.endswith(_REPLAY_BOUNDARY):
            return ""  # outside the replayed call: the probe's own callers
        if is_user_path(filename) and "/triage/" not in normalized:
            import linecache

            code = linecache.getline(filename, frame.f_lineno).strip()
            return f"{filename}:{frame.f_lineno}" + (f": `{code}`" if code else "")
        frame = frame.f_back
    return ""


def _op_name(func: Any) -> str:
    name = getattr(func, "__name__", None) or str(func)
    return name


class OpLog(TorchFunctionMode):
    """Records producers, in-place writes and the first op that produced NaN/Inf from finite inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.producers: dict[int, tuple[str, str]] = {}
        self.writes: list[tuple[torch.Tensor, str, str]] = []
        self.first_nonfinite: str | None = None
        self.keep: list[torch.Tensor] = []  # keeps ids unique while the log lives

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            self._note(func, args, kwargs, out)
        except Exception:  # observing must never change what the replay does
            pass
        return out

    def _note(self, func, args, kwargs, out) -> None:
        name = _op_name(func)
        tensors_in = [t for _, t in iter_tensors((args, kwargs))]
        inplace = (name in _INPLACE_DUNDERS or (name.endswith("_") and not name.startswith("_"))
                   or kwargs.get("inplace") is True or (name in _INPLACE_FLAG and len(args) >= 2 and args[-1] is True)
                   or "out" in kwargs)
        if inplace and tensors_in:
            if isinstance(kwargs.get("out"), torch.Tensor):
                targets = [kwargs["out"]]
            elif args and isinstance(args[0], (list, tuple)):  # a _foreach_ op writes every tensor of its first list
                targets = [t for t in args[0] if isinstance(t, torch.Tensor)]
            else:
                targets = tensors_in[:1]
            site = _user_site()
            self.writes += [(target, name, site) for target in targets]
            self.keep += targets
        elif isinstance(out, torch.Tensor):
            self.producers.setdefault(id(out), (name, _user_site()))
            self.keep.append(out)
        if self.first_nonfinite is None:
            outs = [t for _, t in iter_tensors(out)] if not inplace else tensors_in[:1]
            if any(t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()) for t in outs):
                if all(not t.is_floating_point() or bool(torch.isfinite(t).all()) for t in tensors_in
                       if not (inplace and t is tensors_in[0])):
                    bad = next(t for t in outs if t.is_floating_point() and not bool(torch.isfinite(t).all()))
                    kind = "nan" if bool(torch.isnan(bad).any()) else "inf"
                    self.first_nonfinite = f"{name} at {_user_site() or 'an unknown line'} produced {kind} from finite inputs"


def anomaly_rerun(ctx: ProbeContext) -> ProbeResult:
    poisoned = cuda_poisoned(ctx)
    try:
        step = rebuild(ctx, poisoned)
    except Unavailable as exc:
        return _rerun_from_source(ctx, str(exc))
    if step.model is None and step.failing_call is None:
        return result(NAME, "skipped", "no module to replay")
    root = step.model.module if step.model else step.failing_call.fn
    weights = "" if step.model is None or step.model.real_weights else f" ({step.model.note})"
    observed = _replay([("", root)], lambda seen, log: _run_rebuilt(step, seen, log))
    return _verdict(ctx, observed, weights)


def _rerun_from_source(ctx: ProbeContext, why_not_rebuilt: str) -> ProbeResult:
    """The failing loop's own statements, replayed in the experiment's child, when the model's inputs are unknown."""
    try:
        source = source_step.find(ctx.frames)
        namespace, modules = source.namespace()
        if not modules:
            raise Unavailable(f"the step at {source.where} uses no module")

        def run(seen: Observed, log: OpLog) -> None:
            seen.stage = "step"
            with log:
                source.run(namespace)

        observed = _replay(modules, run)
    except Unavailable as exc:
        return result(NAME, "skipped", f"{why_not_rebuilt}; {exc}")
    observed.replayed = f"the step at {source.where}"
    return _verdict(ctx, observed, "")


@dataclass
class Observed:
    error: BaseException | None = None
    stage: str = ""
    anomaly_trace: str = ""
    first_module: str | None = None
    first_op: str | None = None
    log: OpLog | None = None
    nonfinite_params: list[str] = field(default_factory=list)
    nonfinite_grads: list[str] = field(default_factory=list)
    loss_value: float | None = None
    stand_in_loss: bool = False
    replayed: str = "forward, loss and backward"
    parameter_names: dict[int, str] = field(default_factory=dict)


def _run_rebuilt(step: Step, seen: Observed, log: OpLog) -> None:
    """Forward, loss and backward of a step rebuilt from its calls."""
    first = step.model_call or step.failing_call
    seen.stage = "forward"
    with log:
        output = call(first)
        loss = None
        if step.loss_call is not None and first is step.model_call:
            seen.stage = "loss"
            try:
                loss = call(step.loss_call, output)
            except Unavailable:
                loss = None
        if loss is None:
            main = first_tensor(output)
            if main is None or not main.requires_grad:
                raise Unavailable("the output does not require grad: nothing to backpropagate")
            loss = main.float().sum()
            seen.stand_in_loss = True
    seen.loss_value = float(loss.detach()) if loss.numel() == 1 else None
    seen.stage = "backward"
    loss.backward()


def _replay(roots: list[tuple[str, nn.Module]], run: Callable[[Observed, OpLog], None]) -> Observed:
    """run(seen, log) under anomaly detection, with the roots' modules watched for non-finite outputs."""
    seen = Observed()
    names = {id(m): ".".join(p for p in (prefix, path) if p) for prefix, root in roots
             for path, m in root.named_modules()}
    parameters = [(".".join(p for p in (prefix, path) if p), param) for prefix, root in roots
                  for path, param in root.named_parameters()]
    seen.parameter_names = {id(param): name for name, param in parameters}
    seen.nonfinite_params = [n for n, p in parameters if p.is_floating_point() and not bool(torch.isfinite(p).all())]

    def watch(module, args, output):
        if seen.first_module is None:
            for _, t in iter_tensors(output):
                if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t.detach()).all()):
                    path = names.get(id(module), "")
                    seen.first_module = f"{path} ({type(module).__name__})" if path else type(module).__name__
                    break

    handles = [m.register_forward_hook(watch) for _, root in roots for m in root.modules()]
    log = OpLog()
    seen.log = log
    try:
        with warnings.catch_warnings(record=True) as caught, torch.enable_grad():
            warnings.simplefilter("always")
            with torch.autograd.detect_anomaly(check_nan=True):
                try:
                    run(seen, log)
                except Unavailable:
                    raise
                except Exception as exc:  # the finding
                    seen.error = exc
        for warning in caught:
            text = str(warning.message)
            if "Traceback of forward call" in text:
                seen.anomaly_trace = text
    finally:
        for handle in handles:
            handle.remove()
    seen.first_op = log.first_nonfinite
    if seen.error is None:
        seen.nonfinite_grads = [n for n, p in parameters if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
    return seen


def _forward_line(anomaly_trace: str) -> str:
    """The innermost user frame of anomaly mode's 'Traceback of forward call', inside the replayed call."""
    frames = side_stack_in_text(anomaly_trace)[1]
    starts = [i for i, frame in enumerate(frames) if frame.file.replace("\\", "/").endswith(_REPLAY_BOUNDARY)]
    found = ""
    for frame in frames[starts[-1] + 1 if starts else 0:]:
        if is_user_path(frame.file) and "/triage/" not in frame.file.replace("\\", "/"):
            found = f"{frame.where}: `{(frame.code or '').strip()}`"
    return found


def _stage_of(function: str) -> str:
    return "loss" if "Loss" in function or "loss" in function.lower() else "model"


def _verdict(ctx: ProbeContext, seen: Observed, weights: str) -> ProbeResult:
    category = getattr(ctx.diagnosis, "category", None) or ("nan" if ctx.incident.kind == "nan" else None)
    facts: dict[str, Any] = {"stage": seen.stage, "first_nonfinite_op": seen.first_op,
                             "first_nonfinite_module": seen.first_module,
                             "nonfinite_parameters": seen.nonfinite_params[:20],
                             "nonfinite_gradients": seen.nonfinite_grads[:20], "loss": seen.loss_value}
    # A finding ends with what was replayed, when that was the loop's own statements; a clean replay names it first.
    noted = weights + (f" (replayed {seen.replayed} on CPU copies)" if seen.stage == "step" else "")
    error = seen.error
    if error is not None:
        facts["exception"] = type(error).__name__
        message = str(error)
        nan = _NAN_BACKWARD.search(message)
        version = _VERSION_ERROR.search(message)
        forward = _forward_line(seen.anomaly_trace)
        if nan:
            parts = _nonfinite_findings(seen, with_gradients=False)
            parts.append(f"in backward, {nan['fn']} returned nan in its output {nan['index']}"
                         + (f" (forward line {forward})" if forward else f" (in the {_stage_of(nan['fn'])})"))
            facts.update(backward_function=nan["fn"], forward_line=forward)
            status = "confirmed" if category in (None, "nan") else "inconclusive"
            return result(NAME, status, "; ".join(parts) + noted, **facts)
        if version:
            detail = _inplace_detail(version, seen, forward, facts)
            facts.update(forward_line=forward)
            status = "confirmed" if category in (None, "inplace", "autograd") else "inconclusive"
            return result(NAME, status, detail + noted, **facts)
        original = ctx.incident.exception
        # A version error replayed as another error is a replay of something else, not a confirmation.
        same = (original is not None and original.short_type == type(error).__name__
                and "modified by an inplace operation" not in original.message)
        where_ = f" (forward line {forward})" if forward else ""
        raised = f"the replay raises {exception_line(error)} in the {seen.stage}{where_}"
        if category == "nan":  # a guard of the user's (a NaN check, clip_grad_norm_) stopped the replayed step
            raised = "; ".join(_nonfinite_findings(seen, with_gradients=False) + [raised])
        return result(NAME, "confirmed" if same else "inconclusive", raised + noted, **facts)
    parts = _nonfinite_findings(seen, with_gradients=True)
    if parts:
        status = "confirmed" if category in (None, "nan") else "inconclusive"
        return result(NAME, status, "; ".join(parts) + noted, **facts)
    outcome = [f"loss {seen.loss_value:.4g}"] if seen.loss_value is not None else []
    if outcome and seen.stand_in_loss:
        outcome[0] += " (the output's sum stood in for the loss)"
    clean = f"{seen.replayed} replay under anomaly detection without error: " \
            f"{', '.join(outcome + ['all gradients finite'])}{weights}"
    # Without the user's loss code (the output's sum stood in for it) a clean replay refutes nothing that code may do.
    if category in ("nan", "inplace", "autograd") and not seen.stand_in_loss:
        return result(NAME, "refuted", clean, **facts)
    return result(NAME, "inconclusive", clean, **facts)


def _inplace_detail(version: re.Match, seen: Observed, forward: str, facts: dict[str, Any]) -> str:
    """The in-place write that broke the saved tensor, in words; its op, line and parameter go into `facts`
    (inplace_op, inplace_site, inplace_code, inplace_parameter) for the rules' causes to choose by."""
    shape = [int(s) for s in version["shape"].replace(" ", "").split(",") if s]
    producer = version["producer"].lower()
    needed = f"backward needs the output of {version['producer']} [{', '.join(map(str, shape))}]" \
             + (f", saved by the forward line {forward}" if forward else "")
    log = seen.log
    if log is None:
        return needed
    candidates = [(t, name, site) for t, name, site in log.writes if list(t.shape) == shape]
    if not candidates:  # saved as a view (a transposed weight, say): the same elements in another shape
        candidates = [(t, name, site) for t, name, site in log.writes
                      if sorted(t.shape) == sorted(shape) and t.numel() == math.prod(shape)]
    matching = [w for w in candidates if producer in log.producers.get(id(w[0]), ("", ""))[0].lower()]
    chosen = matching or candidates
    if not chosen:
        return f"{needed}; it was modified in place at version {version['version']}"
    # An optimizer's step writes its state (exp_avg) too; the saved tensor it broke is the parameter.
    tensor, name, site = next((w for w in chosen if id(w[0]) in seen.parameter_names), chosen[0])
    parameter = seen.parameter_names.get(id(tensor))
    code = site.split(": `", 1)[1].rstrip("`") if ": `" in site else ""
    facts.update(inplace_op=name, inplace_site=site.split(": `", 1)[0], inplace_code=code, inplace_parameter=parameter)
    if parameter is not None:
        return (f"the in-place {name} at {site or 'an unknown line'} updated the parameter {parameter} "
                f"[{', '.join(map(str, tensor.shape))}] after the forward pass used it; {needed}. Update the "
                f"parameters only after every backward() that goes through them, or run the forward pass again "
                f"after the update")
    made_by, made_at = log.producers.get(id(tensor), (version["producer"], ""))
    made = f" (made by {made_by}" + (f" at {made_at})" if made_at else ")")
    return (f"the in-place {name} at {site or 'an unknown line'} modified the output of {version['producer']}"
            f"{made}; {needed}. Use the out-of-place form (e.g. `x = x + 1`, inplace=False) or .clone() first")


def _nonfinite_findings(seen, with_gradients: bool) -> list[str]:
    """What the replay saw go non-finite, earliest first."""
    parts = []
    if seen.nonfinite_params:
        parts.append(f"parameters already non-finite before the step: {', '.join(seen.nonfinite_params[:5])}")
    if seen.first_op:
        parts.append(f"first non-finite value in the forward pass: {seen.first_op}")
    if seen.first_module:
        parts.append(f"first module with a non-finite output: {seen.first_module}")
    if with_gradients and seen.nonfinite_grads:
        parts.append(f"non-finite gradients in {', '.join(seen.nonfinite_grads[:5])}")
    return parts
