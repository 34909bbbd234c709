"""determinism: replay the last training step twice with the same torch seed and compare every result bit for bit.

The step (the model's last call, the loss and its backward) is rebuilt from the
captured batch and arguments (step.py) and run twice from the same weights,
buffers and `torch.manual_seed(SEED)`. Forward hooks record each module's output
in the order the modules finish, so the first one that differs is where the
difference starts; then the gradients are compared parameter by parameter.

Only torch's generator is seeded, on purpose: that is what a user's
`torch.manual_seed` covers, and randomness drawn from Python's `random`, NumPy
or the clock is exactly the non-determinism it leaves. When the replays differ
they are repeated under `torch.use_deterministic_algorithms(True)`: an op
without a deterministic kernel then raises and is named; a difference that
persists comes from outside torch's kernels.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..diagnosis import ProbeResult
from ._support import Unavailable, display_name, exception_line, module_names, result
from .context import ProbeContext
from .step import Step, first_tensor, rebuild, replay_from

NAME = "determinism"
SEED = 0
# Sources of randomness torch.manual_seed does not reach, as they are written in a forward's source.
_UNSEEDED_SOURCE = re.compile(r"\b(?:np|numpy)\.random\.\w+|\brandom\.(?:random|gauss|uniform|randint|choice|shuffle|"
                              r"sample|normalvariate)\b|\btime\.(?:time|time_ns|perf_counter)\(\)|\bos\.urandom\b")


@dataclass
class Replay:
    """What one replay produced: module outputs in completion order, the loss, and each parameter's gradient."""

    outputs: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    loss: torch.Tensor | None = None
    grads: dict[str, torch.Tensor] = field(default_factory=dict)


def determinism(ctx: ProbeContext) -> ProbeResult:
    try:
        step = rebuild(ctx, poisoned=False, with_failing=False)
    except Unavailable as exc:
        return result(NAME, "skipped", str(exc))
    if step.model_call is None or step.model is None:
        return result(NAME, "skipped", "the model's last call could not be rebuilt from the captured batch")
    model = step.model.module
    initial = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
    where = f"step {ctx.step}" if ctx.step is not None else "the last step"
    try:
        first, second = _replay(step, initial), _replay(step, initial)
    except Exception as exc:  # the replay itself failed: nothing to compare
        return result(NAME, "inconclusive", f"replaying {where} raised {exception_line(exc)}")
    difference = _first_difference(first, second)
    compared = f"{len(first.outputs)} module outputs and {len(first.grads)} gradients"
    if difference is None:
        return result(NAME, "refuted", f"two replays of {where} with torch.manual_seed({SEED}) and the same batch give "
                      f"bit-identical results ({compared}): the step is deterministic", compared=compared)
    what, path = difference
    module = _module_at(model, path)
    label = display_name(path, module) if module is not None else path or type(model).__name__
    label = f"module {label}" if path else f"the model ({label})"
    detail = (f"two replays of {where} with torch.manual_seed({SEED}) and the same batch differ; the first "
              f"difference is {what} of {label}")
    facts: dict[str, Any] = {"module": path, "differs": what}
    return _under_deterministic_algorithms(step, initial, module, detail, facts)


def _under_deterministic_algorithms(step: Step, initial: dict[str, torch.Tensor], module: nn.Module | None,
                                    detail: str, facts: dict[str, Any]) -> ProbeResult:
    """Replay twice more with deterministic kernels: name the op that has none, or say the cause is outside torch."""
    previous, previous_warn = torch.are_deterministic_algorithms_enabled(), \
        torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        first, second = _replay(step, initial), _replay(step, initial)
    except RuntimeError as exc:
        if "deterministic implementation" in str(exc):  # the op with no deterministic kernel names itself
            facts["op"] = exception_line(exc)
        return result(NAME, "confirmed", f"{detail}; under torch.use_deterministic_algorithms(True) the replay "
                      f"raises {exception_line(exc)}", **facts)
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=previous_warn)
    if _first_difference(first, second) is None:
        return result(NAME, "confirmed", f"{detail}; under torch.use_deterministic_algorithms(True) the replays agree: "
                      "a non-deterministic kernel is the cause", **facts)
    source = _unseeded_source(module)
    facts["source"] = source
    cause = (f": its forward draws from `{source}`, which torch.manual_seed does not seed" if source else
             ": the randomness comes from outside torch's generator (Python's random, NumPy, the clock)")
    return result(NAME, "confirmed", f"{detail}; they still differ under torch.use_deterministic_algorithms(True)"
                  f"{cause}", **facts)


def _replay(step: Step, initial: dict[str, torch.Tensor]) -> Replay:
    """One replay from the same weights, buffers and torch seed, with every module's output recorded."""
    model = step.model.module
    replay = Replay()
    names = module_names(model)

    def record(module: nn.Module, args: Any, output: Any) -> None:
        tensor = first_tensor(output)
        if tensor is not None:
            replay.outputs.append((names.get(id(module), ""), tensor.detach().clone()))

    handles = [m.register_forward_hook(record) for m in model.modules()]
    try:
        run = replay_from(step, initial, SEED)
    finally:
        for handle in handles:
            handle.remove()
    replay.loss, replay.grads = run.loss, run.grads
    return replay


def _first_difference(first: Replay, second: Replay) -> tuple[str, str] | None:
    """('the output' | 'the gradient of NAME', module path) of the first thing that differs; None if all are equal."""
    for (path, a), (_, b) in zip(first.outputs, second.outputs):
        if not _same_bits(a, b):
            return "the output", path
    if len(first.outputs) != len(second.outputs):
        return "the number of module calls", ""
    if (first.loss is None) != (second.loss is None) or (first.loss is not None and not _same_bits(first.loss,
                                                                                                    second.loss)):
        return "the loss", ""
    for name, a in first.grads.items():
        b = second.grads.get(name)
        if b is None or not _same_bits(a, b):
            return f"the gradient of {name}", name.rpartition(".")[0]
    return None


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaN == NaN with the same payload, -0.0 != 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.contiguous().reshape(-1), b.contiguous().reshape(-1)
    if a.numel() == 0:
        return True
    if a.dtype == torch.bool or a.element_size() == 1:
        return torch.equal(a, b)
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _module_at(model: nn.Module, path: str) -> nn.Module | None:
    try:
        return model.get_submodule(path) if path else model
    except AttributeError:
        return None


def _unseeded_source(module: nn.Module | None) -> str | None:
    """`np.random.randn` when the module's forward draws from a generator torch.manual_seed does not seed."""
    if module is None:
        return None
    try:
        source = inspect.getsource(type(module).forward)
    except (OSError, TypeError):
        return None
    found = _UNSEEDED_SOURCE.search(source)
    return found.group(0) if found else None

