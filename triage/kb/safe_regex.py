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
    """A compiled pattern with its source text and whether it has been disabled."""

    source: str
    compiled: Any = field(repr=False, default=None)
    disabled: bool = False

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
