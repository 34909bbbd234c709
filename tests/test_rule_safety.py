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


# --- templates: the sandbox, statically at lint time and again at run time -------------------------

import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from triage.kb import diagnose, load_knowledge_base, templates  # noqa: E402
from triage.kb.rule import Rule  # noqa: E402
from triage.kb.safe_regex import (  # noqa: E402
    FILE_BUDGET_S,
    SEARCH_TIMEOUT_S,
    PatternTimeout,
    compile_pattern,
    nested_quantifiers,
    worst_case,
)
from triage.logparse import parse_text  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
VIEW_LOG = "RuntimeError: shape '[3, -1]' is invalid for input of size 40\n"  # torch 2.13: torch.zeros(40).view(3, -1)

ESCAPES = [
    "{{ ''.__class__.__mro__ }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ self.__init__ }}",
    "{{ exception|attr('__class__') }}",
    "{{ exception['__class__'] }}",
    "{{ '{0.__class__}'.format(exception) }}",
    "{{ numel.mro() }}",
]


def _rule_file(title: str) -> str:
    return textwrap.dedent("""\
        - id: team.escape
          category: shape
          title: "{title}"
          match:
            message: 'is invalid for input of size (?P<numel>\\d+)'
          hypothesis: The tensor has {{{{ numel }}}} elements.
          fix: Use -1.
          examples:
            match: ["RuntimeError: shape '[3, -1]' is invalid for input of size 40"]
            no_match: ['ValueError: x']
        """).format(title=title.replace('"', '\\"'))


@pytest.mark.parametrize("template", ESCAPES)
def test_a_template_reaching_for_internals_fails_lint_at_its_line(tmp_path, template):
    path = tmp_path / "escape.yaml"
    path.write_text(_rule_file(template))
    rules, problems = load_rule_file(path, "escape.yaml")
    assert rules == []
    assert problems and all(p.line == 3 for p in problems)
    assert any("which the template sandbox refuses" in p.message for p in problems)


@pytest.mark.parametrize("template", ESCAPES)
def test_the_sandbox_refuses_the_same_templates_at_run_time(template):
    with pytest.raises(templates.TemplateError):
        templates.render(template, {"exception": {"message": "m"}, "numel": "40"})


def test_a_rule_that_slipped_past_validation_is_refused_at_run_time():
    rule = Rule(id="team.escape", category="shape", title="{{ ''.__class__.__mro__ }}", hypothesis="h", fix="f",
                messages=[compile_pattern("is invalid for input of size (?P<numel>\\d+)")], path="escape.yaml", line=1)
    kb = load_knowledge_base(env={}, cwd=REPO)
    kb.rules.insert(0, rule)
    warnings: list[str] = []
    found = diagnose(parse_text(VIEW_LOG), kb, warnings)
    assert "team.escape" not in [d.rule for d in found]
    assert found[0].rule == "shape.view-invalid"  # the rest of the knowledge base still works
    assert warnings == ["rule team.escape (escape.yaml:1) skipped: template refused by the sandbox: "
                        "access to attribute '__class__' of 'str' object is unsafe."]


BOMBS = [
    "{{ 'x' * 1000000000 }}",
    "{{ 10 ** 100000000 }}",
    "{{ numel * 100000000 }}",
    # silent nested loops: no output, so a budget checked between output chunks never runs
    "{% for i in 'x'*9999 %}{% for j in 'x'*9999 %}{% for k in 'x'*9999 %}{% endfor %}{% endfor %}{% endfor %}",
    "{{ ('x'*9999)|join('y'*9999) }}",  # 100 MB, and a join of that joined again is 4 GB
    "{{ ('y'*9999).join(('x'*9999)|map('upper')) }}",
    "{{ ('x'*9999)|map('center', 9999)|join }}",
    "{{ 'x'.center(999999999) }}",
    "{{ 'x'|center(999999999) }}",
    "{{ '{:999999999}'.format(1) }}",
    "{{ '{:{}}'.format(1, 10**9) }}",
    "{{ '%999999999d' % 1 }}",
    "{% set a = 'x'*9999 %}{% set b = a~a %}{% set c = b~b %}{% set d = c~c %}{% set e = d~d %}{{ e~e }}",
    "{% set a = 'x'*9999 %}{% set b = a+a %}{% set c = b+b %}{% set d = c+c %}{% set e = d+d %}{{ e+e }}",
    "{{ ('x'*9999).replace('x', 'y'*9999) }}",
    "{{ [1]|batch(999999999, 'x')|list }}",
    "{{ ('x\t'*5000).expandtabs(9999) }}",
]


