"""Regular expressions from rule files, compiled with `regex` and searched under a time limit.

A team's catastrophic pattern must cost explain at most its time limit: the
first time a pattern times out it is disabled for the rest of the process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import regex

SEARCH_TIMEOUT_S = 0.2
# Inline flags aside, patterns are multi-line: `^`/`$` anchor lines of a message.
FLAGS = regex.MULTILINE | regex.VERSION0


class PatternTimeout(Exception):
    """Raised when a pattern took longer than its time limit; the pattern is disabled after it."""


@dataclass
class SafePattern:
    """A compiled pattern with its source text, where it is written, and whether it has been disabled."""

    source: str
    compiled: Any = field(repr=False, default=None)
    disabled: bool = False
    line: int = 0
    col: int = 0

    @property
    def group_names(self) -> set[str]:
        return set(self.compiled.groupindex)

    def search(self, text: str) -> regex.Match | None:
        if self.disabled:
            return None
        try:
            return self.compiled.search(text, timeout=SEARCH_TIMEOUT_S)
        except TimeoutError:
            self.disabled = True
            raise PatternTimeout(f"pattern {self.source!r} took over {SEARCH_TIMEOUT_S}s; disabled") from None


def compile_pattern(source: str) -> SafePattern:
    """Compile a rule's pattern; raises `regex.error` with the offset of a mistake."""
    return SafePattern(source, regex.compile(source, FLAGS))


STRESS_LENGTH = 3000
STRESS_TIMEOUT_S = 0.05
_STRESS_DEFAULTS = "a0 x_-"
_META = set("()[]{}.*+?|^$\\")


def worst_case(pattern: SafePattern, timeout: float = STRESS_TIMEOUT_S) -> str | None:
    """Describe an input on which the pattern backtracks past `timeout`, or None if none was found.

    Catastrophic patterns (nested or overlapping repetition, `(a+)+$`, `(\\w+\\s?)+$`) blow up on
    a long run of one character that they almost match; lint tries runs of each character the
    pattern mentions, after its literal prefix, each followed by a character that breaks the match.
    """
    literal_prefix = _literal_prefix(pattern.source)
    candidates = dict.fromkeys(pattern.source + _STRESS_DEFAULTS)
    characters = [c for c in candidates if c.isprintable() and c not in _META][:24]
    for prefix in dict.fromkeys(["", literal_prefix]):
        for char in characters:
            for end in ("\x00", "\n"):
                text = prefix + char * STRESS_LENGTH + end
                try:
                    pattern.compiled.search(text, timeout=timeout)
                except TimeoutError:
                    shown = f"{prefix!r} followed by " if prefix else ""
                    return f"{shown}{STRESS_LENGTH} x {char!r}"
    return None


def _literal_prefix(source: str) -> str:
    out = []
    index = 0
    while index < len(source):
        char = source[index]
        if char == "\\" and index + 1 < len(source) and not source[index + 1].isalnum():
            out.append(source[index + 1])
            index += 2
            continue
        if char in _META:
            break
        out.append(char)
        index += 1
    if index < len(source) and source[index] in "*+?{" and out:
        out.pop()  # that character is repeated, not literal
    return "".join(out)
