"""Measurements on a replay of the model's last recorded call, for runs that finished without learning.

Each probe rebuilds the last step (step.py: the model's call as the runner
recorded it, the loss call, the user's own objects in the experiment's child)
and measures what its diagnosis says, from the weights the run ended with:

- softmax_rows: does the model's output already sum to 1 over the classes
  (a probability distribution handed to cross_entropy, which applies log-softmax)?
- relu_activity: how many units of each ReLU are zero for every example of the batch?
- gradient_reach: which parameters that require grad get no gradient from a
  forward-loss-backward, and which module's output the cut follows?
- grad_carryover: does `.grad` at the end of the run hold one step's gradient, or many?

Each confirms only when the measurement shows the cause and refutes when it
shows the opposite; a step that cannot be rebuilt skips with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from ..diagnosis import ProbeResult
from ..graph_walk import autograd_nodes
from ._support import Unavailable, describe, display_name, exception_line, module_names, result
from .context import ProbeContext
from .step import Step, call, first_tensor, rebuild

ROW_SUM_TOLERANCE = 1e-3  # softmax rows sum to 1 within float rounding; logits almost never do
DEAD_UNITS = 0.99  # a ReLU whose units are this share zero for every example is dead
ALIVE_UNITS = 0.5  # below this share of dead units a ReLU is working
CARRIED = 1.0  # .grad differs from one step's gradient by at least this many of its norms: earlier steps are in it
CLEARED = 0.25  # ...by at most this share: .grad is the last step's gradient alone
MAX_NAMES = 6


@dataclass
class Replay:
    """What one forward-loss-backward replay of the last step saw."""

    output: torch.Tensor | None
    loss: torch.Tensor | None
    loss_source: str  # "the step's loss" or "the sum of the model's output"
    calls: list[tuple[str, bool, bool]] = field(default_factory=list)  # (module path, input requires grad, output)


def last_step(ctx: ProbeContext) -> Step:
    """The step rebuilt around the model's last recorded call, or Unavailable with the reason."""
    step = rebuild(ctx, poisoned=False, with_failing=False)
    if step.model is None or step.model_call is None:
        raise Unavailable(step.notes[-1] if step.notes else "the model's last call could not be rebuilt")
    return step


def replay_backward(step: Step, *, need_loss: bool = False, record_calls: bool = False,
                    before_backward: Callable[[torch.Tensor], None] | None = None) -> Replay:
    """Forward, loss and backward of the rebuilt step from the current weights, every `.grad` cleared first.

    The loss is the step's own when its call takes the model's output; otherwise the output's sum stands in
    (enough to tell which parameters the output depends on), unless `need_loss`. `before_backward` sees the
    loss while its graph still holds what it saved (backward frees it)."""
    model = step.model.module
    for param in model.parameters():
        param.grad = None
    calls: list[tuple[str, bool, bool]] = []
    handles = []
    if record_calls:
        names = module_names(model)

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            inputs = [a for a in args if isinstance(a, torch.Tensor)]
            out = first_tensor(output)
            calls.append((names.get(id(module), ""), any(t.requires_grad for t in inputs),
                          bool(out is not None and out.requires_grad)))

        handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        with torch.enable_grad():
            output = call(step.model_call)
            main = first_tensor(output)
            loss, source = None, ""
            if step.loss_call is not None:
                try:
                    loss = first_tensor(call(step.loss_call, output))
                    source = "the step's loss"
                except Unavailable:
                    loss = None
            if loss is None:
                if need_loss:
                    raise Unavailable("the loss was not computed by a module the runner saw called, so it cannot be "
                                      "replayed")
                if main is not None and main.is_floating_point():
                    loss, source = main.float().sum(), "the sum of the model's output (the loss is plain code)"
            if loss is not None and before_backward is not None:
                before_backward(loss)
            if loss is not None and loss.requires_grad:
                loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    return Replay(output=main, loss=loss, loss_source=source, calls=calls)


def names_of(text: str) -> list[str]:
    """Parameter names from a finding's list ("model.fc.weight, model.fc.bias, ... (9 in all)")."""
    return [n.strip() for n in (text or "").split(",") if n.strip() and "..." not in n and " " not in n.strip()]


def matches(param_name: str, wanted: list[str]) -> bool:
    """`fc.weight` inside the model is the finding's `model.fc.weight` (the script's global prefix)."""
    return any(w == param_name or w.endswith("." + param_name) for w in wanted)


def shown(names: list[str], prefix: str = "") -> str:
    """`model.fc.weight, model.fc.bias`: the first MAX_NAMES names, as the script writes them."""
    return ", ".join(prefix + n for n in names[:MAX_NAMES]) + (f", ... ({len(names)} in all)"
                                                                if len(names) > MAX_NAMES else "")


