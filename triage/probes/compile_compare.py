"""compile_compare: replay the last step eagerly and through torch.compile; compare the output and per-module gradients.

For a model wrapped in torch.compile (an OptimizedModule, whose `_orig_mod` is
the eager model) the captured step is replayed twice from the same weights and
torch seed: once through `_orig_mod`, once through the compiled module. Compiled
kernels fuse and reorder float arithmetic, so results equal to the last bit are
not expected; a difference beyond RTOL/ATOL is. Gradients are compared per
module (the parameters it owns directly), in the model's parameter order. Forward
hooks cannot report per-module outputs here: hooks added to a compiled model
after its first call are not guarded by dynamo, and would be skipped.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import torch
from torch import nn

from ..diagnosis import ProbeResult
from ._support import Unavailable, display_name, exception_line, result
from .context import ProbeContext
from .step import StepRun, rebuild, replay_from

NAME = "compile_compare"
SEED = 0
RTOL, ATOL = 1e-3, 1e-5  # float32 rounding of fused kernels stays far inside these


def compile_compare(ctx: ProbeContext) -> ProbeResult:
    compiled = _compiled_model(ctx.model)
    if compiled is None:  # nothing compiled: a compiled-versus-eager mismatch cannot be the cause
        if ctx.model is None:
            return result(NAME, "skipped", "no live model to compare")
        return result(NAME, "refuted", f"the model ({type(ctx.model).__name__}) is not wrapped in torch.compile: "
                      "it runs eagerly")
    eager = compiled._orig_mod
    try:  # the step is rebuilt around the eager module; the compiled one shares its parameters
        step = rebuild(dataclasses.replace(ctx, model=eager), poisoned=False, with_failing=False)
    except Unavailable as exc:
        return result(NAME, "skipped", str(exc))
    if step.model_call is None:
        return result(NAME, "skipped", "the model's last call could not be rebuilt from the captured batch")
    initial = {k: v.detach().clone() for k, v in eager.state_dict(keep_vars=True).items()}
    try:
        eager_run = replay_from(step, initial, SEED)
    except Exception as exc:
        return result(NAME, "inconclusive", f"the eager replay raised {exception_line(exc)}")
    try:
        compiled_run = replay_from(step, initial, SEED, through=compiled)
    except Exception as exc:  # no C++ compiler, an unsupported op: the comparison cannot be made
        return result(NAME, "inconclusive", f"the compiled replay raised {exception_line(exc)}")
    return _compare(eager, eager_run, compiled_run)


def _compiled_model(model: Any) -> Any:
    """The OptimizedModule: the model itself, or the script's global that wraps it."""
    if isinstance(model, nn.Module) and isinstance(getattr(model, "_orig_mod", None), nn.Module):
        return model
    main = sys.modules.get("__main__")
    for value in list(getattr(main, "__dict__", {}).values()):
        inner = getattr(value, "_orig_mod", None) if isinstance(value, nn.Module) else None
        if isinstance(inner, nn.Module) and (model is None or inner is model):
            return value
    return None


def _compare(eager: nn.Module, first: StepRun, second: StepRun) -> ProbeResult:
    differs: list[str] = []
    worst: dict[str, float] = {}
    for key in ("output", "loss"):
        gap = _gap(getattr(first, key), getattr(second, key))
        if gap is not None:
            differs.append(f"the {key}")
            worst[key] = gap
    modules: list[str] = []
    for name, grad in first.grads.items():
        gap = _gap(grad, second.grads.get(name))
        path = name.rpartition(".")[0]
        if gap is not None and path not in modules:
            modules.append(path)
            worst[f"grad {name}"] = gap
    facts = {"differs": differs, "modules": modules, "max_abs_difference": worst}
    if not differs and not modules:
        return result(NAME, "refuted", f"eager and compiled replays of the step agree on the output, the loss and "
                      f"{len(first.grads)} gradients (rtol {RTOL:g}, atol {ATOL:g})", **facts)
    named = ", ".join(display_name(m, eager.get_submodule(m)) if m else type(eager).__name__ for m in modules[:4])
    where = f"; the first module whose gradients differ is module {named.split(', ')[0]}" if modules else ""
    what = " and ".join(differs) or "the gradients"
    largest = max(worst.values())
    return result(NAME, "confirmed", f"the compiled model and its eager `_orig_mod` differ in {what} for the same "
                  f"step and weights (largest difference {largest:.3g}, beyond rtol {RTOL:g}){where}"
                  + (f"; gradients differ in {named}" if len(modules) > 1 else ""), **facts)


def _gap(a: torch.Tensor | None, b: torch.Tensor | None) -> float | None:
    """The largest absolute difference when a and b are not close; None when they are (or both are absent)."""
    if a is None and b is None:
        return None
    if a is None or b is None or a.shape != b.shape:
        return float("inf")
    if torch.allclose(a.float(), b.float(), rtol=RTOL, atol=ATOL, equal_nan=True):
        return None
    return float((a.float() - b.float()).abs().nan_to_num(float("inf")).max())
