"""Hypothesis, confirm and fix texts: Jinja2 templates rendered in a sandbox.

Templates see only the values a match extracted and a few plain fields of the
incident; undefined names are errors, and the sandbox refuses attribute access
to Python internals, so a rule file can neither run code nor leak state.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from jinja2 import StrictUndefined, TemplateSyntaxError, meta
from jinja2.exceptions import SecurityError, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Names every template may use besides the rule's own regex groups.
CONTEXT_NAMES = frozenset(
    {"exception", "frame", "location", "rank", "worker", "kind", "signal", "exit_code", "facts", "log_match"}
)


class TemplateError(Exception):
    """Raised when a template cannot be compiled or rendered; the message says why."""


def _basename(path: Any) -> str:
    return re.split(r"[\\/]", str(path))[-1] if path else ""


def _human_bytes(value: Any) -> str:
    number = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(number) < 1024 or unit == "TiB":
            return f"{number:.0f} {unit}" if unit == "B" else f"{number:.2f} {unit}"
        number /= 1024
    return str(value)


@functools.lru_cache(maxsize=1)
def environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(undefined=StrictUndefined, autoescape=False, trim_blocks=True, lstrip_blocks=True)
    env.filters["basename"] = _basename
    env.filters["human_bytes"] = _human_bytes
    return env


@functools.lru_cache(maxsize=2048)
def _compiled(source: str):
    try:
        return environment().from_string(source)
    except TemplateSyntaxError as exc:
        raise TemplateError(f"template syntax error at template line {exc.lineno}: {exc.message}") from None


def check(source: str) -> set[str]:
    """Compile a template and return the names it uses; raises TemplateError if it does not compile."""
    try:
        parsed = environment().parse(source)
    except TemplateSyntaxError as exc:
        raise TemplateError(f"template syntax error at template line {exc.lineno}: {exc.message}") from None
    return set(meta.find_undeclared_variables(parsed))


def render(source: str, values: dict[str, Any]) -> str:
    """Render a template with the values a match extracted."""
    try:
        text = _compiled(source).render(**values)
    except UndefinedError as exc:
        raise TemplateError(f"template uses an undefined value: {exc.message}") from None
    except SecurityError as exc:
        raise TemplateError(f"template refused by the sandbox: {exc}") from None
    except TemplateError:
        raise
    except Exception as exc:  # a filter given a bad value, a division by zero
        raise TemplateError(f"template failed: {type(exc).__name__}: {exc}") from None
    return text.strip()
