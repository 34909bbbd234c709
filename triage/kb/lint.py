"""`triage rules lint`: every problem in a set of rules at once, printed compiler-style.

Besides what loading reports (schema, regex syntax, template names, unsafe
templates, duplicate ids, placeholders), lint runs each rule's examples and
finds patterns that backtrack catastrophically: first by their shape, without
running them (a repeated repetition such as `(a+)+`), then by a stress test
under one time budget for the whole run.
"""

from __future__ import annotations

import time
from pathlib import Path

from .loader import KnowledgeBase
from .rule import Problem, Rule
from .safe_regex import SEARCH_TIMEOUT_S, SafePattern, nested_quantifiers, worst_case
from .selftest import test_rules

STRESS_BUDGET_S = 5.0  # stress tests of all patterns together; the shape check has no cost
AVOID = "avoid nested or overlapping repetition such as (a+)+ or (\\w+\\s?)+; make each repeated part match distinct text"


def lint(kb: KnowledgeBase, rules: list[Rule] | None = None, problems: list[Problem] | None = None) -> list[Problem]:
    """The problems of `rules` (default: all in force), sorted by file and line.

    `problems` are the loading problems to report (default: all of `kb.problems`).
    """
    rules = kb.rules if rules is None else rules
    found = list(kb.problems if problems is None else problems)
    _count, failures = test_rules(kb, rules)
    found += [Problem(f.path, f.line, f.col, f"example for {f.rule}: {f.message}", _example_hint(f.message))
              for f in failures]  # fmt: skip
    stress_deadline = time.monotonic() + STRESS_BUDGET_S
    unstressed = 0
    for rule in rules:
        frame_patterns = [(f"frame.{key}", [p]) for key, p in rule.frame.items() if isinstance(p, SafePattern)]
        for key, patterns in (("message", rule.messages), ("not_message", rule.not_messages),
                              ("log", rule.logs), ("not_log", rule.not_logs), *frame_patterns):  # fmt: skip
            for pattern in patterns:
                where = (rule.path, pattern.line or rule.line, pattern.col or 1)
                shape = nested_quantifiers(pattern.source)
                if shape:
                    found.append(Problem(*where, f"regex in '{key}' can backtrack catastrophically: it has {shape}; "
                                                 f"at run time it would be cut off after {SEARCH_TIMEOUT_S}s and disabled",
                                         AVOID))  # fmt: skip
                    continue
                if time.monotonic() > stress_deadline:
                    unstressed += 1
                    continue
                slow = worst_case(pattern)
                if slow:
                    found.append(Problem(*where, f"regex in '{key}' backtracks catastrophically: on {slow} it ran past "
                                                 f"the lint budget; at run time it would be cut off after {SEARCH_TIMEOUT_S}s "
                                                 "and disabled", AVOID))  # fmt: skip
    if unstressed:
        first = rules[0]
        found.append(Problem(first.path, first.line, 1, f"{unstressed} patterns were not stress-tested: the lint budget "
                                                         f"of {STRESS_BUDGET_S:g}s for stress tests was spent",
                             "lint fewer files at once, or make the slow patterns simpler"))
    unique = dict.fromkeys(found)
    return sorted(unique, key=lambda p: (p.path, p.line, p.col))


def _example_hint(message: str) -> str:
    if message.startswith("no_match"):
        return "tighten the pattern (or add not_message) so this near-miss is excluded, or move the example"
    if message.startswith("match example"):
        return "the example must be real log text this rule's patterns find; check the exception type and the regex"
    return ""


def format_problem(problem: Problem, source: list[str] | None = None) -> str:
    """`path:line:col: message`, the offending line with a caret under the column, and `help:`."""
    out = [str(problem)]
    if source is None:
        source = _read_lines(problem.path)
    if 1 <= problem.line <= len(source):
        text = source[problem.line - 1].rstrip("\n")
        gutter = f"{problem.line:>5} | "
        # Keep tabs so the caret lines up with what the terminal shows.
        pad = "".join(c if c == "\t" else " " for c in text[: max(problem.col - 1, 0)])
        out.append(gutter + text)
        out.append(" " * (len(gutter) - 2) + "| " + pad + "^")
    if problem.hint:
        out.append(f"  help: {problem.hint}")
    return "\n".join(out)


def _read_lines(path: str) -> list[str]:
    try:
        with open(Path(path), encoding="utf-8", errors="replace") as handle:
            return handle.read(4 * 1024 * 1024).splitlines()
    except OSError:
        return []
