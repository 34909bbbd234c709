"""Where a NaN/Inf first appears: replays run once in a disposable child, never per step.

Used by the wrapper when it turns a non-finite loss or gradient into an
incident: the per-step check is a single scalar, and only these one-off
replays look inside. `trace_forward` replays the model's last call with a hook
on every module; `find_origin` replays the user's own statements that led up
to the failure with every torch call watched (OriginLog), and names the first
call that turned finite inputs into NaN/Inf, its inputs' ranges and what that
means (log of 0, exp overflow, std of one element, division by a zero std);
the `nonfinite_origin` experiment does the same for a crash that a NaN/Inf
caused later (Categorical, binary_cross_entropy, multinomial).
"""

from __future__ import annotations

import ast
import linecache
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..diagnosis import ProbeResult
from ._support import Unavailable, iter_tensors
from .context import ProbeContext
from .step import ModelOutput, call, rebuild


@dataclass
class NonFiniteTrace:
    """The first module whose output held NaN/Inf, and the parameters that already did."""

    module: str | None = None
    kind: str | None = None  # "nan" or "inf"
    op: str | None = None  # "log at model.py:20: `h = torch.log(h)` produced nan from finite inputs"
    loss: float | None = None  # the loss of the replayed step, when the loss function and targets are known
    parameters: list[str] = field(default_factory=list)
    note: str = ""


def nonfinite_parameters(model: nn.Module, limit: int = 20) -> list[str]:
    """Names of parameters holding NaN/Inf (reads values: only for a usable device)."""
    bad = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.is_floating_point() and not bool(torch.isfinite(param).all()):
                bad.append(name)
                if len(bad) >= limit:
                    break
    return bad


def nonfinite_gradients(model_or_params, limit: int = 20) -> list[str]:
    """Names of parameters whose .grad holds NaN/Inf."""
    named = (model_or_params.named_parameters() if isinstance(model_or_params, nn.Module)
             else ((f"param{i}", p) for i, p in enumerate(model_or_params)))
    bad = []
    with torch.no_grad():
        for name, param in named:
            grad = param.grad
            if grad is not None and grad.is_floating_point() and not bool(torch.isfinite(grad).all()):
                bad.append(name)
                if len(bad) >= limit:
                    break
    return bad


def trace_forward(ctx: ProbeContext) -> NonFiniteTrace:
    """Replay the model's last call in an experiment's child and name the first module whose output is not finite."""
    from .runner import run_isolated

    if not isinstance(ctx.model, nn.Module):
        return NonFiniteTrace(note="no model to trace")
    parameters = nonfinite_parameters(ctx.model)
    outcome = run_isolated(lambda: _trace_forward(ctx), ctx, ctx.time_limit_s)
    found = outcome.value if isinstance(outcome.value, NonFiniteTrace) else NonFiniteTrace(
        note=outcome.reason or outcome.error or "the replay returned nothing")
    found.parameters = parameters
    return found


def _trace_forward(ctx: ProbeContext) -> NonFiniteTrace:
    found = NonFiniteTrace()
    try:
        step = rebuild(ctx, poisoned=False, with_failing=False)
    except Unavailable as exc:
        found.note = str(exc)
        return found
    if step.model_call is None:
        found.note = "the model's inputs are unknown"
        return found
    names = step.names

    def hook(module, args, output):
        if found.module is not None:
            return
        for _, tensor in iter_tensors(output):
            if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(tensor).all()):
                path = names.get(id(module), "")
                found.module = f"{path} ({type(module).__name__})" if path else type(module).__name__
                found.kind = "nan" if bool(torch.isnan(tensor).any()) else "inf"
                return

    from .anomaly_rerun import OpLog

    handles = [m.register_forward_hook(hook) for m in step.model.module.modules()]
    log = OpLog()
    try:
        with torch.no_grad(), log:
            output = call(step.model_call)
            if step.loss_call is not None:
                loss = call(step.loss_call, output if any(a is ModelOutput for a in step.loss_call.inputs.args)
                            else None)
                if isinstance(loss, torch.Tensor) and loss.numel() == 1:
                    found.loss = float(loss)
    except Exception as exc:  # a replay that fails tells nothing about where NaN starts
        found.note = f"the replay raised {type(exc).__name__}"
    finally:
        for handle in handles:
            handle.remove()
    found.op = log.first_nonfinite
    return found



# ---------------------------------------------------------------------------- where NaN/Inf was born, and why

