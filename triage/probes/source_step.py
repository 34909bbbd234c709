"""Rebuild the failing training step from the user's own source, for loops that feed tensors without a DataLoader.

When a failure comes outside any model call (in `loss.backward()`, a NaN guard,
`clip_grad_norm_`) and no DataLoader yielded a batch, the model's inputs are
unknown; but the loop that failed is known, and its frame's locals still hold the
failing iteration's tensors. This module takes the statements of the innermost
loop body around the failing line, from the first one that touches a model, an
optimizer or a function of the user's up to the failing one, and runs them again
in the frame's own namespace. That is safe only in an experiment's child forked
at the failure (sandbox.py), which owns every object it reaches, closures,
bound methods and other files' globals included. The statements before the
first model call (drawing the batch, say) are not re-run: their results are the
failing iteration's own, read from the frame, so random draws stay as they
were. The code keeps the user's file name and line numbers, so tracebacks,
anomaly mode's forward trace and every observer name the user's lines.
"""

from __future__ import annotations

import ast
import linecache
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import nn

from ..incident import is_user_path
from ._support import Unavailable

_LOOPS = (ast.For, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


@dataclass
class SourceStep:
    """The failing step as statements of the user's file, with the frame whose locals feed them."""

    filename: str
    lines: tuple[int, int]  # first and last line of the replayed statements
    code: types.CodeType
    frame: types.FrameType
    reads: list[str]  # names the statements read from before the step, in order of first use
    tree: ast.Module | None = None  # the statements compiled into `code` (a fix trial edits a copy)
    carried: list[str] = field(default_factory=list)  # names read before rebound: the next iteration's values

    @property
    def where(self) -> str:
        first, last = self.lines
        return f"{self.filename}:{first}-{last}" if last > first else f"{self.filename}:{first}"

    def inputs(self) -> dict[str, Any]:
        """The tensors and numbers the step reads from the failing iteration's locals (the batch, in a loop
        without a DataLoader), by name; modules, optimizers, functions and globals left out."""
        local = self.frame.f_locals
        return {name: local[name] for name in self.reads
                if name in local and isinstance(local[name], (torch.Tensor, int, float, bool))}

    def namespace(self) -> tuple[dict[str, Any], list[tuple[str, nn.Module]]]:
        """Globals to run the step in (the frame's own names), and the modules it reaches, by name.

        Only for an experiment's child: the statements change what they touch. A step that reads tensors off
        the CPU is not replayed (CUDA does not survive fork), nor one whose tensors sit in shared memory, where
        the child's writes would reach the parent."""
        values = _frame_values(self.frame)
        modules: list[tuple[str, nn.Module]] = []
        seen: set[int] = set()
        for name in self.reads:
            for label, value in _reached(name, values.get(name)):
                if isinstance(value, nn.Module) and id(value) not in seen:
                    seen.add(id(value))
                    modules.append((label, value))
                tensors = list(value.parameters()) + list(value.buffers()) if isinstance(value, nn.Module) \
                    else [value] if isinstance(value, torch.Tensor) else []
                odd = next((t for t in tensors if t.device.type != "cpu" or t.is_shared()), None)
                if odd is not None:
                    where = "in shared memory" if odd.device.type == "cpu" else f"on {odd.device}"
                    raise Unavailable(f"the step reads {label}, with tensors {where}, which a forked experiment "
                                      f"cannot {'keep to itself' if odd.device.type == 'cpu' else 'use'}")
        return {**self.frame.f_globals, **self.frame.f_locals}, modules

    def run(self, namespace: dict[str, Any]) -> None:
        """Run the statements; what they raise propagates."""
        with torch.enable_grad():
            exec(self.code, namespace)  # noqa: S102 - the user's own statements, in an experiment's child


def _reached(name: str, value: Any) -> list[tuple[str, Any]]:
    """The value a step reads, with the modules and tensors it holds (a user object's attributes, the globals a
    user function loads), each with a name to show."""
    found = [(name, value)]
    if _user_function(value):
        home = value.__globals__
        found += [(inner, home[inner]) for inner in value.__code__.co_names
                  if isinstance(home.get(inner), (nn.Module, torch.Tensor))]
    elif _user_object(value) and not isinstance(value, nn.Module):
        found += [(f"{name}.{attr}", inner) for attr, inner in getattr(value, "__dict__", {}).items()
                  if isinstance(inner, (nn.Module, torch.Tensor))]
    return found


def _frame_values(frame: types.FrameType) -> dict[str, Any]:
    """What a name in the frame's code refers to: its locals, else its globals."""
    return {**frame.f_globals, **frame.f_locals}


def user_frames(exception: BaseException | None) -> list[tuple[types.FrameType, int]]:
    """The user's frames at the failure with the line each was at, innermost last: from the exception's traceback,
    or (for an incident with no exception, found by a hook while the script runs) from the current stack."""
    pairs = []
    if exception is not None:
        tb = exception.__traceback__
        while tb is not None:
            pairs.append((tb.tb_frame, tb.tb_lineno))
            tb = tb.tb_next
    else:
        frame = sys._getframe(1)
        while frame is not None:
            pairs.append((frame, frame.f_lineno))
            frame = frame.f_back
        pairs.reverse()
    return [(frame, line) for frame, line in pairs if _user_code(frame.f_code)]


def find(frames: list[tuple[types.FrameType, int]], carry: bool = False) -> SourceStep:
    """The failing step of the innermost user frame whose failing line sits in a loop; Unavailable if none.

    With `carry`, a value the loop reads before it rebinds it (a recurrent state) is taken as the frame holds it
    now: the value the next iteration would read (listed in `carried`)."""
    if not frames:
        raise Unavailable("no live frame of the user's code to read the failing loop from")
    no_loop, in_loop = [], []
    for frame, line in reversed(frames):
        try:
            return _step_in(frame, line, carry)
        except _NoLoop as exc:
            no_loop.append(str(exc))
        except Unavailable as exc:  # an outer loop may still do (a loop over layers inside forward failed here)
            in_loop.append(str(exc))
    raise Unavailable((in_loop or no_loop)[0])


class _NoLoop(Unavailable):
    """The failing line of a frame is in no loop of its function."""


def _step_in(frame: types.FrameType, line: int, carry: bool = False) -> SourceStep:
    filename = frame.f_code.co_filename
    source = "".join(linecache.getlines(filename))
    if not source:
        raise Unavailable(f"the source of {filename} cannot be read")
    try:
        tree = ast.parse(source, filename)
    except SyntaxError:
        raise Unavailable(f"{filename} does not parse as it is now") from None
    scope = _scope_of(tree, frame.f_code)
    if scope is None:
        raise Unavailable(f"{frame.f_code.co_name} is not found in {filename} as it is now")
    loop = _innermost_loop(scope, line)
    if loop is None:
        raise _NoLoop(f"the failing line {filename}:{line} is in no loop of {frame.f_code.co_name}")
    body = loop.body
    index = next(i for i, stmt in enumerate(body) if stmt.lineno <= line <= stmt.end_lineno)
    values = _frame_values(frame)
    start = next((i for i, stmt in enumerate(body[:index]) if _touches_step(stmt, values)), index)
    reads, stale = _reads(body[start:index + 1])
    carried = sorted(stale) if carry else []
    if stale and not carry:
        start = 0  # the values the step reads were rebound after it began: run the whole iteration again
        reads, stale = _reads(body[:index + 1])
    if stale and not carry:
        names = ", ".join(sorted(stale))
        raise Unavailable(f"the loop reads {names} before it rebinds it: its value before the failing step is gone")
    statements = body[start:index + 1]
    for stmt in statements:
        for node in _walk_scope(stmt):
            if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom, ast.Await, ast.Global, ast.Nonlocal)):
                raise Unavailable(f"the step has a `{type(node).__name__.lower()}` statement "
                                  f"(line {node.lineno}), which cannot run outside its function")
    once = ast.For(target=ast.Name("_triage_once", ast.Store()), iter=ast.Tuple([ast.Constant(0)], ast.Load()),
                   body=statements, orelse=[])  # lets the body's own break/continue compile
    ast.copy_location(once, statements[0])
    module = ast.fix_missing_locations(ast.Module(body=[once], type_ignores=[]))
    code = compile(module, filename, "exec").replace(co_name=frame.f_code.co_name)  # tracebacks say "in main"
    return SourceStep(filename, (statements[0].lineno, statements[-1].end_lineno), code, frame, reads, module, carried)


