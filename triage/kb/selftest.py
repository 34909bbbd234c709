"""Run every rule's examples: the harness behind `triage rules test`, shipped so team packs use it too."""

from __future__ import annotations

from dataclasses import dataclass

from ..logparse import parse_text
from . import templates
from .loader import KnowledgeBase
from .matcher import diagnose, matches, template_context
from .rule import Example, Rule


@dataclass(frozen=True)
class ExampleFailure:
    """An example that did not behave as its rule says, and what happened instead."""

    path: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.message}"


def test_rules(kb: KnowledgeBase, rules: list[Rule] | None = None) -> tuple[int, list[ExampleFailure]]:
    """Check each rule's examples; returns how many examples ran and the failures."""
    failures: list[ExampleFailure] = []
    count = 0
    for rule in rules if rules is not None else kb.rules:
        for example in rule.matches:
            count += 1
            failures.extend(_check_match(rule, example, kb))
        for example in rule.no_matches:
            count += 1
            incident = parse_text(example.log)
            if matches(rule, incident):
                failures.append(ExampleFailure(rule.path, example.line, rule.id, "no_match example matched the rule"))
    return count, failures


def _check_match(rule: Rule, example: Example, kb: KnowledgeBase) -> list[ExampleFailure]:
    incident = parse_text(example.log)
    found = matches(rule, incident)
    if not found:
        return [ExampleFailure(rule.path, example.line, rule.id, _why_not(incident, kb))]
    failures = []
    values = found[0]
    for name, expected in example.vars.items():
        got = values.get(name)
        if got is None or str(got) != str(expected):
            failures.append(ExampleFailure(rule.path, example.line, rule.id, f"expected {name}={expected!r}, extracted {got!r}"))
    context = template_context(incident, incident.exception, incident.exception.user_frame() if incident.exception else None, values)
    for field, source in rule.template_fields().items():
        try:
            templates.render(source, context)
        except templates.TemplateError as exc:
            failures.append(ExampleFailure(rule.path, example.line, rule.id, f"{field} does not render for this example: {exc}"))
    return failures


def _why_not(incident, kb: KnowledgeBase) -> str:
    exc = incident.exception
    parsed = f"it parsed as {exc.headline[:160]!r}" if exc and exc.type else "it parsed with no exception"
    others = [d.rule for d in diagnose(incident, kb)[:3]]
    instead = f"; matched instead: {', '.join(others)}" if others else "; no rule matched it"
    return f"match example did not match ({parsed}{instead})"