EXP_OVERFLOW_AT = {torch.float32: 88.72, torch.float64: 709.78, torch.float16: 11.09, torch.bfloat16: 88.72}
_LOGS = {"log", "log_", "log2", "log10", "log1p", "xlogy"}
_EXPS = {"exp", "exp_", "exp2", "expm1", "cosh", "sinh"}
_SPREADS = {"std", "var", "std_mean", "var_mean"}
_DIVISIONS = {"div", "div_", "true_divide", "__truediv__", "__rtruediv__", "__itruediv__", "reciprocal", "rsqrt"}
_SQRTS = {"sqrt", "sqrt_", "rsqrt", "pow", "__pow__"}


@dataclass
class Origin:
    """The first torch call that turned finite inputs into NaN/Inf, its inputs' ranges and what it means."""

    op: str
    site: str  # "file.py:97" (the user's line), "" when no user frame called it
    code: str  # that line's code
    kind: str  # "nan" or "inf"
    cause: str  # log-of-zero | log-of-negative | exp-overflow | std-of-one-element | division-by-zero-std |
    #             division-by-zero | sqrt-of-negative | other
    inputs: list[str] = field(default_factory=list)  # "Float[1] in [1, 1]" per tensor input
    why: str = ""  # the arithmetic, in a sentence

    def facts(self) -> dict[str, Any]:
        return {"op": self.op, "site": self.site, "code": self.code, "kind": self.kind, "cause": self.cause,
                "inputs": self.inputs, "why": self.why}

    def line(self) -> str:
        at = f" at {self.site}" + (f": `{self.code}`" if self.code else "") if self.site else ""
        return (f"`{self.op}`{at} produced {self.kind} from finite inputs ({'; '.join(self.inputs)})"
                + (f": {self.why}" if self.why else ""))


def _describe_input(tensor: torch.Tensor) -> str:
    shape = "x".join(str(n) for n in tensor.shape) or "scalar"
    name = str(tensor.dtype).replace("torch.", "").capitalize()
    if not tensor.numel():
        return f"{name}[{shape}] empty"
    values = tensor.detach().float()
    low, high = float(values.min()), float(values.max())
    zeros = int((values == 0).sum())
    return f"{name}[{shape}] in [{low:.4g}, {high:.4g}]" + (f", {zeros} zero{'s' if zeros != 1 else ''}" if zeros else "")


