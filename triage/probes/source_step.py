"""Rebuild the failing training step from the user's own source, for loops that feed tensors without a DataLoader.

When a failure comes outside any model call (in `loss.backward()`, a NaN guard,
`clip_grad_norm_`) and no DataLoader yielded a batch, the model's inputs are
unknown; but the loop that failed is known, and its frame's locals still hold the
failing iteration's tensors. This module takes the statements of the innermost
loop body around the failing line, from the first one that touches a model, an
optimizer or a function of the user's up to the failing one, and runs them again
on copies: modules, optimizers (and what refers to them) deep-copied to the CPU
through one memo, so that what the originals share the copies share; tensors
cloned; the user's functions rebound to the copied names. The statements before
the first model call (drawing the batch, say) are not re-run: their results are
the failing iteration's own, read from the frame, so random draws stay as they
were. The code keeps the user's file name and line numbers, so tracebacks,
anomaly mode's forward trace and every observer name the user's lines.
"""

from __future__ import annotations

import ast
import builtins
import collections.abc
import contextlib
import copy
import dis
import io
import linecache
import sys
import types
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn

from ..incident import is_user_path
from ._support import MAX_COPY_BYTES, ModuleCopy, Unavailable, cpu_copy, readable

_LOOPS = (ast.For, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_IMMUTABLE = (int, float, complex, bool, str, bytes, type(None), range, torch.dtype, torch.device)
_SHARED_TYPES = (types.ModuleType, type, types.BuiltinFunctionType, types.BuiltinMethodType)
# Calls that write files, send data out or run programs: a step that makes one is not replayed.
_WRITES = frozenset({"save", "save_pretrained", "save_checkpoint", "save_state_dict", "open", "write", "write_text",
                     "write_bytes", "writelines", "dump", "savetxt", "savez", "imwrite", "to_csv", "add_scalar",
                     "log_metrics", "log_artifact", "mkdir", "makedirs", "remove", "unlink", "rmtree", "rename",
                     "system", "Popen", "run", "urlopen", "post", "put", "send"})


@dataclass
class SourceStep:
    """The failing step as statements of the user's file, with the frame whose locals feed them."""

    filename: str
    lines: tuple[int, int]  # first and last line of the replayed statements
    code: types.CodeType
    frame: types.FrameType
    reads: list[str]  # names the statements read from before the step, in order of first use

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

    def namespace(self, poisoned: bool) -> tuple[dict[str, Any], list[tuple[str, ModuleCopy]]]:
        """Globals to run the step in: the frame's names, with every value the step reaches copied.

        A function from another of the user's files reads that file's globals: those it reaches are copied
        into a namespace of their own, and the function is rebound to it (a loss in `losses.py` that calls
        a module global there uses the copy too)."""
        copier = _Copier(poisoned)
        main = self.frame.f_globals
        # id(a file's globals) -> (the replay's copy of them, what a name there refers to)
        spaces = {id(main): (dict(main), {**vars(builtins), **_frame_values(self.frame)})}
        wanted, seen = [(name, id(main)) for name in self.reads], set()
        called = set(_names_used(self.code))  # names the step and the user functions it reaches use
        objects = []
        while wanted:
            name, space = wanted.pop(0)
            copied, values = spaces[space]
            if (name, space) in seen or name not in values:
                continue
            seen.add((name, space))
            value = values[name]
            if _user_function(value):
                write = _write_in(value.__code__)
                if write:
                    raise Unavailable(f"the step calls {name}(), which calls {write}(): a replay would run it "
                                      f"again (a probe writes no file of the user's)")
                home = value.__globals__
                if id(home) not in spaces:
                    spaces[id(home)] = (dict(home), {**vars(builtins), **home})
                wanted += [(inner, id(home)) for inner in _globals_read(value.__code__)]
                called.update(_names_used(value.__code__))
            elif _user_object(value):
                objects.append((name, value))
            copied[name] = copier.copy(name, value)
        for name, value in objects:
            _refuse_unsafe_methods(name, value, called)
        for copied, _ in spaces.values():
            for name, value in list(copied.items()):
                if _user_function(value) and id(value.__globals__) in spaces:
                    copied[name] = _rebound(value, spaces[id(value.__globals__)][0])
        return spaces[id(main)][0], copier.modules

    def run(self, namespace: dict[str, Any]) -> None:
        """Run the statements; what they print is swallowed, what they raise propagates."""
        with contextlib.redirect_stdout(io.StringIO()), torch.enable_grad():
            exec(self.code, namespace)  # noqa: S102 - the user's own statements, on copies


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


def find(frames: list[tuple[types.FrameType, int]]) -> SourceStep:
    """The failing step of the innermost user frame whose failing line sits in a loop; Unavailable if none."""
    if not frames:
        raise Unavailable("no live frame of the user's code to read the failing loop from")
    no_loop, in_loop = [], []
    for frame, line in reversed(frames):
        try:
            return _step_in(frame, line)
        except _NoLoop as exc:
            no_loop.append(str(exc))
        except Unavailable as exc:  # an outer loop may still do (a loop over layers inside forward failed here)
            in_loop.append(str(exc))
    raise Unavailable((in_loop or no_loop)[0])


class _NoLoop(Unavailable):
    """The failing line of a frame is in no loop of its function."""


def _step_in(frame: types.FrameType, line: int) -> SourceStep:
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
    if stale:
        start = 0  # the values the step reads were rebound after it began: run the whole iteration again
        reads, stale = _reads(body[:index + 1])
    if stale:
        names = ", ".join(sorted(stale))
        raise Unavailable(f"the loop reads {names} before it rebinds it: its value before the failing step is gone")
    statements = body[start:index + 1]
    for stmt in statements:
        for node in _walk_scope(stmt):
            if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom, ast.Await, ast.Global, ast.Nonlocal)):
                raise Unavailable(f"the step has a `{type(node).__name__.lower()}` statement "
                                  f"(line {node.lineno}), which cannot run outside its function")
            called = node.func.attr if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                else node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None
            if called in _WRITES:
                raise Unavailable(f"the step calls {called}() at line {node.lineno}, which a replay would run "
                                  f"again (a probe writes no file of the user's)")
    once = ast.For(target=ast.Name("_triage_once", ast.Store()), iter=ast.Tuple([ast.Constant(0)], ast.Load()),
                   body=statements, orelse=[])  # lets the body's own break/continue compile
    ast.copy_location(once, statements[0])
    module = ast.fix_missing_locations(ast.Module(body=[once], type_ignores=[]))
    code = compile(module, filename, "exec").replace(co_name=frame.f_code.co_name)  # tracebacks say "in main"
    return SourceStep(filename, (statements[0].lineno, statements[-1].end_lineno), code, frame, reads)


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


