"""The rule engine: validation with positions, matching semantics and ranking."""

import textwrap

import pytest

from triage.kb import load_knowledge_base, load_paths
from triage.kb.matcher import diagnose
from triage.logparse import parse_text

RULE = """\
- id: team.widget-broke
  category: python
  title: Widget {{ name }} broke
  confidence: 0.7
  match:
    exception: WidgetError
    message: 'widget (?P<name>\\w+) broke'
  hypothesis: The widget {{ name }} broke{% if location %} at {{ location }}{% endif %}.
  fix: Mend {{ name }}.
  examples:
    match: ['WidgetError: widget gear broke']
    no_match: ['WidgetError: widget fine']
"""


def write(tmp_path, text, name="team.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_builtin_knowledge_base_loads_cleanly():
    kb = load_knowledge_base()
    assert kb.problems == []
    assert len(kb.rules) >= 14
    assert len({rule.id for rule in kb.rules}) == len(kb.rules)


def test_match_extracts_groups_and_renders_location(tmp_path):
    kb = load_paths([write(tmp_path, RULE)])
    incident = parse_text('Traceback (most recent call last):\n  File "app.py", line 3, in run\n    go()\nWidgetError: widget gear broke\n')
    [diagnosis] = diagnose(incident, kb)
    assert diagnosis.title == "Widget gear broke"
    assert diagnosis.hypothesis == "The widget gear broke at app.py:3 in run."
    assert diagnosis.values == {"name": "gear"}
    assert "raised at app.py:3 in run: go()" in diagnosis.evidence


def test_a_library_frame_a_rule_matched_is_not_called_the_user_s(tmp_path):
    rule = RULE.replace("    message: 'widget (?P<name>\\w+) broke'",
                        "    message: 'widget (?P<name>\\w+) broke'\n    frame:\n      file: 'widgets[\\\\/]'")
    rule = rule.replace("{% if location %} at {{ location }}{% endif %}",
                        "{% if location and frame.user %} at your {{ location }}{% elif location %} in {{ location }}{% endif %}")
    kb = load_paths([write(tmp_path, rule)])
    assert kb.problems == []
    library = '  File "/usr/lib/python3.11/site-packages/widgets/core.py", line 9, in turn\n    raise WidgetError()\n'
    only_library = parse_text(f"Traceback (most recent call last):\n{library}WidgetError: widget gear broke\n")
    [diagnosis] = diagnose(only_library, kb)
    assert diagnosis.hypothesis == "The widget gear broke in /usr/lib/python3.11/site-packages/widgets/core.py:9 in turn."
    with_user = parse_text('Traceback (most recent call last):\n  File "app.py", line 3, in run\n    turn()\n'
                           f"{library}WidgetError: widget gear broke\n")
    [diagnosis] = diagnose(with_user, kb)
    assert diagnosis.hypothesis == "The widget gear broke at your app.py:3 in run."


@pytest.mark.parametrize(
    ("mutation", "line", "fragment"),
    [
        (("  confidence: 0.7", "  confidance: 0.7"), 4, "unknown key 'confidance' in a rule"),
        (("    message: 'widget (?P<name>\\w+) broke'", "    message: 'widget (?P<name>\\w+ broke'"), 7, "bad regex in 'message'"),
        (("  fix: Mend {{ name }}.", "  fix: Mend {{ nam }}."), 9, "'fix' uses 'nam', which no pattern of this rule captures"),
        (("  category: python", "  category: pyton"), 2, "unknown category 'pyton'"),
        (("  fix: Mend {{ name }}.", "  fix: Mend {{ name }.\n"), 9, "template syntax error"),
        (("    no_match: ['WidgetError: widget fine']", ""), 11, "'examples.no_match' must be a non-empty list"),
    ],
    ids=["unknown-key", "bad-regex", "uncaptured-variable", "unknown-category", "bad-template", "missing-no-match"],
)
def test_validation_reports_file_and_line(tmp_path, mutation, line, fragment):
    old, new = mutation
    assert old in RULE
    path = write(tmp_path, RULE.replace(old, new))
    kb = load_paths([path])
    assert kb.rules == []
    messages = [str(p) for p in kb.problems]
    assert any(m.startswith(f"{path}:{line}:") and fragment in m for m in messages), messages


def test_a_bad_regex_does_not_cascade_into_template_errors(tmp_path):
    kb = load_paths([write(tmp_path, RULE.replace("(?P<name>\\w+) broke", "(?P<name>\\w+ broke"))])
    assert [p.message.split(":")[0] for p in kb.problems] == ["bad regex in 'message'"]


def test_unknown_key_suggests_the_close_one(tmp_path):
    kb = load_paths([write(tmp_path, RULE.replace("  confidence: 0.7", "  confidance: 0.7"))])
    assert kb.problems[0].hint == "did you mean 'confidence'?"


def test_duplicate_id_names_both_places(tmp_path):
    write(tmp_path, RULE, "a.yaml")
    write(tmp_path, RULE, "b.yaml")
    kb = load_paths([tmp_path])
    [problem] = kb.problems
    assert problem.message.startswith("rule id 'team.widget-broke' is defined twice: here and at ")
    assert problem.message.endswith("a.yaml:1") and problem.path.endswith("b.yaml")


def test_yaml_syntax_error_has_a_position(tmp_path):
    kb = load_paths([write(tmp_path, "- id: x\n  match: [unclosed\n")])
    [problem] = kb.problems
    assert problem.line >= 2 and problem.path.endswith("team.yaml")


def test_more_specific_rule_outranks_generic_fallback(tmp_path):
    generic = RULE.replace("team.widget-broke", "team.widget-anything").replace("confidence: 0.7", "confidence: 0.4")
    generic = generic.replace("'widget (?P<name>\\w+) broke'", "'widget (?P<name>\\w+)'").replace("no_match: ['WidgetError: widget fine']", "no_match: ['OtherError: widget fine']")
    kb = load_paths([write(tmp_path, RULE, "a.yaml"), write(tmp_path, generic, "b.yaml")])
    assert kb.problems == []
    ranked = diagnose(parse_text("WidgetError: widget gear broke\n"), kb)
    assert [d.rule for d in ranked] == ["team.widget-broke", "team.widget-anything"]


def test_root_cause_outranks_a_later_exception_in_the_chain(tmp_path):
    kb = load_paths([write(tmp_path, RULE)])
    log = "Traceback (most recent call last):\n  File \"a.py\", line 2, in <module>\n    y()\nWidgetError: widget gear broke\n\nDuring handling of the above exception, another exception occurred:\n\nTraceback (most recent call last):\n  File \"a.py\", line 1, in <module>\n    x()\nWidgetError: widget cog broke\n"
    incident = parse_text(log)
    assert incident.exception.message == "widget gear broke"
    [diagnosis] = diagnose(incident, kb)
    assert diagnosis.values["name"] == "gear"


def test_later_layer_replaces_a_rule_with_the_same_id(tmp_path):
    override = tmp_path / "override"
    override.mkdir()
    write(override, """\
    - id: shape.view-invalid
      category: shape
      title: Team wording for a bad view of {{ numel }} elements
      match:
        message: "shape '\\\\[(?P<shape>[-\\\\d, ]*)\\\\]' is invalid for input of size (?P<numel>\\\\d+)"
      hypothesis: Our data loader pads to 40.
      fix: Use our collate.
      examples:
        match: ["RuntimeError: shape '[3, -1]' is invalid for input of size 40"]
        no_match: ['RuntimeError: something else']
    """)
    kb = load_knowledge_base([override])
    assert kb.problems == []
    [diagnosis] = [d for d in diagnose(parse_text("RuntimeError: shape '[3, -1]' is invalid for input of size 40\n"), kb) if d.rule == "shape.view-invalid"]
    assert diagnosis.title == "Team wording for a bad view of 40 elements"
    assert sum(rule.id == "shape.view-invalid" for rule in kb.rules) == 1


def test_log_only_rule_matches_lines_around_the_failure(tmp_path):
    rule = """\
    - id: team.disk-full
      category: python
      title: Disk full
      match:
        log: 'No space left on device: (?P<path>\\S+)'
      hypothesis: The disk holding {{ path }} is full.
      fix: Free space.
      examples:
        match: ["OSError: [Errno 28] No space left on device: '/ckpt/x.pt'"]
        no_match: ['all good']
    """
    kb = load_paths([write(tmp_path, rule)])
    incident = parse_text("saving checkpoint\nwrite failed: No space left on device: /ckpt/x.pt\nbye\n")
    [diagnosis] = diagnose(incident, kb)
    assert diagnosis.hypothesis == "The disk holding /ckpt/x.pt is full."
    assert "log: write failed: No space left on device: /ckpt/x.pt" in diagnosis.evidence
