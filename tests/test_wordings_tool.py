"""tools/wordings.py: the offline table of torch's error wordings and the rules that cover them."""

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

from triage.kb import load_knowledge_base

TOOL = Path(__file__).resolve().parent.parent / "tools" / "wordings.py"
spec = importlib.util.spec_from_file_location("wordings_tool", TOOL)
wordings = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = wordings  # dataclasses look their module up
spec.loader.exec_module(wordings)


@pytest.mark.parametrize("source, template", [
    ("'plain text'", "plain text"),
    ("f'Expected {n}D input, got {x.dim()}D'", "Expected {}D input, got {}D"),
    ("'size %d mismatch' % n", "size %d mismatch"),
    ("'got {} and {}'.format(a, b)", "got {} and {}"),
    ("message", ""),
])
def test_raise_sites_become_templates_with_their_variable_parts(source, template):
    assert wordings._template(ast.parse(source, mode="eval").body) == template


def test_a_wording_is_covered_only_by_a_rule_that_names_a_cause():
    rules = wordings.specific_rules(load_knowledge_base())
    assert "shape.linear-in-features" in wordings.covered("mat1 and mat2 shapes cannot be multiplied ({})", rules)
    assert wordings.covered("Expected all tensors to be on the same device, but found at least two devices, {}", rules)
    # Fallbacks that match any text (python.key-error, *.generic) cover nothing.
    assert all(not rule.id.endswith(".generic") for rule in rules)
    assert wordings.covered("lorem ipsum {} dolor", rules) == ""


def test_the_committed_table_lists_the_uncovered_wordings():
    table = TOOL.parent.parent / "corpus" / "wordings" / "torch-2.13.tsv"
    rows = [line.split("\t") for line in table.read_text().splitlines()[1:]]
    assert len(rows) > 500 and {row[0] for row in rows} == {"2.13.0+cpu"}
    assert any(not row[2] for row in rows) and any(row[2] for row in rows)
