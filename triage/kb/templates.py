"""Hypothesis, confirm and fix texts: Jinja2 templates rendered in a sandbox.

Templates see only the values a match extracted and a few plain fields of the
incident; undefined names are errors, and the sandbox refuses attribute access
to Python internals, so a rule file can neither run code nor leak state.
Jinja's default globals (range, cycler, lipsum, ...) are removed, `*` and `**`
are bounded, and a render stops at an output and time budget, so a template
cannot exhaust memory or time either. `unsafe_uses` finds reaches for internals
statically, so lint reports them before any render.
"""

from __future__ import annotations

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

# Names every template may use besides the rule's own regex groups.
CONTEXT_NAMES = frozenset(
    {"exception", "frame", "side_frame", "location", "rank", "worker", "kind", "signal", "exit_code", "facts", "log_match"}
)


MAX_OUTPUT_CHARS = 20_000
MAX_RENDER_S = 0.25
MAX_REPEAT_ITEMS = 10_000  # 'x' * n and [..] * n
MAX_EXPONENT = 64
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


class _RuleSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, with repetition and exponentiation bounded."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
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
        return super().call_binop(context, operator, left, right)


@functools.lru_cache(maxsize=1)
def environment() -> ImmutableSandboxedEnvironment:
    env = _RuleSandbox(undefined=StrictUndefined, autoescape=False, trim_blocks=True, lstrip_blocks=True)
    env.globals.clear()
    env.filters["basename"] = _basename
    env.filters["human_bytes"] = _human_bytes
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
        elif isinstance(node, (nodes.Filter, nodes.Call)):
            arguments = [*node.args, *(kw.value for kw in node.kwargs)]
            found.extend(arg.value for arg in arguments if isinstance(arg, nodes.Const) and _is_unsafe_name(arg.value))
        elif isinstance(node, nodes.Const) and isinstance(node.value, str) and re.search(r"[.\[]_", node.value):
            found.extend(re.findall(r"(?<=[.\[])_\w*", node.value))  # a format string reaching for '{0.__class__}'
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


def _bounded_render(template: Any, values: dict[str, Any]) -> str:
    started = time.monotonic()
    parts: list[str] = []
    size = 0
    for chunk in template.generate(**values):
        parts.append(chunk)
        size += len(chunk)
        if size > MAX_OUTPUT_CHARS:
            raise TemplateRefused(f"template output is over {MAX_OUTPUT_CHARS} characters; refused")
        if time.monotonic() - started > MAX_RENDER_S:
            raise TemplateRefused(f"template took over {MAX_RENDER_S}s to render; refused")
    return "".join(parts)
