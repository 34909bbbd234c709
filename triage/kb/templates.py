"""Hypothesis, confirm and fix texts: Jinja2 templates rendered in a sandbox with budgets it cannot dodge.

Templates see only the values a match extracted and a few plain fields of the
incident; undefined names are errors, and the sandbox refuses attribute access
to Python internals, so a rule file can neither run code nor leak state.
Jinja's default globals (range, cycler, lipsum, ...) are removed.

Every render has a budget of work, not of output: each loop iteration, call,
filter and `+ * % ~` counts a step against a step limit and a CPU-time limit,
and no value a template builds may exceed MAX_VALUE_CHARS. A result's size is
estimated before the work is done (`'x' * n`, `join`, `replace`, padding and
format widths), so a silent triple loop or a 4 GB join is refused in
milliseconds. Time spent on refused renders comes out of one budget for the
process; once it is spent a render gets only a small allowance, so a file of
hostile templates costs little more than one. `unsafe_uses` finds reaches for
internals statically, so lint reports them before any render.
"""

from __future__ import annotations

import contextvars
import functools
import re
import time
from typing import Any

from jinja2 import StrictUndefined, TemplateSyntaxError, meta, nodes
from jinja2.exceptions import SecurityError, UndefinedError
from jinja2.sandbox import (
    UNSAFE_ASYNC_GENERATOR_ATTRIBUTES,
    UNSAFE_COROUTINE_ATTRIBUTES,
    UNSAFE_GENERATOR_ATTRIBUTES,
    ImmutableSandboxedEnvironment,
)
from jinja2.visitor import NodeTransformer

# Names every template may use besides the rule's own regex groups.
CONTEXT_NAMES = frozenset(
    {"exception", "frame", "frames", "side_frame", "location", "rank", "worker", "kind", "signal", "exit_code", "facts",
     "log_match", "log_lines", "log_steps", "probe", "source", "cause_basis"}
)


MAX_OUTPUT_CHARS = 20_000
MAX_RENDER_S = 0.25  # CPU seconds of one render
MAX_STEPS = 200_000  # loop iterations, calls, filters and operators of one render
MAX_VALUE_CHARS = 100_000  # the largest string or list a template may build
MAX_REPEAT_ITEMS = 10_000  # 'x' * n and [..] * n
MAX_EXPONENT = 64
MAX_WIDTH = 10_000  # padding, wrapping and format widths
# Refused renders together may cost this much CPU time per process; after that each render gets the allowance.
REFUSED_TOTAL_S = 1.0
ALLOWANCE_S = 0.002
ALLOWANCE_STEPS = 1_000
_CHECK_TIME_EVERY = 64
_UNSAFE_ATTRIBUTES = (
    UNSAFE_GENERATOR_ATTRIBUTES | UNSAFE_COROUTINE_ATTRIBUTES | UNSAFE_ASYNC_GENERATOR_ATTRIBUTES
    | {"mro", "func_globals", "func_code", "im_func", "im_self", "f_globals", "f_locals", "f_builtins"}
)  # fmt: skip
# Names Jinja itself defines (globals, `self`), none of which a rule needs: each is a way into Python objects.
_JINJA_NAMES = frozenset({"range", "dict", "lipsum", "cycler", "joiner", "namespace", "self"})


class TemplateError(Exception):
    """Raised when a template cannot be compiled or rendered; the message says why."""


class TemplateRefused(TemplateError):
    """Raised when the sandbox refuses what a template does (internals, unbounded output)."""


def _basename(path: Any) -> str:
    return re.split(r"[\\/]", str(path))[-1] if path else ""


def _human_bytes(value: Any) -> str:
    number = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(number) < 1024 or unit == "TiB":
            return f"{number:.0f} {unit}" if unit == "B" else f"{number:.2f} {unit}"
        number /= 1024
    return str(value)


class _RenderBudget:
    """The work one render may still do; every counted step may end it."""

    def __init__(self, seconds: float, steps: int) -> None:
        self.started = time.thread_time()
        self.deadline = self.started + seconds
        self.seconds = seconds
        self.steps_left = steps

    def step(self, count: int = 1) -> None:
        self.steps_left -= count
        if self.steps_left < 0:
            raise SecurityError("template does too much work (loop iterations and calls over its budget)")
        if self.steps_left % _CHECK_TIME_EVERY == 0 and time.thread_time() > self.deadline:
            raise SecurityError(f"template took over {self.seconds:g}s of CPU time to render")


