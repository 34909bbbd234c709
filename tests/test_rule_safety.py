"""Hostile rule files: huge, deeply nested, alias bombs, catastrophic regexes, templates reaching for internals."""

from __future__ import annotations

import pytest

from triage.kb import yamlpos
from triage.kb.loader import load_rule_file
from triage.kb.yamlpos import YamlError, load_located


def _alias_bomb(levels: int = 9) -> str:
    rows = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    names = "abcdefghijklmnop"
    for prev, cur in zip(names[:levels - 1], names[1:levels]):
        rows.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(rows) + "\n"


def test_deep_nesting_is_refused_with_its_position():
    with pytest.raises(YamlError) as info:
        load_located("- " + "[" * 30 + "]" * 30)
    assert "nested deeper than 24 levels" in info.value.message
    assert info.value.position == yamlpos.Position(1, 2 + yamlpos.MAX_DEPTH)


def test_very_deep_nesting_is_refused_before_the_composer_recurses():
    # 200,000 levels crashed libyaml's recursive composer with SIGSEGV before the event pre-pass.
    with pytest.raises(YamlError, match="nested deeper"):
        load_located("- " + "[" * 200_000 + "]" * 200_000)


def test_nesting_at_the_limit_is_accepted():
    depth = yamlpos.MAX_DEPTH - 1  # the top-level list is one level
    assert load_located("- " + "[" * depth + "]" * depth) is not None


def test_alias_bomb_is_refused_without_expanding_it():
    with pytest.raises(YamlError, match="alias bomb"):
        load_located(_alias_bomb())


def test_small_alias_use_is_fine():
    data = load_located("- id: a.b\n  title: &t shared text\n  fix: *t\n")
    assert data[0]["fix"] == "shared text"


def test_huge_rule_file_is_refused_with_a_message(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text("# padding\n" * (yamlpos.MAX_RULE_FILE_BYTES // 10 + 1))
    rules, problems = load_rule_file(path, "huge.yaml")
    assert rules == []
    assert len(problems) == 1 and problems[0].line == 1
    assert "over the 2 MB limit" in problems[0].message


def test_deep_and_bomb_files_are_problems_with_file_line(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("# a comment\n- id: a.b\n  match: " + "[" * 40 + "]" * 40 + "\n")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_alias_bomb())
    [problem] = load_rule_file(deep, "deep.yaml")[1]
    assert (problem.path, problem.line) == ("deep.yaml", 3) and "nested deeper" in problem.message
    [problem] = load_rule_file(bomb, "bomb.yaml")[1]
    assert "alias bomb" in problem.message


def test_unsafe_yaml_tags_are_not_constructed(tmp_path):
    path = tmp_path / "tags.yaml"
    path.write_text("- id: a.b\n  title: !!python/object/apply:os.system ['echo pwned']\n")
    rules, problems = load_rule_file(path, "tags.yaml")
    assert rules == []
    assert [(p.line, p.col) for p in problems] == [(2, 10)]
    assert "tag 'tag:yaml.org,2002:python/object/apply:os.system' is not allowed" in problems[0].message