def _refuse_unsafe_methods(name: str, value: Any, called: set[str], seen: set[int] | None = None) -> None:
    """Unavailable if a method of a user object the step may run writes files or reads a global that holds state:
    a method keeps its own module's globals, which the replay cannot swap for copies. The user objects it holds
    (`self.judge`, a submodule) are checked with what its methods call."""
    seen = set() if seen is None else seen
    seen.add(id(value))
    called = set(called)
    for method, function in _methods_reached(value, called):
        write = _write_in(function.__code__)
        if write:
            raise Unavailable(f"the step uses {name} ({type(value).__name__}), whose method {method}() calls "
                              f"{write}(): a replay would run it again (a probe writes no file of the user's)")
        held = next((n for n in _globals_read(function.__code__) if _holds_state(function.__globals__.get(n))),
                    None)
        if held:
            raise Unavailable(f"the step uses {name} ({type(value).__name__}), whose method {method}() reads the "
                              f"global {held}, which a replay cannot swap for a copy")
        called.update(_names_used(function.__code__))
    held_objects = value.named_children() if isinstance(value, nn.Module) else getattr(value, "__dict__", {}).items()
    for attr, inner in list(held_objects):
        if id(inner) not in seen and _user_object(inner):
            _refuse_unsafe_methods(f"{name}.{attr}", inner, called, seen)


def _methods_reached(value: Any, called: set[str]) -> list[tuple[str, types.FunctionType]]:
    """The methods of a user object's class the step may run: those whose names it uses, `__call__` and
    `forward` (calling a module runs it), and those these call through `self.`, as (name, function)."""
    methods = {}
    for klass in reversed(type(value).__mro__):
        for attr, member in vars(klass).items():
            function = getattr(member, "fget", None) or getattr(member, "__func__", member)  # property, static
            if _user_function(function):
                methods[attr] = function
    todo, reached = [m for m in methods if m in called or m in ("__call__", "forward")], {}
    while todo:
        method = todo.pop()
        if method not in reached:
            reached[method] = methods[method]
            todo += [n for n in _names_used(methods[method].__code__) if n in methods]
    return list(reached.items())