_budget: contextvars.ContextVar[_RenderBudget | None] = contextvars.ContextVar("triage_template_budget", default=None)


class _ProcessAllowance:
    """CPU time refused renders have cost this process; once REFUSED_TOTAL_S is spent, renders get ALLOWANCE_S."""

    spent_s = 0.0

    @classmethod
    def budget(cls) -> _RenderBudget:
        if cls.spent_s >= REFUSED_TOTAL_S:
            return _RenderBudget(ALLOWANCE_S, ALLOWANCE_STEPS)
        return _RenderBudget(min(MAX_RENDER_S, REFUSED_TOTAL_S - cls.spent_s + ALLOWANCE_S), MAX_STEPS)


def reset_allowance() -> None:
    """Forget what refused renders have cost (the rules in force were loaded again)."""
    _ProcessAllowance.spent_s = 0.0


def _step(count: int = 1) -> None:
    budget = _budget.get()
    if budget is not None:
        budget.step(count)


def _size(value: Any) -> int:
    return len(value) if isinstance(value, (str, list, tuple, dict, set, frozenset)) else 0


def _refuse_size(size: int, what: str) -> None:
    if size > MAX_VALUE_CHARS:
        raise SecurityError(f"{what} would build {size} characters or items, over the {MAX_VALUE_CHARS} limit")


def _ints(values: Any) -> list[int]:
    found = []
    for value in values:
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            found.append(value)
        elif isinstance(value, (tuple, list)):
            found.extend(v for v in value if isinstance(v, int) and not isinstance(v, bool))
        elif isinstance(value, dict):
            found.extend(v for v in value.values() if isinstance(v, int) and not isinstance(v, bool))
    return found


_FORMAT_WIDTH = re.compile(r"\d{5,}")


def _chars(value: Any, depth: int = 0) -> int:
    """About how many characters str(value) has, without building it."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, (list, tuple, set, frozenset)) and depth < 3:
        return sum(_chars(item, depth + 1) + 2 for item in value) + 2
    if isinstance(value, dict) and depth < 3:
        return sum(_chars(k, depth + 1) + _chars(v, depth + 1) + 4 for k, v in value.items()) + 2
    return 24


def _materialized(value: Any) -> Any:
    """An iterator a join or a filter would consume, as a list built on the render's budget."""
    if isinstance(value, (str, list, tuple, dict, set, frozenset)) or not hasattr(value, "__iter__"):
        return value
    items = []
    chars = 0
    for item in value:
        _step()
        items.append(item)
        chars += _chars(item)
        _refuse_size(max(len(items), chars), "an iteration")
    return items


def _estimate(name: str, subject: Any, args: tuple, kwargs: dict) -> int:
    """An upper bound on the size of what a size-amplifying method or filter would build."""
    if name == "join":
        if isinstance(subject, str) and args:  # str.join(items): the subject is the separator
            items, separator = args[0], subject
        else:
            items, separator = subject, args[0] if args else kwargs.get("d", "")
        if not isinstance(items, (str, list, tuple, set, frozenset, dict)):
            return 0
        return sum(_chars(item) for item in items) + _chars(separator) * len(items)
    if name == "replace" and isinstance(subject, str) and len(args) >= 2:
        old, new = str(args[0]), str(args[1])
        count = subject.count(old) if old else len(subject) + 1
        return len(subject) + count * len(new)
    if name in ("center", "ljust", "rjust", "zfill", "indent", "wordwrap", "truncate", "batch", "slice", "format",
                "expandtabs", "__mod__"):  # fmt: skip
        widths = _ints(args) + _ints(kwargs.values())
        if any(abs(width) > MAX_WIDTH for width in widths):
            return MAX_VALUE_CHARS + 1
        if name in ("format", "__mod__") and isinstance(subject, str) and _FORMAT_WIDTH.search(subject):
            return MAX_VALUE_CHARS + 1  # '{:999999999}' and '%999999999d'
        if name == "expandtabs" and isinstance(subject, str):
            return len(subject) * max([8, *widths])
        return _size(subject) + sum(_size(arg) for arg in args) + max([0, *widths])
    return 0


_AMPLIFIERS = frozenset({"join", "replace", "center", "ljust", "rjust", "zfill", "indent", "wordwrap", "truncate",
                         "batch", "slice", "format", "expandtabs"})  # fmt: skip


