"""grad_graph: find where an autograd failure's graph was cut, carried over, or left unreduced.

- "does not require grad and does not have a grad_fn": the failing step is
  replayed (its own statements, in the experiment's child) with a
  TorchFunctionMode that notes the first op whose inputs require grad but whose
  output does not: an op run with gradient tracking off (`torch.no_grad()`,
  `inference_mode`, a `@torch.no_grad()` decorator: the source says which), or a
  `.detach()` / `.item()` on the way to the loss. With no cut, frozen parameters.
- "backward through the graph a second time": the failing loop's body is read for
  names it reads before rebinding them (carried from the previous iteration, such
  as an RNN's hidden state); one that holds a tensor with a grad_fn carries the
  freed graph. Two `.backward(` calls in one body are the other cause.
- "grad can be implicitly created only for scalar outputs": the shape of the
  tensor backward() was called on.
- "optimizer got an empty parameter list": the trainable parameters of the user's
  modules in the failing frame (all frozen, or a consumed `parameters()` generator).
"""

from __future__ import annotations

import ast
import inspect
import linecache
import traceback
import types
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..diagnosis import ProbeResult
from ..incident import is_user_path
from . import source_step
from ._support import Unavailable, innermost_user_frame, iter_tensors, result, torch_frame_locals
from .context import ProbeContext

NAME = "grad_graph"
_DETACHING = {"detach", "detach_", "item", "tolist", "numpy"}
_GRAD_OFF = ("no_grad", "inference_mode", "set_grad_enabled")


def grad_graph(ctx: ProbeContext) -> ProbeResult:
    message = str(ctx.exception) if ctx.exception is not None else ""
    if "does not require grad and does not have a grad_fn" in message:
        return _graph_cut(ctx)
    if "backward through the graph a second time" in message:
        return _carried_graph(ctx)
    if "implicitly created only for" in message:
        return _non_scalar(ctx)
    if "empty parameter list" in message:
        return _empty_parameters(ctx)
    return result(NAME, "skipped", "the failure is not one this experiment reads (no grad_fn, backward twice, "
                  "non-scalar backward, empty parameter list)")


# ------------------------------------------------------------------------------------------ graph cut


@dataclass
class Cut:
    """An op whose inputs required grad and whose output does not."""

    op: str
    reason: str  # "grad mode off" or the detaching op's name
    frame: traceback.FrameSummary | None


