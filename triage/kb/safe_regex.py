"""Regular expressions from rule files, compiled with `regex` and searched under time limits.

A team's catastrophic pattern must cost explain at most its time limit: the
first time a pattern times out it is disabled for the rest of the process.
One limit per pattern is not enough (two hundred copies of one pattern cost
two hundred limits), so every team rule file also has a budget for all its
searches together, and all team files share one more: once a budget is spent,
the patterns it covers are disabled. Built-in patterns are linted in CI and
have only the per-search limit. `nested_quantifiers` finds the usual shape of
a catastrophic pattern without running it, for lint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import regex

SEARCH_TIMEOUT_S = 0.2
FILE_BUDGET_S = 0.5  # CPU seconds for every search of one team rule file together
TEAM_BUDGET_S = 1.5  # CPU seconds for every search of every team rule file together
TEAM = "all team rule files"
# Inline flags aside, patterns are multi-line: `^`/`$` anchor lines of a message.
FLAGS = regex.MULTILINE | regex.VERSION0


class PatternTimeout(Exception):
    """Raised when a pattern took longer than its time limit, or its file's budget ran out; it is disabled after it."""


@dataclass
class SearchBudget:
    """Seconds of searching that the patterns of one owner (a rule file, or all team files) may still spend."""

    owner: str
    limit_s: float
    spent_s: float = 0.0
    announced: bool = False  # the one warning that this budget is spent has been given

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.limit_s - self.spent_s)


_budgets: dict[str, SearchBudget] = {}


def budgets_for(owner: str | None) -> list[SearchBudget]:
    """The budgets a pattern of `owner` (a team rule file; None for built-in) draws on."""
    if owner is None:
        return []
    if owner not in _budgets:
        _budgets[owner] = SearchBudget(owner, FILE_BUDGET_S)
    if TEAM not in _budgets:
        _budgets[TEAM] = SearchBudget(TEAM, TEAM_BUDGET_S)
    return [_budgets[owner], _budgets[TEAM]]


def reset_budgets() -> None:
    """Forget what team patterns have spent (a new command in the same process, tests)."""
    _budgets.clear()


@dataclass
class SafePattern:
    """A compiled pattern with its source text, where it is written, and whether it has been disabled."""

    source: str
    compiled: Any = field(repr=False, default=None)
    disabled: bool = False
    line: int = 0
    col: int = 0
    owner: str | None = None  # the team rule file it comes from; None for a built-in rule

    @property
    def group_names(self) -> set[str]:
        return set(self.compiled.groupindex)

    def search(self, text: str) -> regex.Match | None:
        if self.disabled:
            return None
        budgets = budgets_for(self.owner)
        spent = next((budget for budget in budgets if budget.remaining_s <= 0), None)
        if spent is not None:
            self.disabled = True
            if spent.announced:
                return None
            spent.announced = True
            raise PatternTimeout(f"{spent.owner}: the patterns spent their {spent.limit_s:g}s regex budget and are disabled")
        timeout = min([SEARCH_TIMEOUT_S, *(budget.remaining_s for budget in budgets)])
        started = time.thread_time()  # CPU time, as the regex package measures its timeout
        try:
            return self.compiled.search(text, timeout=timeout)
        except TimeoutError:
            self.disabled = True
            raise PatternTimeout(f"pattern {self.source!r} took over {timeout:.3g}s; disabled") from None
        finally:
            for budget in budgets:
                budget.spent_s += time.thread_time() - started


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


def nested_quantifiers(source: str) -> str | None:
    """The part of a pattern that repeats a repetition (`(a+)+`, `(\\w+\\s?)*`, `(a|aa)+`), or None.

    Such a group can split the same text in exponentially many ways, and a near-miss makes the
    engine try them all. Read with Python's own regex parser, so nothing runs; a pattern it cannot
    parse (syntax only the `regex` package knows) gets None and is left to the stress test.
    """
    try:
        import re._parser as parser  # Python >= 3.11
    except ImportError:  # pragma: no cover - Python 3.10
        import sre_parse as parser  # type: ignore[no-redef]
    try:
        tree = parser.parse(source)
    except Exception:
        return None
    found = _find_nested(list(tree), parser)
    return found


def _find_nested(items: list, parser: Any) -> str | None:
    constants = parser  # the opcode names live beside the parser
    for op, av in items:
        if op in (constants.MAX_REPEAT, constants.MIN_REPEAT):
            low, high, body = av
            body_items = _unwrap(list(body), parser)
            if high == constants.MAXREPEAT or high > 1:
                if _only_repeats(body_items, parser):
                    return "a group that repeats a repetition, such as (a+)+"
                if _overlapping_branch(body_items, parser):
                    return "a repeated alternation whose branches can match the same text, such as (a|aa)+"
            inner = _find_nested(list(body), parser)
            if inner:
                return inner
        elif op == constants.SUBPATTERN:
            inner = _find_nested(list(av[-1]), parser)
            if inner:
                return inner
        elif op == constants.BRANCH:
            for branch in av[1]:
                inner = _find_nested(list(branch), parser)
                if inner:
                    return inner
    return None


def _unwrap(items: list, parser: Any) -> list:
    while len(items) == 1 and items[0][0] == parser.SUBPATTERN:
        items = list(items[0][1][-1])
    return items


def _only_repeats(items: list, parser: Any) -> bool:
    """Every required part of the body is itself an unbounded repetition (optional parts aside)."""
    required = [item for item in items if not (item[0] in (parser.MAX_REPEAT, parser.MIN_REPEAT) and item[1][0] == 0)]
    unbounded = [item for item in required
                 if item[0] in (parser.MAX_REPEAT, parser.MIN_REPEAT) and item[1][1] == parser.MAXREPEAT]  # fmt: skip
    return bool(required) and len(unbounded) == len(required)


def _overlapping_branch(items: list, parser: Any) -> bool:
    """An alternation where one branch's literal text starts another's: (a|aa), (xa|xab|c).

    Python's parser factors a common prefix out: (a|aa) arrives as `a` then a branch of `` and `a`,
    which is the same ambiguity: an iteration may or may not take the second `a`.
    """
    if len(items) >= 2 and items[0][0] == parser.LITERAL:
        first = items[0]
        for op, av in items[1:]:
            if op == parser.BRANCH and any(branch and tuple(branch[0]) == tuple(first) for branch in av[1]):
                return True
    if len(items) != 1:
        return False
    op, av = items[0]
    if op == parser.IN:  # a character class, not an alternation
        return False
    if op != parser.BRANCH:
        return False
    literals = []
    for branch in av[1]:
        if not all(item[0] == parser.LITERAL for item in branch):
            return False
        literals.append("".join(chr(item[1]) for item in branch))
    return any(a != b and b.startswith(a) for a in literals for b in literals)


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