@pytest.mark.parametrize("template", BOMBS)
def test_templates_cannot_exhaust_memory_or_time(template):
    started = time.monotonic()
    with pytest.raises(templates.TemplateRefused):
        templates.render(template, {"numel": "40"})
    assert time.monotonic() - started < 1


def test_ordinary_templates_still_render():
    text = templates.render("{% if got|int > want|int %}more{% endif %} {{ exception.message.upper() }} {{ 2 ** 10 }}",
                            {"got": "5", "want": "3", "exception": {"message": "m"}})
    assert text == "more M 1024"


# --- regexes: a time limit on every search; lint finds catastrophic patterns ----------------------


def test_a_catastrophic_pattern_times_out_once_then_is_disabled():
    pattern = compile_pattern(r"(a+)+$")
    text = "a" * 50_000 + "!"
    with pytest.raises(PatternTimeout, match="disabled"):
        pattern.search(text)
    assert pattern.disabled
    started = time.monotonic()
    assert pattern.search(text) is None
    assert time.monotonic() - started < 0.01


def test_lint_stress_test_finds_catastrophic_patterns_and_passes_ordinary_ones():
    for source in [r"(a+)+$", r"(x+x+)+y", r"(\w+\s?)+$", r"fused_ln: (a|aa)+$"]:
        assert worst_case(compile_pattern(source)) is not None, source
    for source in [r"mat1 and mat2 shapes cannot be multiplied \((?P<rows>\d+)x(?P<got>\d+)",
                   r"^\s*File \"(?P<file>[^\"]+)\", line (?P<line>\d+)", r"(?:CUDA|HIP) error: (?P<what>.*)$"]:
        assert worst_case(compile_pattern(source)) is None, source


CATASTROPHIC_RULE = """\
- id: team.slow
  category: shape
  title: slow rule
  match:
    exception: RuntimeError
    message: '(a+)+$'
  hypothesis: h
  fix: f
  examples:
    match: ['RuntimeError: aaa']
    no_match: ['ValueError: x']
"""


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRIAGE_RULES", "TRIAGE_DEBUG")}
    env.update(HOME=str(tmp_path / "home"), XDG_CONFIG_HOME=str(tmp_path / "xdg"),
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def _explain(tmp_path: Path, log: Path, *extra: str) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "triage", "explain", str(log), *extra], cwd=tmp_path,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=120)  # fmt: skip
    return time.monotonic() - started, done


def test_explain_with_a_catastrophic_team_regex_costs_at_most_its_time_limit(tmp_path):
    # The message: a long run of a's, then a character that makes (a+)+$ backtrack through every split.
    log = tmp_path / "crash.log"
    log.write_text("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n    step()\n"
                   "RuntimeError: " + "a" * 20_000 + "!\n")
    slow = tmp_path / "slow.yaml"
    slow.write_text(CATASTROPHIC_RULE)
    plain = tmp_path / "plain.yaml"
    plain.write_text(CATASTROPHIC_RULE.replace("(a+)+$", "a+!$"))

    # Without a time limit this search runs for minutes; it really is catastrophic.
    with pytest.raises(TimeoutError):
        compile_pattern(r"(a+)+$").compiled.search(log.read_text(), timeout=1.0)

    without, done_plain = _explain(tmp_path, log, "--rules", str(plain))
    with_slow, done = _explain(tmp_path, log, "--rules", str(slow))
    assert done_plain.returncode == 0 and done.returncode == 0, done.stderr
    assert done.stdout.count("took over") == 1  # one warning line, in the report
    assert f"rule team.slow (slow.yaml:1): pattern '(a+)+$' took over {SEARCH_TIMEOUT_S}s; disabled" in done.stdout
    # The limit is CPU time; on a loaded machine wall time can be a few times longer, hence the bound.
    assert with_slow - without < 10 * SEARCH_TIMEOUT_S + 1.0, (with_slow, without)


