"""Run every rule's examples: the harness behind `triage rules test`, shipped so team packs use it too."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..logparse import parse_text
from . import templates
from .loader import KnowledgeBase
from .matcher import choose_cause, diagnose, matches, template_context
from .rule import Example, Rule
from .safe_regex import PatternTimeout


@dataclass(frozen=True)
class ExampleFailure:
    """An example that did not behave as its rule says, and what happened instead."""

    path: str
    line: int
    rule: str
    message: str
    col: int = 1

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.message}"


def test_rules(kb: KnowledgeBase, rules: list[Rule] | None = None) -> tuple[int, list[ExampleFailure]]:
    """Check each rule's examples; returns how many examples ran and the failures."""
    failures: list[ExampleFailure] = []
    count = 0
    for rule in rules if rules is not None else kb.rules:
        for example, must_match in [*((e, True) for e in rule.matches), *((e, False) for e in rule.no_matches)]:
            count += 1
            try:
                failures.extend(_check_match(rule, example, kb) if must_match else _check_no_match(rule, example))
            except PatternTimeout as exc:
                failures.append(ExampleFailure(rule.path, example.line, rule.id, str(exc), example.col))
            except Exception as exc:
                if os.environ.get("TRIAGE_DEBUG"):
                    raise
                message = f"internal error running this example: {type(exc).__name__}: {exc}"
                failures.append(ExampleFailure(rule.path, example.line, rule.id, message, example.col))
    return count, failures


def _check_no_match(rule: Rule, example: Example) -> list[ExampleFailure]:
    found = matches(rule, parse_text(example.log))
    if not found:
        return []
    values = {k: v for k, v in found[0].items() if not k.startswith("_") and k != "log_match"}
    extracted = f", extracting {_show(values)}" if values else ""
    message = f"no_match example matched the rule{extracted}"
    return [ExampleFailure(rule.path, example.line, rule.id, message, example.col)]


def _check_match(rule: Rule, example: Example, kb: KnowledgeBase) -> list[ExampleFailure]:
    incident = parse_text(example.log)
    found = matches(rule, incident)
    if not found:
        return [ExampleFailure(rule.path, example.line, rule.id, _why_not(incident, kb), example.col)]
    failures = []
    values = found[0]
    for name, expected in example.vars.items():
        got = values.get(name)
        if got is None or str(got) != str(expected):
            failures.append(ExampleFailure(rule.path, example.line, rule.id,
                                           f"expected {name}={expected!r}, extracted {got!r}", example.col))
    context = template_context(incident, incident.exception, incident.exception.user_frame() if incident.exception else None,
                               {**rule.tables, **values})
    chosen, basis, _ = choose_cause(rule, context)
    context = {**context, "cause_basis": basis}
    if example.cause is not None and (chosen is None or chosen.id != example.cause):
        failures.append(ExampleFailure(rule.path, example.line, rule.id, f"expected cause {example.cause!r}, the log "
                                       f"chose {chosen.id if chosen else 'none'!r}", example.col))
    fields = rule.template_fields()
    if chosen is not None:
        n = rule.causes.index(chosen)
        fields.update({name: source for name, source in rule.cause_fields().items()
                       if name.startswith(f"causes[{n}].") and not name.endswith(".when")})
    for field, source in fields.items():
        try:
            templates.render(source, context)
        except templates.TemplateError as exc:
            failures.append(ExampleFailure(rule.path, example.line, rule.id,
                                           f"{field} does not render for this example: {exc}", example.col))
    return failures


def _why_not(incident, kb: KnowledgeBase) -> str:
    exc = incident.exception
    parsed = f"it parsed as {exc.headline[:160]!r}" if exc and exc.type else "it parsed with no exception"
    others = [d.rule for d in diagnose(incident, kb)[:3]]
    instead = f"; matched instead: {', '.join(others)}" if others else "; no rule matched it"
    return f"match example did not match ({parsed}{instead})"


def _show(values: dict) -> str:
    return ", ".join(f"{name}={str(value)[:60]!r}" for name, value in values.items())