def _holds_state(value: Any) -> bool:
    """Whether a replay that used this global itself would change what the user has: an optimizer, a module with
    parameters or buffers, a tensor that takes gradients."""
    if isinstance(value, nn.Module):
        return next(iter(value.parameters()), None) is not None or next(iter(value.buffers()), None) is not None
    return isinstance(value, torch.optim.Optimizer) or (isinstance(value, torch.Tensor) and value.requires_grad)


def _globals_read(code: types.CodeType) -> list[str]:
    """The global names a function's code loads (not `self.model`'s attribute name, which co_names also holds)."""
    names = [ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _globals_read(const)
    return names


def _write_in(code: types.CodeType) -> str | None:
    """The first (by name) call in a function's code that writes files, sends data or runs programs."""
    writes = sorted(_WRITES.intersection(_names_used(code)))
    return writes[0] if writes else None


def _names_used(code: types.CodeType) -> list[str]:
    """The global and attribute names a function's code uses (`torch.save` gives torch and save)."""
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _names_used(const)
    return names


def _rebound(function: types.FunctionType, namespace: dict[str, Any]) -> types.FunctionType:
    """The same function reading its globals from the step's namespace (the copies)."""
    clone = types.FunctionType(function.__code__, namespace, function.__name__, function.__defaults__,
                               function.__closure__)
    clone.__kwdefaults__ = function.__kwdefaults__
    clone.__dict__.update(function.__dict__)
    return clone


class _Copier:
    """Copies values for the replay through one deepcopy memo: shared parameters stay shared, an optimizer's
    copy updates the model copies' parameters, and CUDA tensors are copied straight to the CPU."""

    def __init__(self, poisoned: bool) -> None:
        self.poisoned = poisoned
        self.memo: dict[int, Any] = {}
        self.modules: list[tuple[str, ModuleCopy]] = []
        self.bytes = 0

    def copy(self, name: str, value: Any) -> Any:
        if id(value) in self.memo:
            return self.memo[id(value)]
        if isinstance(value, _IMMUTABLE + _SHARED_TYPES):
            return value
        if callable(value) and not isinstance(value, (nn.Module, torch.optim.Optimizer)) and not _user_object(value):
            return value  # functions (the user's are rebound to the copies afterwards)
        if isinstance(value, nn.Module):
            copied = cpu_copy(value, self.poisoned, memo=self.memo)
            self.modules.append((name, copied))
            return copied.module
        if isinstance(value, torch.Tensor):
            return self.tensor(value)
        if isinstance(value, torch.optim.Optimizer):
            for group in value.param_groups:
                for param in group["params"]:
                    self.tensor(param)
            for state in value.state.values():
                for item in state.values():
                    if isinstance(item, torch.Tensor):
                        self.tensor(item)
            return self._deepcopy(name, value)
        if type(value).__module__.startswith("torch.utils.data"):
            raise Unavailable(f"the step uses {name} ({type(value).__name__}), which a replay would advance")
        if isinstance(value, collections.abc.Iterator):  # generators, iterators, open files
            raise Unavailable(f"the step uses {name} ({type(value).__name__}), which a replay would advance")
        # What the object holds is copied first, so that deepcopy finds it in the memo (on the CPU).
        items = value if isinstance(value, (list, tuple, set)) else value.values() if isinstance(value, dict) \
            else getattr(value, "__dict__", {}).values()
        for item in list(items):
            if isinstance(item, (nn.Module, torch.optim.Optimizer, torch.Tensor)):
                self.copy(name, item)
        return self._deepcopy(name, value)

    def tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) in self.memo:
            return self.memo[id(tensor)]
        self.bytes += tensor.numel() * tensor.element_size()
        if self.bytes > MAX_COPY_BYTES:
            raise Unavailable(f"the step reads over {MAX_COPY_BYTES / 1024**3:.0f} GB of tensors, more than a "
                              f"probe copies")
        if readable(tensor, self.poisoned):
            copied = tensor.detach().to("cpu", copy=True)
        else:
            copied = torch.zeros(tensor.shape, dtype=tensor.dtype)
        if isinstance(tensor, nn.Parameter):
            copied = nn.Parameter(copied, requires_grad=tensor.requires_grad)
        elif tensor.requires_grad and copied.is_floating_point():
            copied.requires_grad_(True)
        self.memo[id(tensor)] = copied
        return copied

    def _deepcopy(self, name: str, value: Any) -> Any:
        try:
            with torch.no_grad():
                return copy.deepcopy(value, self.memo)
        except Exception as exc:
            raise Unavailable(f"the step uses {name} ({type(value).__name__}), which cannot be copied: "
                              f"{type(exc).__name__}: {exc}") from None