def _hostile_rules(count: int = 200) -> str:
    """Rules that all match the crash below: catastrophic patterns, and templates that loop or allocate."""
    template_rule = textwrap.dedent("""\
        - id: team.bomb{n}
          category: shape
          title: "{{% for i in 'x'*9999 %}}{{% for j in 'x'*9999 %}}{{% for k in 'x'*9999 %}}{{% endfor %}}{{% endfor %}}{{% endfor %}}"
          match:
            exception: RuntimeError
            message: 'a!'
          hypothesis: "{{{{ (('x'*9999)|join('y'*9999))|join('z'*9999) }}}}"
          fix: "{{{{ ('y'*9999).join(('x'*9999)|map('center', 9999)) }}}}"
          examples:
            match: ['RuntimeError: aaa!']
            no_match: ['ValueError: x']
        """)
    return "".join(template_rule.format(n=n) + CATASTROPHIC_RULE.replace("team.slow", f"team.slow{n}") for n in range(count))


def test_a_hostile_rule_file_cannot_hold_explain_past_ten_seconds(tmp_path):
    import resource

    log = tmp_path / "crash.log"
    log.write_text("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n    step()\n"
                   "RuntimeError: " + "a" * 20_000 + "!\n")
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / ".triage" / "rules").mkdir(parents=True)
    (tmp_path / "none.yaml").write_text("[]\n")
    given = tmp_path / "given.yaml"
    given.write_text(_hostile_rules().replace("team.", "given."))

    def timed(*extra: str) -> tuple[float, float, subprocess.CompletedProcess]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "triage", "explain", str(log), *extra], cwd=project,
                              env={**_env(tmp_path), "TRIAGE_NO_CACHE": "1"}, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert done.returncode == 0, done.stderr
        return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done

    plain_wall, plain_cpu, _ = timed("--rules", str(tmp_path / "none.yaml"))
    (project / ".triage" / "rules" / "hostile.yaml").write_text(_hostile_rules())
    wall, cpu, done = timed("--rules", str(given))
    assert "regex budget and are disabled" in done.stdout
    # The budgets bound CPU time. On a machine shared with other work, wall time stretches by the
    # same factor as a plain explain's, measured just before.
    slowdown = max(1.0, plain_wall / max(plain_cpu, 0.01))
    assert cpu < 10, cpu
    assert wall < 10 * slowdown, (wall, slowdown)


def test_loading_team_rules_has_one_time_budget(tmp_path):
    from triage.kb.loader import LOAD_BUDGET_S

    rule = CATASTROPHIC_RULE.replace("(a+)+$", "a+!$").replace("hypothesis: h", "hypothesis: '{{ exception.message }}'")
    path = tmp_path / "many.yaml"
    path.write_text("".join(rule.replace("team.slow", f"team.many{n}") for n in range(4000)))
    assert path.stat().st_size < 2 << 20  # under the size limit: only time stops it
    started = time.thread_time()
    kb = load_knowledge_base([path], env={}, cwd=tmp_path)  # a partial layer is never cached
    assert time.thread_time() - started < LOAD_BUDGET_S + 1.5
    stopped = [p for p in kb.problems if "not loaded from here on" in p.message]
    assert len(stopped) == 1 and stopped[0].path.endswith("many.yaml") and stopped[0].line > 1
    loaded = [r for r in kb.rules if r.id.startswith("team.many")]
    assert 0 < len(loaded) < 4000 and kb.get("shape.view-invalid") is not None