def script_prefix(model: Any) -> str:
    """`model.` when the script binds the model to a global name (the health checks' names carry it), else ''."""
    import sys

    scope = getattr(sys.modules.get("__main__"), "__dict__", {})
    return next((f"{key}." for key, value in scope.items() if value is model and not key.startswith("_")), "")


# ---------------------------------------------------------------------------- softmax_rows


def softmax_rows(ctx: ProbeContext) -> ProbeResult:
    """Test whether what cross_entropy got is already a probability distribution: the input of the loss module's
    last recorded call, or, with no loss module, the model's output on a replay of its last call."""
    name = "softmax_rows"
    recorded = ctx.loss_args[0] if ctx.loss_args else None
    if isinstance(recorded, torch.Tensor) and recorded.is_floating_point():
        scores, what = recorded, "the input of the loss's last call"
    else:
        try:
            step = last_step(ctx)
            with torch.no_grad():
                scores = first_tensor(call(step.model_call))
        except Unavailable as exc:
            return result(name, "skipped", str(exc))
        except Exception as exc:
            return result(name, "inconclusive", f"replaying the model's last call raised {exception_line(exc)}")
        what = "the model's output on a replay of its last call"
    if scores is None or not scores.is_floating_point() or scores.dim() < 2 or scores.shape[1] < 2:
        said = describe(scores) if isinstance(scores, torch.Tensor) else type(scores).__name__
        return result(name, "skipped", f"{what} ({said}) has no class dimension to sum over")
    shape = describe(scores)
    scores = scores.detach().float()
    classes = int(scores.shape[1])
    sums = scores.sum(dim=1)
    deviation = float((sums - 1).abs().max())
    low, high = float(scores.min()), float(scores.max())
    facts = {"measured": what, "shape": list(scores.shape), "classes": classes, "min": low, "max": high,
             "row_sum_min": float(sums.min()), "row_sum_max": float(sums.max())}
    if low >= 0 and high <= 1 and deviation <= ROW_SUM_TOLERANCE:
        # log-softmax of inputs in [0, 1]: the best it can do is one input at 1, the rest at 0
        floor = math.log(1 + (classes - 1) / math.e)
        facts["loss_floor"] = floor
        return result(name, "confirmed",
                      f"{what} ({shape}) lies in [{low:.3g}, {high:.3g}] and each of its {sums.numel()} rows sums to "
                      f"1 over the {classes} classes (largest deviation {deviation:.1e}): it is already softmax "
                      f"probabilities, and cross_entropy's log-softmax of them cannot go below "
                      f"log(1 + {classes - 1}/e) = {floor:.3f}, against log({classes}) = {math.log(classes):.3f} at "
                      f"chance", **facts)
    measured = (f"{what} ({shape}) is not a probability distribution: values in [{low:.3g}, {high:.3g}], row sums "
                f"from {float(sums.min()):.3g} to {float(sums.max()):.3g}")
    if recorded is None:  # a softmax between the model and a functional loss would not show in the model's output
        return result(name, "inconclusive", f"{measured}; the loss's own input was not recorded (no loss module)",
                      **facts)
    return result(name, "refuted", f"{measured}: cross_entropy gets logits", **facts)


# ---------------------------------------------------------------------------- relu_activity