class _CutRecorder(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.cuts: list[Cut] = []

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if len(self.cuts) < 50 and _requires_grad(args, kwargs):
            name = getattr(func, "__name__", str(func))
            if name in _DETACHING:
                self.cuts.append(Cut(name, f".{name}()", innermost_user_frame(traceback.extract_stack())))
            elif not torch.is_grad_enabled() and not _requires_grad((out,), None):
                self.cuts.append(Cut(name, "grad mode off", innermost_user_frame(traceback.extract_stack())))
        return out


def _requires_grad(args: Any, kwargs: Any) -> bool:
    return any(t.requires_grad for _path, t in iter_tensors((args, kwargs or {})))


def _graph_cut(ctx: ProbeContext) -> ProbeResult:
    try:
        step = source_step.find(ctx.frames)
        namespace, modules = step.namespace()
    except Unavailable as exc:
        at_call = _model_called_without_grad(ctx)
        return at_call or result(NAME, "skipped", f"the failing step cannot be replayed: {exc}")
    recorder = _CutRecorder()
    try:
        with recorder:
            step.run(namespace)
    except Exception:  # the same failure, expected: the cuts before it are the finding
        pass
    cuts = [c for c in recorder.cuts if c.frame is not None]
    if cuts:
        cut = cuts[-1] if cuts[-1].reason != "grad mode off" else next(c for c in cuts if c.reason == "grad mode off")
        at = f"{cut.frame.filename}:{cut.frame.lineno} in {cut.frame.name}"
        code = (cut.frame.line or "").strip()
        if cut.reason == "grad mode off":
            switch = _grad_switch(cut.frame.filename, cut.frame.lineno)
            detail = (f"replaying {step.where}: `{code}` at {at} runs with gradient tracking off"
                      + (f", {switch[0]}" if switch else "") + ", so what it returns has no grad_fn")
            facts = {"cut_by": switch[1] if switch else "grad mode off", "switch_line": switch[2] if switch else None}
        else:
            detail = f"replaying {step.where}: `{code}` at {at} calls {cut.reason} on a tensor that needs its graph"
            facts = {"cut_by": cut.op}
        return result(NAME, "confirmed", detail, cut_at=at, cut_code=code, **facts)
    frozen = [(label, m) for label, m in modules if _parameter_counts(m)[1] and not _parameter_counts(m)[0]]
    if frozen:
        label, module = frozen[0]
        total = _parameter_counts(module)[1]
        return result(NAME, "confirmed", f"every one of {label}'s {total} parameter tensors has requires_grad=False: "
                      "nothing in the loss can have a gradient", cut_by="frozen", frozen=label)
    at_call = _model_called_without_grad(ctx)  # the replayed statements may not call the model at all
    if at_call is not None:
        return at_call
    return result(NAME, "inconclusive", f"replaying {step.where}, no op cut the graph and the parameters train: "
                  "the loss may be built from a new tensor (torch.tensor(...) of numbers)")


def _model_called_without_grad(ctx: ProbeContext) -> ProbeResult | None:
    """Without a replay that calls the model (a loop that carries its values, an episode of many model calls): the
    model's recorded call, run again with tracking on, shows whether the model itself builds a graph; if it does and
    every call of it in the code the failing frames run (their functions, and the user's functions their loops call)
    sits under a no-grad switch, that switch is where the graph was cut. A mix of calls with and without tracking
    decides nothing (an evaluation loop under no_grad beside the training one)."""
    model = ctx.model if isinstance(ctx.model, nn.Module) else None
    call = _a_call_of(model, ctx)
    if call is None:
        return None
    try:
        with torch.enable_grad():
            out = model(*call[0], **call[1])
    except Exception:
        return None
    if not _requires_grad((out,), None):
        return None  # the model builds no graph even with tracking on: frozen, or cut inside its forward
    sites = [(code, line, _grad_switch(code.co_filename, line)) for code, line in _model_call_sites(model, ctx.frames)]
    if not sites or any(switch is None for _, _, switch in sites):
        return None
    code, line, switch = sites[0]
    text = linecache.getline(code.co_filename, line).strip()
    at = f"{code.co_filename}:{line} in {code.co_name}"
    every = f" (as do all {len(sites)} calls of it the failing code runs)" if len(sites) > 1 else ""
    return result(NAME, "confirmed", f"{type(model).__name__} builds a graph when called with tracking on (its output "
                  f"requires grad), but `{text}` at {at} calls it with gradient tracking off, {switch[0]}{every}, so "
                  f"what it returns has no grad_fn", cut_at=at, cut_code=text, cut_by=switch[1], switch_line=switch[2])


def _a_call_of(model: nn.Module | None, ctx: ProbeContext) -> tuple[tuple, dict] | None:
    """Arguments the model was called with: the step's recorded call, else its latest call the runner recorded (any
    one shows whether the model builds a graph, even when no single call replays the step)."""
    if model is None:
        return None
    if ctx.model_args is not None:
        return tuple(ctx.model_args), dict(ctx.model_kwargs or {})
    from ..tracking import TRACKER

    latest = next((c for c in reversed(TRACKER.latest_calls()) if c.module is model), None)
    return (tuple(latest.args), dict(latest.kwargs)) if latest is not None else None


def _model_call_sites(model: nn.Module, frames: list[tuple[types.FrameType, int]]) -> list[tuple[types.CodeType, int]]:
    """(code, line) of each call of `model` in the functions the failing frames run and in the user's functions
    called from the loop (or function) around each frame's line, found by resolving names in the frames."""
    functions: dict[types.CodeType, dict[str, Any]] = {}
    for frame, line in frames:
        functions.setdefault(frame.f_code, {**frame.f_globals, **frame.f_locals})
        node = _definition(frame.f_code)
        if node is None:
            continue
        body = _innermost_loop(node, line) or node
        scope = {**frame.f_globals, **frame.f_locals}
        for called in (n for n in _own_nodes(body) if isinstance(n, ast.Call)):
            target = _resolve(called.func, scope)
            code = getattr(inspect.unwrap(target), "__code__", None) if callable(target) else None
            if isinstance(code, types.CodeType) and is_user_path(code.co_filename):
                functions.setdefault(code, inspect.unwrap(target).__globals__)
    sites = []
    for code, scope in functions.items():
        node = _definition(code)
        if node is None:
            continue
        names = {name for name, value in scope.items() if value is model}
        for called in (n for n in _own_nodes(node) if isinstance(n, ast.Call)):
            if _resolve(called.func, scope) is model or (isinstance(called.func, ast.Name) and called.func.id in names):
                sites.append((code, called.lineno))
    return sorted(set(sites), key=lambda site: (site[0].co_filename, site[1]))


def _definition(code: types.CodeType) -> ast.AST | None:
    """The def (or the module) whose code `code` is, parsed from its file."""
    try:
        tree = ast.parse("".join(linecache.getlines(code.co_filename)))
    except (SyntaxError, ValueError):
        return None
    if code.co_name == "<module>":
        return tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == code.co_name and (
                code.co_firstlineno in (node.lineno, *(d.lineno for d in node.decorator_list))):
            return node
    return None


def _own_nodes(root: ast.AST) -> list[ast.AST]:
    """The nodes of `root`'s own code: nested functions, classes and lambdas run as other code objects."""
    found, stack = [], [root]
    while stack:
        node = stack.pop()
        found.append(node)
        stack.extend(child for child in ast.iter_child_nodes(node)
                     if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)))
    return found