def _bounded_filter(name: str, function: Any) -> Any:
    """A filter that counts a step, refuses an oversized result before building it, and checks what it built."""

    @functools.wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _step()
        # Filters get (value, *args), or (context/eval_ctx, value, *args) when pass_context-style. A lazy
        # argument (map, select) is drawn here, item by item on the budget, not inside the filter.
        args = tuple(arg if _is_jinja_context(arg) else _materialized(arg) for arg in args)
        plain = [arg for arg in args if not _is_jinja_context(arg)]
        if name in _AMPLIFIERS and plain:
            _refuse_size(_estimate(name, plain[0], tuple(plain[1:]), kwargs), f"filter '{name}'")
        result = function(*args, **kwargs)
        _refuse_size(_chars(result) if isinstance(result, (str, list, tuple)) else _size(result), f"filter '{name}'")
        return result

    return bounded


def _is_jinja_context(value: Any) -> bool:
    return type(value).__name__ in ("Context", "EvalContext")


def _bounded_iter(iterable: Any) -> Any:
    """What a `{% for %}` loops over: each iteration is a step of the render's budget."""
    for item in iterable:
        _step()
        yield item


def _bounded_concat(parts: list) -> str:
    """`a ~ b ~ c`: refused before building a string over the limit."""
    _step()
    _refuse_size(sum(_chars(part) for part in parts), "'~'")
    return "".join(str(part) for part in parts)