def relu_activity(ctx: ProbeContext) -> ProbeResult:
    """Replay the last step and count, per ReLU, the units that stay 0 for every example of the batch."""
    name = "relu_activity"
    try:
        step = last_step(ctx)
    except Unavailable as exc:
        return result(name, "skipped", str(exc))
    model = step.model.module
    names = module_names(model)
    prefix = script_prefix(model)
    seen: list[dict[str, Any]] = []

    largest: dict[int, float] = {}

    def read_input(module: nn.Module, args: Any) -> None:  # before the ReLU runs: an inplace one overwrites it
        if args and isinstance(args[0], torch.Tensor) and args[0].numel():
            largest[id(module)] = float(args[0].detach().max())

    def record(module: nn.Module, args: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.dim() >= 2 and output.numel():
            path = names.get(id(module), "")
            entry = _units(output.detach(), f"module {display_name(prefix + path if path else path, module)}")
            entry["largest_input"] = largest.pop(id(module), None)
            seen.append(entry)

    relus = [m for m in model.modules() if isinstance(m, nn.ReLU)]
    handles = [*(m.register_forward_pre_hook(read_input) for m in relus),
               *(m.register_forward_hook(record) for m in relus)]
    functional: list[dict[str, Any]] = []
    try:
        replay_backward(step, before_backward=lambda loss: functional.extend(_functional_relus(loss)))
    except Unavailable as exc:
        return result(name, "skipped", str(exc))
    except Exception as exc:
        return result(name, "inconclusive", f"replaying the last step raised {exception_line(exc)}")
    finally:
        for handle in handles:
            handle.remove()
    seen = seen or functional  # no nn.ReLU: F.relu / torch.relu, read in the replay's own graph
    if not seen:
        return result(name, "skipped", "the replayed forward runs no ReLU")
    zero_grad = [n for n, p in model.named_parameters()
                 if p.requires_grad and p.grad is not None and not bool(p.grad.any())]
    worst = max(seen, key=lambda e: e["dead"])
    batch = worst["examples"]
    facts = {"relus": [dict(e) for e in seen], "zero_gradient": zero_grad,
             "dead_fraction": worst["dead"], "where": worst["label"]}
    largest = worst.get("largest_input")
    pre = f"; its largest input is {largest:.3g}" if largest is not None else ""
    if worst["dead"] >= DEAD_UNITS and zero_grad:
        return result(name, "confirmed",
                      f"replaying the last batch ({batch} examples), {worst['dead_units']} of {worst['units']} units "
                      f"of {worst['label']} ({worst['dead']:.0%}) are 0 for every example{pre}; the replayed backward "
                      f"gives {shown(zero_grad, prefix)} a gradient of exactly 0", **facts)
    if worst["dead"] < ALIVE_UNITS:
        return result(name, "refuted",
                      f"replaying the last batch ({batch} examples), at most {worst['dead']:.0%} of the units of any "
                      "of the "
                      f"{len(seen)} ReLUs are 0 for every example: the ReLUs pass gradients", **facts)
    return result(name, "inconclusive",
                  f"replaying the last batch ({batch} examples), {worst['dead']:.0%} of the units of {worst['label']} "
                  f"are 0 for every example{pre}" + ("" if zero_grad else ", but no parameter's gradient is exactly 0"),
                  **facts)


def _units(output: torch.Tensor, label: str) -> dict[str, Any]:
    """How many of a ReLU output's units (everything but the batch dimension) are 0 for every example."""
    active = (output != 0).reshape(output.shape[0], -1).any(dim=0)
    units = int(active.numel())
    dead_units = units - int(active.sum())
    return {"label": label, "shape": list(output.shape), "examples": int(output.shape[0]), "units": units,
            "dead_units": dead_units, "dead": dead_units / units if units else 0.0}


def _functional_relus(loss: torch.Tensor | None) -> list[dict[str, Any]]:
    """ReLU outputs saved in the graph (`F.relu`, `torch.relu`), read from the replayed loss's graph."""
    found: list[dict[str, Any]] = []
    if loss is None or loss.grad_fn is None:
        return found
    for node in autograd_nodes([loss.grad_fn], 20_000):
        if type(node).__name__ == "ReluBackward0":
            try:
                saved = node._saved_result
            except RuntimeError:  # freed by the backward already run
                saved = None
            if isinstance(saved, torch.Tensor) and saved.dim() >= 2:
                found.append(_units(saved.detach(), f"a functional relu of shape {list(saved.shape)}"))
    return found


# ---------------------------------------------------------------------------- gradient_reach


def gradient_reach(ctx: ProbeContext) -> ProbeResult:
    """Replay forward, loss and backward; name the parameters left without a gradient and where the graph is cut."""
    name = "gradient_reach"
    try:
        step = last_step(ctx)
        replay = replay_backward(step, record_calls=True)
    except Unavailable as exc:
        return result(name, "skipped", str(exc))
    except Exception as exc:
        return result(name, "inconclusive", f"replaying the last step raised {exception_line(exc)}")
    model = step.model.module
    listed = str((ctx.diagnosis.values if ctx.diagnosis is not None else {}).get("params", ""))
    wanted = names_of(listed)
    if listed and not wanted:
        return result(name, "skipped", f"the finding names no parameter of the model ({listed}): a replay of the "
                      "model cannot reach parameters no module holds")
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if wanted:
        trainable = [(n, p) for n, p in trainable if matches(n, wanted)]
        if not trainable:
            return result(name, "skipped", f"none of {shown(wanted)} is a parameter of the replayed model "
                          f"({type(model).__name__}) that requires grad")
    prefix = script_prefix(model)
    unreached = [n for n, p in trainable if p.grad is None]
    reached = [n for n, p in trainable if p.grad is not None]
    facts = {"unreached": unreached, "reached": reached, "loss": replay.loss_source}
    if not unreached:
        return result(name, "refuted", f"a replay of the last step (forward, {replay.loss_source}, backward) gives all "
                      f"{len(reached)} of {shown(reached, prefix)} a gradient: the path to the loss is not cut",
                      **facts)
    cut = _where_cut(model, replay.calls, set(unreached))
    facts["cut_after"] = cut
    where = ""
    if cut is not None:
        path, output_has_grad = cut
        module = model.get_submodule(path) if path else model
        parent = type(model.get_submodule(path.rpartition(".")[0]) if "." in path else model).__name__
        label = display_name(prefix + path, module)
        where = (f"; the output of {label} requires grad, so the graph is cut after it, in {parent}.forward"
                 if output_has_grad else
                 f"; the output of {label} already has no grad_fn: the cut is inside its forward")
    return result(name, "confirmed",
                  f"a replay of the last step (forward, {replay.loss_source}, backward) leaves .grad None on "
                  f"{shown(unreached, prefix)} ({len(unreached)} parameters that require grad){where}", **facts)


def _where_cut(model: nn.Module, calls: list[tuple[str, bool, bool]], unreached: set[str]) -> tuple[str, bool] | None:
    """(path, whether its output requires grad) of the outermost module whose parameters all went without a
    gradient: the cut follows its output (or is inside it, when its output has no grad_fn)."""
    called = {path: out for path, _, out in calls}
    cut = [path for path, module in model.named_modules() if path in called and path and
           (params := [f"{path}.{n}" for n, p in module.named_parameters() if p.requires_grad]) and
           all(p in unreached for p in params)]
    if not cut:
        return None
    outermost = min(cut, key=lambda path: path.count("."))  # named_modules lists a parent before its children
    return outermost, called[outermost]


# ---------------------------------------------------------------------------- grad_carryover


def grad_carryover(ctx: ProbeContext) -> ProbeResult:
    """Compare `.grad` as the run left it with the gradient one replay of the last step gives from zero."""
    name = "grad_carryover"
    try:
        step = last_step(ctx)
    except Unavailable as exc:
        return result(name, "skipped", str(exc))
    late = _called_after_last_step()
    if late:
        return result(name, "skipped", late)
    model = step.model.module
    stored = {n: p.grad.detach().clone() for n, p in model.named_parameters()
              if p.requires_grad and p.grad is not None and p.grad.is_floating_point()}
    if not stored:
        return result(name, "refuted", "every parameter's .grad is None at the end of the run: the gradients were "
                      "cleared after the last step")
    try:
        replay_backward(step, need_loss=True)
    except Unavailable as exc:
        return result(name, "skipped", str(exc))
    except Exception as exc:
        return result(name, "inconclusive", f"replaying the last step raised {exception_line(exc)}")
    fresh = {n: p.grad.detach() for n, p in model.named_parameters() if n in stored and p.grad is not None}
    if not fresh:
        return result(name, "inconclusive", "the replayed backward gave no parameter a gradient")
    fresh_norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in fresh.values()))
    stored_norm = math.sqrt(sum(float(stored[n].double().pow(2).sum()) for n in fresh))
    extra = math.sqrt(sum(float((stored[n].double() - g.double()).pow(2).sum()) for n, g in fresh.items()))
    if fresh_norm == 0:
        return result(name, "inconclusive", "the replayed step's gradient is exactly 0: nothing to compare with")
    ratio = extra / fresh_norm
    facts = {"stored_norm": stored_norm, "step_norm": fresh_norm, "extra": ratio, "parameters": len(fresh)}
    measured = (f".grad as the run left it has norm {stored_norm:.4g}; one replay of the last step from zero gives "
                f"{fresh_norm:.4g} over the same {len(fresh)} parameters")
    if ratio >= CARRIED:
        return result(name, "confirmed", f"{measured}: .grad holds {ratio:.1f} step gradients' worth beyond the last "
                      "one, so the gradients of earlier steps were never cleared", **facts)
    if ratio <= CLEARED:
        return result(name, "refuted", f"{measured}: .grad is the last step's gradient alone (they differ by "
                      f"{ratio:.0%} of its norm), so the gradients are cleared between steps", **facts)
    return result(name, "inconclusive", f"{measured}: they differ by {ratio:.0%} of the step's norm, neither one "
                  "step's gradient nor clearly several", **facts)


def _called_after_last_step() -> str:
    """Why the recorded call is not the one whose backward filled `.grad` ('' when it is): a model call made after
    the last optimizer step (an evaluation pass) or with no step at all ran on another batch."""
    from ..tracking import TRACKER
    from .calls import is_loss

    calls = [c for c in TRACKER.latest_calls() if c.module is not None and not is_loss(c.module)]
    if not TRACKER.calls_recorded or not calls:
        return ""
    if TRACKER.steps == 0:
        return "no optimizer step was taken: there is no step between gradients to clear"
    last = calls[-1]
    if last.step >= TRACKER.steps:
        return (f"the model's last recorded call ({type(last.module).__name__}) came after the last optimizer step (an "
                "evaluation pass, or accumulation): its batch is not the one whose gradients .grad holds")
    return ""