def _innermost_loop(node: ast.AST, line: int) -> ast.AST | None:
    loops = [n for n in _own_nodes(node) if isinstance(n, (ast.For, ast.While, ast.AsyncFor))
             and n.lineno <= line <= (n.end_lineno or n.lineno)]
    return max(loops, key=lambda n: n.lineno) if loops else None


def _resolve(func: ast.expr, scope: dict[str, Any]) -> Any:
    """What a called name refers to in `scope` (`policy`, `self.policy`, `agent.act`), or None."""
    if isinstance(func, ast.Name):
        return scope.get(func.id)
    if isinstance(func, ast.Attribute):
        owner = _resolve(func.value, scope)
        try:
            return inspect.getattr_static(owner, func.attr) if isinstance(owner, type) else getattr(owner, func.attr, None)
        except Exception:
            return None
    return None


def _grad_switch(filename: str, line: int) -> tuple[str, str, int] | None:
    """What turned gradient tracking off around `filename:line`: ('its @torch.no_grad() decorator (line 13)',
    'no_grad', 13), or an enclosing `with torch.no_grad():`; None when the source does not show it."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return None
    found = None
    for node in ast.walk(tree):
        if not (getattr(node, "lineno", 0) <= line <= (getattr(node, "end_lineno", 0) or 0)):
            continue
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                name = _switch_name(item.context_expr)
                if name and (found is None or node.lineno > found[2]):
                    found = (f"inside `with {ast.unparse(item.context_expr)}:` (line {node.lineno})", name, node.lineno)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                name = _switch_name(decorator)
                if name and (found is None or decorator.lineno > found[2]):
                    found = (f"in {node.name}, under its @{ast.unparse(decorator)} decorator (line {decorator.lineno})",
                             name, decorator.lineno)
    return found


def _switch_name(node: ast.AST) -> str | None:
    text = ast.unparse(node)
    return next((name for name in _GRAD_OFF if name in text), None)


def _parameter_counts(module: nn.Module) -> tuple[int, int]:
    params = list(module.parameters())
    return sum(p.requires_grad for p in params), len(params)


# ------------------------------------------------------------------------------------------ backward twice


def _carried_graph(ctx: ProbeContext) -> ProbeResult:
    frames = source_step.user_frames(ctx.exception)
    for frame, line in reversed(frames):
        carried, backward_lines = source_step.loop_carried(frame, line)
        if not carried and not backward_lines:
            if frame is frames[-1][0] and len(earlier := _backward_calls_up_to(frame, line)) >= 2:
                # no loop around the failing backward, but the same function backpropagated before it
                lines = ", ".join(str(n) for n in earlier)
                return result(NAME, "confirmed", f"{frame.f_code.co_name} calls backward at lines {lines} of "
                              f"{_short(frame.f_code.co_filename)}: the second backward walks the graph the first "
                              "one freed", carried_graph=[], backward_lines=earlier, loop_in=None)
            continue
        holding = [(name, t) for name in carried for _path, t in iter_tensors(frame.f_locals.get(name))
                   if t.grad_fn is not None]
        names = list(dict.fromkeys(name for name, _t in holding))
        file = frame.f_code.co_filename
        facts = {"carried_graph": names, "backward_lines": backward_lines, "loop_in": frame.f_code.co_name}
        if names:
            grad_fn = type(holding[0][1].grad_fn).__name__
            return result(NAME, "confirmed", f"`{names[0]}` is carried from one iteration of the loop in "
                          f"{frame.f_code.co_name} ({_short(file)}:{line}) to the next with its graph "
                          f"(grad_fn={grad_fn}): each backward reaches into the previous iteration's graph, "
                          "already freed", **facts)
        if len(backward_lines) >= 2:
            lines = ", ".join(str(n) for n in backward_lines)
            return result(NAME, "confirmed", f"the loop in {frame.f_code.co_name} calls backward at lines {lines} "
                          f"of {_short(file)}: the second backward walks the graph the first one freed", **facts)
        return result(NAME, "inconclusive", f"no value carried across iterations of the loop in "
                      f"{frame.f_code.co_name} holds a graph, and it calls backward once: a tensor with a graph "
                      "made before the loop may be reused in it", **facts)
    return result(NAME, "skipped", "the failing backward is in no loop of the user's code")


def _backward_calls_up_to(frame: types.FrameType, line: int) -> list[int]:
    """The lines of the `.backward(` calls in `frame`'s function, up to and including `line`."""
    try:
        tree = ast.parse("".join(linecache.getlines(frame.f_code.co_filename)))
    except (SyntaxError, ValueError):
        return []
    scope = source_step._scope_of(tree, frame.f_code)
    if scope is None:
        return []
    return sorted({node.lineno for node in source_step._walk_scope(scope) if isinstance(node, ast.Call)
                   and isinstance(node.func, ast.Attribute) and node.func.attr == "backward" and node.lineno <= line})