def loop_carried(frame: types.FrameType, line: int) -> tuple[list[str], list[int]]:
    """For the innermost loop around `line` in `frame`'s function: the names its body reads before it rebinds them
    (values carried from one iteration to the next, such as an RNN's hidden state), and the lines of the body's
    `.backward(` calls. ([], []) when the line is in no loop or the source cannot be read."""
    filename = frame.f_code.co_filename
    try:
        tree = ast.parse("".join(linecache.getlines(filename)), filename)
    except (SyntaxError, ValueError):
        return [], []
    scope = _scope_of(tree, frame.f_code)
    loop = _innermost_loop(scope, line) if scope is not None else None
    if loop is None:
        return [], []
    reads, carried = _reads(loop.body)
    backward = sorted({node.lineno for stmt in loop.body for node in _walk_scope(stmt)
                       if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                       and node.func.attr == "backward"})
    return [name for name in reads if name in carried], backward


def _scope_of(tree: ast.Module, code: types.CodeType) -> ast.AST | None:
    """The function (or the module) whose code object `code` is."""
    if code.co_name == "<module>":
        return tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == code.co_name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if first == code.co_firstlineno:
                return node
    return None


def _walk_scope(node: ast.AST) -> Iterator[ast.AST]:
    """ast.walk that does not enter nested functions, lambdas or classes."""
    todo = [node]
    while todo:
        current = todo.pop()
        yield current
        todo.extend(child for child in ast.iter_child_nodes(current) if not isinstance(child, _SCOPES))