def _classify(name: str, args: tuple, kwargs: dict, out: list[torch.Tensor], producers: dict[int, str]) -> tuple[str, str]:
    """(cause, why) of a non-finite result from finite inputs, from the op and its inputs' values."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    first = tensors[0] if tensors else None
    base = name.rstrip("_") if not name.startswith("__") else name
    if base in _LOGS and first is not None and first.is_floating_point():
        if bool((first == 0).any()):
            return "log-of-zero", "log(0) = -inf (and 0 * -inf = nan)"
        if bool((first < 0).any()):
            return "log-of-negative", "the log of a negative number is nan"
    if base in _EXPS and first is not None and first.is_floating_point():
        limit = EXP_OVERFLOW_AT.get(first.dtype, 88.72)
        high = float(first.detach().max())
        if high > limit:
            return "exp-overflow", f"exp({high:.4g}) overflows {str(first.dtype).replace('torch.', '')} (exp(x) = inf for x > {limit})"
    if base in _SPREADS and first is not None:
        dims = kwargs.get("dim", args[1] if len(args) > 1 and not isinstance(args[1], (bool, float)) else None)
        reduced = first.numel() // max(1, out[0].numel()) if out else first.numel()
        correction = kwargs.get("correction", 0 if kwargs.get("unbiased") is False else 1)
        if reduced <= (correction if isinstance(correction, (int, float)) else 1):
            over = f" over dim {dims}" if dims is not None else ""
            return "std-of-one-element", (f"{base} of {reduced} element{'s' if reduced != 1 else ''}{over} divides by "
                                          f"n - 1 = {reduced - 1} (Bessel's correction): nan")
    if base in _DIVISIONS:
        denominator = (first if name in ("__rtruediv__", "reciprocal", "rsqrt") else
                       args[1] if len(args) > 1 else kwargs.get("other"))
        if isinstance(denominator, torch.Tensor) and bool((denominator == 0).any()):
            made_by = producers.get(id(denominator), "")
            if made_by.rstrip("_") in _SPREADS | {"norm", "linalg_vector_norm", "sum", "mean"}:
                return "division-by-zero-std", f"the denominator comes from `{made_by}` and is 0 (0 / 0 = nan, x / 0 = inf)"
            return "division-by-zero", "the denominator is 0 (0 / 0 = nan, x / 0 = inf)"
        if isinstance(denominator, (int, float)) and denominator == 0:
            return "division-by-zero", "division by the number 0"
    if base in _SQRTS and first is not None and first.is_floating_point() and bool((first < 0).any()):
        return "sqrt-of-negative", f"{base} of a negative number is nan"
    return "other", ""


class OriginLog(TorchFunctionMode):
    """Notes the first torch call whose output is NaN/Inf while all its inputs are finite, with their ranges."""

    def __init__(self) -> None:
        super().__init__()
        self.origin: Origin | None = None
        self.producers: dict[int, str] = {}  # id(output) -> op, for the tensors of the replay (to tell a std apart)
        self.keep: list[torch.Tensor] = []  # keeps those ids unique while the log lives

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.origin is None:
            try:
                self._note(func, args, kwargs, out)
            except Exception:  # observing must never change what the replay does
                pass
        return out

    def _note(self, func, args, kwargs, out) -> None:
        from .anomaly_rerun import _op_name, _user_site

        name = _op_name(func)
        outs = [t for _, t in iter_tensors(out)]
        for tensor in outs[:1]:
            if len(self.producers) < 100_000:
                self.producers[id(tensor)] = name
                self.keep.append(tensor)
        bad = next((t for t in outs if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all())), None)
        if bad is None:
            return
        inputs = [t for _, t in iter_tensors((args, kwargs))]
        if any(t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()) for t in inputs):
            return  # it only passed on a NaN/Inf born earlier
        cause, why = _classify(name, tuple(args), kwargs, outs, self.producers)
        site = _user_site()
        where, _, code = site.partition(": ")
        self.origin = Origin(op=name, site=_short_site(where), code=code.strip("`"),
                             kind="nan" if bool(torch.isnan(bad).any()) else "inf", cause=cause,
                             inputs=[_describe_input(t) for t in inputs[:3] if t.is_floating_point()], why=why)


def _short_site(where: str) -> str:
    """`/home/ana/proj/train.py:97` as `train.py:97`: the name the report and the labels use."""
    path, _, line = where.rpartition(":")
    return f"{path.replace(chr(92), '/').rsplit('/', 1)[-1]}:{line}" if path else where


def origin_step(frames: list[tuple[Any, int]], include_failing: bool) -> tuple[Any, tuple[str, ...] | None]:
    """The statements to replay to see NaN/Inf being born: those of the innermost user frame that lead up to its
    current line (the loop body's, from its first model, optimizer or user-function call, as source_step finds
    them; in a function without a loop, the function's own statements from its start). `include_failing`: the
    line itself runs too (it raised: an exception's frame); a hook's caller (`loss.backward()`) stops before it.
    A step whose names were rebound after it began is cut to its last statements that read only live values.
    Returns the SourceStep and, for a function replayed from its start, the names of its arguments (the only
    locals it is given)."""
    from . import source_step

    if not frames:
        raise Unavailable("no live frame of the user's code")
    frame, line = frames[-1]
    scope = parse_scope(frame)
    loop = source_step._innermost_loop(scope, line)
    body = loop.body if loop is not None else getattr(scope, "body", [])
    index = next((i for i, stmt in enumerate(body) if stmt.lineno <= line <= stmt.end_lineno), None)
    if index is None:
        raise Unavailable(f"line {line} of {frame.f_code.co_filename} is in no statement of {frame.f_code.co_name}")
    end = index + 1 if include_failing else index
    values = source_step._frame_values(frame)
    first = 0
    if loop is not None:
        first = next((i for i, stmt in enumerate(body[:index]) if source_step._touches_step(stmt, values)), index)
    arguments = _arguments(frame.f_code) if loop is None else None
    for start in range(first, end):
        statements = body[start:end]
        _, stale = source_step._reads(statements)
        if arguments is not None:  # a function's own statements from its start: only its arguments come from before
            stale = set(arguments) & _stores(statements)
        if not stale and runnable(statements):
            return compile_step(frame, statements), arguments
    raise Unavailable(f"no statements before {frame.f_code.co_filename}:{line} can run again with the values the "
                      "frame holds now")


def parse_scope(frame: Any) -> ast.AST:
    """The function (or module) node of a live frame's code, parsed from its file as it is now."""
    from . import source_step

    filename = frame.f_code.co_filename
    try:
        tree = ast.parse("".join(linecache.getlines(filename)), filename)
    except SyntaxError:
        raise Unavailable(f"{filename} does not parse as it is now") from None
    scope = source_step._scope_of(tree, frame.f_code)
    if scope is None:
        raise Unavailable(f"{frame.f_code.co_name} is not found in {filename} as it is now")
    return scope


def runnable(statements: list[ast.stmt]) -> bool:
    """Whether statements of a function can run outside it (no return, yield, await, global or nonlocal)."""
    from . import source_step

    return not any(isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom, ast.Await, ast.Global, ast.Nonlocal))
                   for stmt in statements for node in source_step._walk_scope(stmt))