class _BudgetInserter(NodeTransformer):
    """Routes loops and `~` through the budget: `for x in xs` iterates `xs|_bounded_iter`."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, "_bounded_iter", [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Filter(nodes.List(node.nodes, lineno=node.lineno), "_bounded_concat", [], [], None, None,
                            lineno=node.lineno)  # fmt: skip


class _RuleSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, with every loop, call, filter and size-changing operator on the render's budget."""

    intercepted_binops = frozenset({"*", "**", "+", "%", "//"})

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        return _BudgetInserter().visit(super()._parse(source, name, filename))

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _step()
        if operator == "*":
            for seq, count in ((left, right), (right, left)):
                repeats = isinstance(seq, (str, list, tuple)) and isinstance(count, int)
                if repeats and len(seq) * count > MAX_REPEAT_ITEMS:
                    raise SecurityError(f"repetition to more than {MAX_REPEAT_ITEMS} items refused")
            return left * right
        if operator == "**":
            if isinstance(right, (int, float)) and abs(right) > MAX_EXPONENT:
                raise SecurityError(f"exponent over {MAX_EXPONENT} refused")
            return left**right
        if operator == "+":
            _refuse_size(_chars(left) + _chars(right), "'+'")
        if operator == "%" and isinstance(left, str):
            _refuse_size(_estimate("__mod__", left, right if isinstance(right, tuple) else (right,), {}), "'%'")
        return super().call_binop(context, operator, left, right)

    def call(self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _step()
        name = getattr(__obj, "__name__", "")
        # The sandbox hands out str.format wrapped (functools.wraps): the string is on the wrapped method.
        subject = getattr(__obj, "__self__", None) or getattr(getattr(__obj, "__wrapped__", None), "__self__", None)
        args = tuple(_materialized(arg) for arg in args)
        if name in _AMPLIFIERS and subject is not None:
            _refuse_size(_estimate(name, subject, args, kwargs), f"'{name}()'")
        result = super().call(__context, __obj, *args, **kwargs)
        _refuse_size(_chars(result) if isinstance(result, (str, list, tuple)) else _size(result), f"'{name or 'call'}()'")
        return result


@functools.lru_cache(maxsize=1)
def environment() -> ImmutableSandboxedEnvironment:
    env = _RuleSandbox(undefined=StrictUndefined, autoescape=False, trim_blocks=True, lstrip_blocks=True)
    env.globals.clear()
    env.filters["basename"] = _basename
    env.filters["human_bytes"] = _human_bytes
    env.filters = {name: _bounded_filter(name, function) for name, function in env.filters.items()}
    env.filters["_bounded_iter"] = _bounded_iter
    env.filters["_bounded_concat"] = _bounded_concat
    return env


@functools.lru_cache(maxsize=2048)
def _compiled(source: str):
    try:
        return environment().from_string(source)
    except TemplateSyntaxError as exc:
        raise TemplateError(f"template syntax error at template line {exc.lineno}: {exc.message}") from None


def _parse(source: str) -> nodes.Template:
    try:
        return environment().parse(source)
    except TemplateSyntaxError as exc:
        raise TemplateError(f"template syntax error at template line {exc.lineno}: {exc.message}") from None


def check(source: str) -> set[str]:
    """Compile a template and return the names it uses; raises TemplateError if it does not compile."""
    parsed = _parse(source)
    names = set(meta.find_undeclared_variables(parsed))
    # find_undeclared_variables leaves out Jinja's own names; a rule template may not use them.
    names |= {node.name for node in parsed.find_all(nodes.Name) if node.name in _JINJA_NAMES and node.ctx == "load"}
    return names


_ATTRIBUTE_FILTERS = frozenset({"attr", "map", "selectattr", "rejectattr", "sort", "groupby", "sum", "unique", "min",
                                "max"})


def _is_unsafe_name(name: Any) -> bool:
    return isinstance(name, str) and (name.startswith("_") or name in _UNSAFE_ATTRIBUTES)


def unsafe_uses(source: str) -> list[str]:
    """What a template reaches for that the sandbox refuses: private attributes, Jinja's own objects.

    Each item is the offending text as it is likely written (`__class__`, `cycler`), for
    lint to point at; the sandbox still refuses anything this misses, at render time.
    """
    parsed = _parse(source)
    found: list[str] = []
    for node in parsed.find_all((nodes.Getattr, nodes.Getitem, nodes.Name, nodes.Filter, nodes.Call, nodes.Const)):
        if isinstance(node, nodes.Getattr) and _is_unsafe_name(node.attr):
            found.append(node.attr)
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and _is_unsafe_name(node.arg.value):
            found.append(node.arg.value)
        elif isinstance(node, nodes.Name) and node.name in _JINJA_NAMES and node.ctx == "load":
            found.append(node.name)
        elif isinstance(node, nodes.Filter) and node.name in _ATTRIBUTE_FILTERS:
            # `attr(x, '__class__')`, `map(attribute='__class__')`: a name given as a string. Other calls' string
            # arguments (`message.split('_')`) are data.
            arguments = [*node.args, *(kw.value for kw in node.kwargs if kw.key == "attribute")]
            found.extend(arg.value for arg in arguments if isinstance(arg, nodes.Const) and _is_unsafe_name(arg.value))
        elif isinstance(node, nodes.Const) and isinstance(node.value, str) and "{" in node.value:
            # a format string reaching for '{0.__class__}'; a plain string ('torch._six') is data
            for field_ in re.findall(r"\{[^{}]*\}", node.value):
                found.extend(re.findall(r"(?<=[.\[])_\w*", field_))
    return list(dict.fromkeys(found))


def render(source: str, values: dict[str, Any]) -> str:
    """Render a template with the values a match extracted."""
    try:
        text = _bounded_render(_compiled(source), values)
    except UndefinedError as exc:
        raise TemplateError(f"template uses an undefined value: {exc.message}") from None
    except SecurityError as exc:
        raise TemplateRefused(f"template refused by the sandbox: {exc}") from None
    except TemplateError:
        raise
    except Exception as exc:  # a filter given a bad value, a division by zero
        raise TemplateError(f"template failed: {type(exc).__name__}: {exc}") from None
    return text.strip()


def condition_source(expression: str) -> str:
    """A cause's `when` expression as the template `condition` renders (and rule validation checks)."""
    return "{% if " + expression.strip() + " %}1{% endif %}"


def condition(expression: str, values: dict[str, Any]) -> bool:
    """Whether a cause's `when` holds. An undefined name (a fact the log or an experiment did not give) makes it
    false: the cause is simply not chosen. Refusals by the sandbox propagate, as for any template."""
    try:
        return render(condition_source(expression), values) == "1"
    except TemplateRefused:
        raise
    except TemplateError:
        return False


def _bounded_render(template: Any, values: dict[str, Any]) -> str:
    budget = _ProcessAllowance.budget()
    token = _budget.set(budget)
    parts: list[str] = []
    size = 0
    try:
        for chunk in template.generate(**values):
            parts.append(chunk)
            size += len(chunk)
            if size > MAX_OUTPUT_CHARS:
                raise TemplateRefused(f"template output is over {MAX_OUTPUT_CHARS} characters; refused")
            budget.step()
    except (SecurityError, TemplateRefused):
        _ProcessAllowance.spent_s += time.thread_time() - budget.started
        raise
    finally:
        _budget.reset(token)
    return "".join(parts)