def _short(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


# ------------------------------------------------------------------------------------------ non-scalar, empty


def _non_scalar(ctx: ProbeContext) -> ProbeResult:
    tensor = (torch_frame_locals(ctx.exception, "_tensor.py", "backward") or {}).get("self")
    if not isinstance(tensor, torch.Tensor):
        return result(NAME, "skipped", "the tensor backward() was called on is not on the failing stack")
    shape = list(tensor.shape)
    return result(NAME, "confirmed", f"backward() was called on a tensor of shape {shape} ({tensor.numel()} "
                  "values), not a single number", shape=shape, numel=tensor.numel())


def _empty_parameters(ctx: ProbeContext) -> ProbeResult:
    frames = source_step.user_frames(ctx.exception)
    modules: dict[str, tuple[int, int]] = {}
    for frame, _line in reversed(frames):
        for label, value in frame.f_locals.items():
            if isinstance(value, nn.Module) and not isinstance(value, types.ModuleType):
                modules.setdefault(label, _parameter_counts(value))
        if modules:
            break
    if not modules:
        return result(NAME, "skipped", "no model in the frame that built the optimizer")
    facts = {"modules": {label: {"trainable": t, "total": n} for label, (t, n) in modules.items()}}
    label, (trainable, total) = max(modules.items(), key=lambda item: item[1][1])
    if total and not trainable:
        return result(NAME, "confirmed", f"all {total} parameter tensors of {label} have requires_grad=False, so a "
                      "filter on requires_grad leaves the optimizer nothing", cause="all-frozen", **facts)
    if trainable:
        return result(NAME, "confirmed", f"{label} has {trainable} trainable parameter tensors, yet the optimizer got none: "
                      "the iterator `parameters()` returns was used up before the optimizer read it",
                      cause="consumed-iterator", **facts)
    return result(NAME, "confirmed", f"{label} has no parameters at all", cause="no-parameters", **facts)