def _innermost_loop(scope: ast.AST, line: int) -> ast.For | ast.While | None:
    """The innermost for/while loop of `scope` (not of a nested function) whose body holds `line`."""
    found = None
    for node in _walk_scope(scope):
        if isinstance(node, _LOOPS) and node.body[0].lineno <= line <= node.body[-1].end_lineno:
            if found is None or node.lineno > found.lineno:
                found = node
    return found


def _touches_step(stmt: ast.stmt, values: dict[str, Any]) -> bool:
    """Whether a statement reads a module, an optimizer, a user function or an object of a user class."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in values:
            value = values[node.id]
            if isinstance(value, (nn.Module, torch.optim.Optimizer)) or _user_function(value) or _user_object(value):
                return True
    return False


def _reads(statements: list[ast.stmt]) -> tuple[list[str], set[str]]:
    """(names read before the statements bind them, in order; names read first and rebound later)."""
    bound: set[str] = set()
    reads: list[str] = []
    for stmt in statements:
        loads: list[str] = []
        stores: set[str] = set()
        _names(stmt, frozenset(), loads, stores)
        reads += [name for name in loads if name not in bound and name not in reads]
        bound |= stores
    return reads, set(reads) & bound


def _names(node: ast.AST, hidden: frozenset[str], loads: list[str], stores: set[str]) -> None:
    """Names a statement reads and binds, leaving out those local to its comprehensions and lambdas."""
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        hidden = hidden | {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
    elif isinstance(node, ast.Lambda):
        hidden = hidden | {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
    elif isinstance(node, ast.Name) and node.id not in hidden:
        if isinstance(node.ctx, ast.Load):
            loads.append(node.id)
        else:
            stores.add(node.id)
    elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
        loads.append(node.target.id)
    for child in ast.iter_child_nodes(node):
        _names(child, hidden, loads, stores)


def _user_code(code: types.CodeType) -> bool:
    return _user_file(code.co_filename)


def _user_file(filename: str) -> bool:
    return is_user_path(filename) and "/triage/" not in filename.replace("\\", "/")


def _user_function(value: Any) -> bool:
    return isinstance(value, types.FunctionType) and _user_code(value.__code__)


def _user_object(value: Any) -> bool:
    """An instance of a class defined in the user's code (a Trainer, a loss object), not in a library."""
    if isinstance(value, type):
        return False
    module = sys.modules.get(getattr(type(value), "__module__", "") or "")
    filename = getattr(module, "__file__", None)
    if filename:
        return _user_file(filename)
    # A class from code with no module file (a notebook cell, exec'd source): its methods say where it is from.
    return any(_user_function(getattr(member, "__func__", member)) for member in vars(type(value)).values())
