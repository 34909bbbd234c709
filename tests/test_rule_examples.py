"""Every rule in the knowledge base passes its own examples: `triage rules test` as a test."""

import pytest

from triage.kb import load_knowledge_base
from triage.kb.selftest import test_rules as run_examples

KB = load_knowledge_base()


@pytest.mark.parametrize("rule", KB.rules, ids=[rule.id for rule in KB.rules])
def test_rule_examples(rule):
    count, failures = run_examples(KB, [rule])
    assert count >= 2
    assert not failures, "\n".join(map(str, failures))


def test_knowledge_base_has_no_problems():
    assert [str(p) for p in KB.problems] == []
