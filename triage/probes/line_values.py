"""The failing line of the user's code as expressions, and their values re-read in the failing frame.

Many errors are raised by one call on one line of the user's: `preds.numpy()`, `w -= lr * w.grad`,
`correct[:k].view(-1)`, `q.gather(1, actions)`. The innermost user frame still holds the names that line used, and
Python 3.11 records which expression of the line was running (the traceback's carets). This module parses the
statement around the failing line, finds the calls and in-place targets in it (the one that was running first),
and evaluates their receivers and arguments in the frame's own namespace. Evaluating re-runs what they call (a
model, a method), so it is done only in an experiment's child (sandbox.py), which owns whatever it touches.
"""

from __future__ import annotations

import ast
import copy
import linecache
import types
from dataclasses import dataclass
from typing import Any

import torch

from ._support import Unavailable
from .context import ProbeContext


@dataclass
class FailingLine:
    """The statement the innermost user frame failed in, with the span of the expression that was running."""

    frame: types.FrameType
    line: int
    statement: ast.stmt
    source: str
    span: tuple[int, int, int, int] | None  # (line, column, end line, end column) of the running expression
    grad_enabled: bool = True  # grad mode at the line: a `with torch.no_grad()` around it has exited since

    @property
    def where(self) -> str:
        return f"{self.frame.f_code.co_filename}:{self.line} in {self.frame.f_code.co_name}"

    def text(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.source, node) or ast.unparse(node)

    def value(self, node: ast.expr) -> Any:
        """The expression's value now, in the failing frame's namespace (the user's code runs again)."""
        node = copy.deepcopy(node)
        for part in ast.walk(node):
            if hasattr(part, "ctx"):
                part.ctx = ast.Load()  # an assignment's target, read rather than stored
        code = compile(ast.Expression(body=node), self.frame.f_code.co_filename, "eval")
        namespace = {**self.frame.f_globals, **self.frame.f_locals}
        with torch.set_grad_enabled(self.grad_enabled):
            return eval(code, namespace)  # noqa: S307 - the user's own expression, in an experiment's child

    def running(self, node: ast.AST) -> bool:
        """Whether `node` is the expression the frame was running when it failed (or holds it)."""
        if self.span is None or not hasattr(node, "lineno"):
            return False
        line, col, end_line, end_col = self.span
        return (node.lineno, node.col_offset) <= (line, col) and (node.end_lineno, node.end_col_offset) >= (
            end_line, end_col)

    def calls(self, *names: str) -> list[ast.Call]:
        """Calls in the statement of a method or function named one of `names` (`x.view(...)`, `torch.gather(...)`),
        the innermost one the frame was running first."""
        found = [node for node in ast.walk(self.statement) if isinstance(node, ast.Call) and _name(node.func) in names]
        return sorted(found, key=lambda node: (not self.running(node), _size(node)))

    def inplace_targets(self) -> list[ast.expr]:
        """What the statement changes in place: an augmented assignment's target, an item or slice assigned to,
        the receiver of a trailing-underscore method (`x.add_(1)`), the running one first."""
        found: list[ast.expr] = []
        for node in ast.walk(self.statement):
            if isinstance(node, ast.AugAssign):
                found.append(node.target.value if isinstance(node.target, ast.Subscript) else node.target)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found += [t.value for t in targets if isinstance(t, ast.Subscript)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                name = node.func.attr
                if name.endswith("_") and not name.startswith("_"):
                    found.append(node.func.value)
        return sorted(found, key=lambda node: (not self.running(node), _size(node)))


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _size(node: ast.AST) -> int:
    return sum(1 for _ in ast.walk(node))


def failing_line(ctx: ProbeContext) -> FailingLine:
    """The innermost user frame's failing statement; Unavailable when its source cannot be read."""
    if not ctx.frames:
        raise Unavailable("no live frame of the user's code at the failure")
    frame, line = ctx.frames[-1]
    filename = frame.f_code.co_filename
    source = "".join(linecache.getlines(filename, frame.f_globals))
    if not source:
        raise Unavailable(f"the source of {filename} cannot be read")
    try:
        tree = ast.parse(source)
    except SyntaxError:
        raise Unavailable(f"{filename} does not parse") from None
    statements = [node for node in ast.walk(tree) if isinstance(node, ast.stmt)
                  and node.lineno <= line <= (node.end_lineno or node.lineno)
                  and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.For, ast.While,
                                            ast.If, ast.With, ast.Try, ast.AsyncFor, ast.AsyncWith))]
    if not statements:
        raise Unavailable(f"no statement at {filename}:{line}")
    statement = min(statements, key=_size)
    return FailingLine(frame, line, statement, source, _running_span(frame), _grad_mode(tree, line))


_GRAD_OFF = ("no_grad", "inference_mode")


def _grad_mode(tree: ast.Module, line: int) -> bool:
    """Grad mode at `line`: off inside `with torch.no_grad()` / `inference_mode()` or a function decorated with
    them, on inside `with torch.enable_grad()`, the innermost deciding; else the mode the process is in now."""
    mode = torch.is_grad_enabled()
    blocks = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.With, ast.AsyncWith, ast.FunctionDef, ast.AsyncFunctionDef)) or not (
                node.lineno <= line <= (node.end_lineno or node.lineno)):
            continue
        if isinstance(node, (ast.With, ast.AsyncWith)):
            names = [_name(item.context_expr.func if isinstance(item.context_expr, ast.Call) else item.context_expr)
                     for item in node.items]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [_name(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list]
        else:
            continue
        if any(n in _GRAD_OFF for n in names):
            blocks.append((node.lineno, False))
        elif "enable_grad" in names:
            blocks.append((node.lineno, True))
    for _, enabled in sorted(blocks):
        mode = enabled
    return mode


def _running_span(frame: types.FrameType) -> tuple[int, int, int, int] | None:
    """Where the frame's last instruction sits in its line (the traceback's carets), if Python recorded it."""
    try:
        positions = list(frame.f_code.co_positions())
        span = positions[frame.f_lasti // 2]
    except (AttributeError, IndexError, ValueError):
        return None
    return span if all(isinstance(v, int) for v in span) else None  # type: ignore[return-value]