def test_a_file_of_hostile_templates_costs_little_more_than_one(tmp_path):
    path = tmp_path / "bombs.yaml"
    path.write_text(_hostile_rules().replace("team.slow", "team.fast").replace("(a+)+$", "a+!$"))
    kb = load_knowledge_base([path], env={}, cwd=tmp_path)
    incident = parse_text("RuntimeError: " + "a" * 20_000 + "!\n")
    warnings: list[str] = []
    started = time.thread_time()
    found = diagnose(incident, kb, warnings)
    spent = time.thread_time() - started
    refused = [warning for warning in warnings if "template refused by the sandbox" in warning]
    assert len(refused) == 200 and not [d for d in found if d.rule.startswith("team.bomb")]
    assert spent < templates.REFUSED_TOTAL_S + 200 * templates.ALLOWANCE_S + 1.0, spent


def test_lint_reports_a_catastrophic_regex_at_its_line(tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "slow.yaml").write_text(CATASTROPHIC_RULE)
    done = subprocess.run([sys.executable, "-m", "triage", "rules", "lint", "rules"], cwd=tmp_path,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1
    first = done.stdout.splitlines()[0]
    assert first.startswith("rules/slow.yaml:6:14: regex in 'message' can backtrack catastrophically: it has a group "
                            "that repeats a repetition, such as (a+)+")
    assert "help: avoid nested or overlapping repetition" in done.stdout


@pytest.mark.parametrize("source", [r"(a+)+$", r"(x+x+)+y", r"(\w+\s?)+$", r"fused_ln: (a|aa)+$", r"\s*(\d+,?\s*)+"])
def test_nested_quantifiers_are_found_without_running_the_pattern(source):
    assert nested_quantifiers(source) is not None


@pytest.mark.parametrize("source", [r"(?:\w+\.)+\w+", r"(ab|cd)+", r"(foo|foobar)+x", r"(?:CUDA|HIP) error: (?P<what>.*)$",
                                    r"mat1 and mat2 shapes cannot be multiplied \((?P<rows>\d+)x(?P<got>\d+)"])
def test_ordinary_repetition_is_not_flagged(source):
    assert nested_quantifiers(source) is None


def test_the_built_in_knowledge_base_has_no_nested_quantifiers():
    kb = load_knowledge_base(env={}, cwd=REPO)
    flagged = [(rule.id, pattern.source) for rule in kb.rules
               for pattern in [*rule.messages, *rule.not_messages, *rule.logs, *rule.not_logs]
               if nested_quantifiers(pattern.source)]  # fmt: skip
    assert flagged == []


def test_a_file_of_catastrophic_patterns_spends_one_budget_not_one_limit_each(tmp_path):
    path = tmp_path / "slow.yaml"
    path.write_text("".join(CATASTROPHIC_RULE.replace("team.slow", f"team.slow{n}") for n in range(200)))
    kb = load_knowledge_base([path], env={}, cwd=tmp_path)
    assert len([rule for rule in kb.rules if rule.id.startswith("team.slow")]) == 200
    incident = parse_text("RuntimeError: " + "a" * 20_000 + "!\n")
    warnings: list[str] = []
    started = time.monotonic()
    diagnose(incident, kb, warnings)
    assert time.monotonic() - started < FILE_BUDGET_S + 2 * SEARCH_TIMEOUT_S + 1.0
    assert any(f"the patterns spent their {FILE_BUDGET_S:g}s regex budget and are disabled" in w for w in warnings)
    assert len(warnings) <= FILE_BUDGET_S / SEARCH_TIMEOUT_S + 2  # a few timeouts, then one line for the file


# --- a broken team rule never takes explain down ---------------------------------------------------


def test_broken_team_rules_are_one_warning_each_and_the_rest_still_works(tmp_path):
    rules = tmp_path / "project" / ".triage" / "rules"
    rules.mkdir(parents=True)
    (rules / "syntax.yaml").write_text("- id: team.broken\n  title: [unclosed\n")
    (rules / "deep.yaml").write_text("- " + "[" * 100_000 + "]" * 100_000 + "\n")
    (rules / "runtime.yaml").write_text(textwrap.dedent("""\
        - id: team.divides
          category: shape
          title: view of {{ numel }} elements
          confidence: 0.99
          match:
            message: 'is invalid for input of size (?P<numel>\\d+)'
          hypothesis: "Per element: {{ (numel|int) // 0 }}"
          fix: Use -1.
          examples:
            match: ["RuntimeError: shape '[3, -1]' is invalid for input of size 40"]
            no_match: ['ValueError: x']
        """))
    log = tmp_path / "project" / "view.log"
    log.write_text(VIEW_LOG)
    done = subprocess.run([sys.executable, "-m", "triage", "explain", "view.log", "--format", "json"],
                          cwd=log.parent, env=_env(tmp_path), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    warnings = done.stderr.strip().splitlines()
    assert len(warnings) == 2
    assert warnings[0].startswith("triage: warning: rule skipped: .triage/rules/deep.yaml:1:")
    assert warnings[1].startswith("triage: warning: rule skipped: .triage/rules/syntax.yaml:")
    report = json.loads(done.stdout)
    rules_found = [d["rule"] for d in report["diagnoses"]]
    assert rules_found[:2] == ["team.divides", "shape.view-invalid"]
    assert report["warnings"] == ["rule team.divides (.triage/rules/runtime.yaml:1): hypothesis: "
                                  "template failed: ZeroDivisionError: integer division or modulo by zero"]


def test_an_internal_error_in_one_rule_is_a_warning(monkeypatch):
    monkeypatch.delenv("TRIAGE_DEBUG")  # the suite raises internal errors; this test is about the user's view
    kb = load_knowledge_base(env={}, cwd=REPO)
    victim = kb.get("shape.broadcast")

    class Exploding:
        source = "boom"

        def search(self, text):
            raise ValueError("a bug in a rule")

    monkeypatch.setattr(victim, "messages", [Exploding()])
    warnings: list[str] = []
    found = diagnose(parse_text(VIEW_LOG), kb, warnings)
    assert found[0].rule == "shape.view-invalid"
    assert warnings == [f"rule shape.broadcast ({victim.location}) skipped: internal error ValueError: a bug in a rule"]
    monkeypatch.setenv("TRIAGE_DEBUG", "1")  # under debugging the same failure is loud
    with pytest.raises(ValueError):
        diagnose(parse_text(VIEW_LOG), kb)


def test_a_bug_while_reading_team_layers_keeps_the_built_in_rules(monkeypatch, tmp_path):
    from triage.kb import loader, searchpath

    def broken(*args, **kwargs):
        raise OSError("simulated: unreadable folder")

    monkeypatch.delenv("TRIAGE_DEBUG", raising=False)
    (tmp_path / ".triage" / "rules").mkdir(parents=True)
    monkeypatch.setattr(loader, "read_config", broken)  # the loader reads each layer's triage.yaml with it
    kb = load_knowledge_base(env={}, cwd=tmp_path)
    assert kb.get("shape.view-invalid") is not None
    [problem] = kb.problems
    assert problem.path.endswith("triage.yaml") and "simulated: unreadable folder" in problem.message
    monkeypatch.setattr(searchpath, "search_path", broken)
    kb = load_knowledge_base(env={}, cwd=tmp_path)
    assert kb.get("shape.view-invalid") is not None and "built-in rules only" in kb.problems[0].message