def compile_step(frame: Any, statements: list[ast.stmt]) -> Any:
    """A SourceStep of the user's statements, compiled with their file name and lines (tracebacks, anomaly mode
    and the observers name the user's lines), inside a one-pass loop so that their break/continue compile."""
    from . import source_step

    filename = frame.f_code.co_filename
    once = ast.For(target=ast.Name("_triage_once", ast.Store()), iter=ast.Tuple([ast.Constant(0)], ast.Load()),
                   body=statements, orelse=[])
    ast.copy_location(once, statements[0])
    module = ast.fix_missing_locations(ast.Module(body=[once], type_ignores=[]))
    code = compile(module, filename, "exec").replace(co_name=frame.f_code.co_name)
    reads, _ = source_step._reads(statements)
    return source_step.SourceStep(filename, (statements[0].lineno, statements[-1].end_lineno), code, frame, reads)


def _arguments(code: Any) -> tuple[str, ...]:
    count = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
    return code.co_varnames[:count]


def _stores(statements: list[Any]) -> set[str]:
    from . import source_step

    loads: list[str] = []
    stores: set[str] = set()
    for stmt in statements:
        source_step._names(stmt, frozenset(), loads, stores)
    return stores


def find_origin(frames: list[tuple[Any, int]], include_failing: bool, ctx: ProbeContext) -> tuple[Origin | None, str]:
    """Replay the user's step in an experiment's child under OriginLog: (the origin or None, what was replayed or why not)."""
    from .runner import run_isolated

    try:
        step, arguments = origin_step(frames, include_failing)
    except Unavailable as exc:
        return None, str(exc)

    def replay() -> tuple[Origin | None, str]:
        local = step.frame.f_locals
        if arguments is not None:  # the function runs from its start: its other locals are its own to bind
            local = {name: local[name] for name in arguments if name in local}
        namespace = {**step.frame.f_globals, **local}
        log = OriginLog()
        error = ""
        try:
            with log:
                step.run(namespace)
        except Exception as exc:  # the failure itself, re-raised by the replay: the origin came before it
            error = f"; the replay raised {type(exc).__name__}"
        return log.origin, f"replayed {step.where}{error}"

    outcome = run_isolated(replay, ctx, ctx.time_limit_s)
    if isinstance(outcome.value, tuple):
        return outcome.value
    return None, outcome.reason or outcome.error or "the replay returned nothing"


def nonfinite_origin(ctx: ProbeContext) -> ProbeResult:
    """The experiment: where the NaN/Inf the failure rejected was born, from the NaN check's earlier finding or by
    replaying the failing step's statements in a child with every torch call watched."""
    from ._support import result

    earlier = ctx.incident.facts.get("nan_origin")
    if isinstance(earlier, dict) and earlier.get("op"):
        found = Origin(**{key: earlier[key] for key in ("op", "site", "code", "kind", "cause", "inputs", "why")})
        how = f"{earlier.get('replayed', 'replayed the step')} {earlier.get('found_at', '')}".strip()
        return result("nonfinite_origin", "confirmed", f"{how}: {found.line()}", **found.facts())
    frames = ctx.frames
    if not frames:
        from .source_step import user_frames

        frames = user_frames(ctx.exception) if ctx.exception is not None else []
    origin, replayed = find_origin(frames, include_failing=ctx.exception is not None, ctx=ctx)
    if origin is None:
        return result("nonfinite_origin", "inconclusive", f"no torch call turned finite values into NaN/Inf ({replayed})")
    return result("nonfinite_origin", "confirmed", f"{replayed}: {origin.line()}", **origin.facts())
