"""compile_compare: replay the last step eagerly and through torch.compile; compare the output and per-module gradients.

For a model wrapped in torch.compile (an OptimizedModule, whose `_orig_mod` is
the eager model) the captured step is replayed twice from the same weights and
torch seed: once through `_orig_mod`, once through the compiled module. Compiled
kernels fuse and reorder float arithmetic, so results equal to the last bit are
not expected; a difference beyond RTOL/ATOL is. Gradients are compared per
module (the parameters it owns directly), in the model's parameter order. Forward
hooks cannot report per-module outputs here: hooks added to a compiled model
after its first call are not guarded by dynamo, and would be skipped.

The compiled replay runs the code dynamo cached during the run, not a new
compilation: a recompile would trace the model as it is now (hooks added late
included) and hide the very difference looked for. In the experiment's child
torch runs one thread (OpenMP does not survive fork), which fails dynamo's
global-state guard on the thread count; so the cached entry is chosen by its
guards with the parent's thread count set for the check only, and its code
called directly, on one thread.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import types
from contextlib import contextmanager
from typing import Any, Callable, Iterator

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
        compiled_run = replay_from(step, initial, SEED, through=_cached_or_compiled(compiled))
    except Exception as exc:  # no C++ compiler, an unsupported op: the comparison cannot be made
        return result(NAME, "inconclusive", f"the compiled replay raised {exception_line(exc)}")
    return _compare(eager, eager_run, compiled_run)


def _cached_or_compiled(compiled: nn.Module) -> Callable[..., Any]:
    """A callable running the code dynamo cached for the model's calls; the compiled module when none was cached."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    eager = compiled._orig_mod
    wrapped = getattr(compiled.forward, "_torchdynamo_orig_callable", None)
    # torch.nn containers are compiled through a wrapper frame (`inner(*args, **kwargs)`) that runs their hooks;
    # other modules through their own forward, with hooks run outside the compiled code.
    candidates = [(wrapped, ()), (getattr(type(eager), "forward", None), (eager,))]
    for function, bound in candidates:
        code = getattr(function, "__code__", None)
        entries = _debug_get_cache_entry_list(code) if code is not None else []
        if entries:
            return functools.partial(_run_cached, function, bound, entries)
    return compiled


def _run_cached(function: types.FunctionType, bound: tuple, entries: list, *args: Any, **kwargs: Any) -> Any:
    """Call the first cache entry whose guards accept these arguments, as dynamo would, but without recompiling."""
    arguments = inspect.signature(function).bind(*bound, *args, **kwargs)
    arguments.apply_defaults()
    frame_locals = dict(arguments.arguments)
    for name, cell in zip(function.__code__.co_freevars, function.__closure__ or ()):
        frame_locals[name] = cell.cell_contents
    with _threads(_compile_time_threads()):
        entry = next((e for e in entries if e.guard_manager.check(frame_locals)), None)
    if entry is None:
        raise RuntimeError(f"none of the {len(entries)} compiled versions dynamo cached accepts this step's inputs")
    cached = types.FunctionType(entry.code, function.__globals__, function.__name__, function.__defaults__,
                                function.__closure__)
    return cached(*bound, *args, **kwargs)


def _compile_time_threads() -> int:
    from .sandbox import parent_threads

    return parent_threads() or torch.get_num_threads()


@contextmanager
def _threads(count: int) -> Iterator[None]:
    """torch's thread count set to `count` while guards are checked (no parallel region runs meanwhile)."""
    before = torch.get_num_threads()
    if count != before:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if count != before:
            torch.set_num_threads(before)


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
    hooks = _module_hooks(eager)
    facts["hooks"] = hooks
    held = (f"; the model holds hooks, which dynamo does not guard (one registered after the first compiled call is "
            f"missing from the compiled code): {', '.join(hooks[:4])}" if hooks else "")
    return result(NAME, "confirmed", f"the compiled model and its eager `_orig_mod` differ in {what} for the same "
                  f"step and weights (largest difference {largest:.3g}, beyond rtol {RTOL:g}){where}"
                  + (f"; gradients differ in {named}" if len(modules) > 1 else "") + held, **facts)


def _module_hooks(model: nn.Module) -> list[str]:
    """The forward (pre-)hooks on the model and its submodules, as `forward pre-hook NAME on MODULE (file:line)`."""
    found = []
    for path, module in model.named_modules():
        for kind, hooks in (("forward pre-hook", module._forward_pre_hooks), ("forward hook", module._forward_hooks)):
            for hook in hooks.values():
                if getattr(hook, "_triage_hook", False):
                    continue
                code = getattr(hook, "__code__", None)
                where = f" ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})" if code is not None else ""
                owner = f"module {display_name(path, module)}" if path else "the model"
                found.append(f"{kind} {getattr(hook, '__qualname__', type(hook).__name__)} on {owner}{where}")
    return found


def _gap(a: torch.Tensor | None, b: torch.Tensor | None) -> float | None:
    """The largest absolute difference when a and b are not close; None when they are (or both are absent)."""
    if a is None and b is None:
        return None
    if a is None or b is None or a.shape != b.shape:
        return float("inf")
    if torch.allclose(a.float(), b.float(), rtol=RTOL, atol=ATOL, equal_nan=True):
        return None
    return float((a.float() - b.float()).abs().nan_to_num(float("inf")).max())
