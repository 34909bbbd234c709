"""Team rules end to end: the search path, overrides, disabling, authoring commands, lint and custom probes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from triage.kb import diagnose, load_knowledge_base
from triage.kb.searchpath import find_project_rules, search_path, user_rules_dir
from triage.logparse import parse_text

REPO = Path(__file__).resolve().parent.parent

# A team's own failure: flash-attn refuses float32 inputs. Message as printed by flash-attn
# (https://github.com/xorbitsai/inference/issues/3770, https://github.com/unslothai/unsloth/issues/827).
FLASH_ATTN_LOG = """\
Traceback (most recent call last):
  File "/home/ana/llm/eval.py", line 58, in <module>
    logits = model(batch["input_ids"])
  File "/home/ana/llm/model.py", line 121, in forward
    out = flash_attn_func(q, k, v, causal=True)
  File "/usr/local/lib/python3.10/dist-packages/flash_attn/flash_attn_interface.py", line 839, in forward
    out_padded, softmax_lse, S_dmask, rng_state = _wrapped_flash_attn_forward(
  File "/usr/local/lib/python3.10/dist-packages/flash_attn/flash_attn_interface.py", line 96, in _flash_attn_forward
    out, softmax_lse, S_dmask, rng_state = flash_attn_gpu.fwd(
RuntimeError: FlashAttention only support fp16 and bf16 data type
"""
# torch 2.13 (CPU): torch.zeros(40).view(3, -1)
VIEW_LOG = "RuntimeError: shape '[3, -1]' is invalid for input of size 40\n"
# torch 2.13 (CPU): nn.BatchNorm1d(10).train()(torch.zeros(1, 10))
BATCHNORM_LOG = "ValueError: Expected more than 1 value per channel when training, got input size torch.Size([1, 10])\n"

FLASH_ATTN_RULE = """\
# Our models call flash-attn directly; its kernels take only fp16/bf16 inputs.
- id: team.flash-attn-fp32
  category: dtype
  title: flash-attn got float32 q/k/v{% if location %} at {{ location }}{% endif %}
  confidence: 0.93
  match:
    exception: RuntimeError
    message: 'FlashAttention only support fp16 and bf16 data type'
  hypothesis: >
    flash-attn's kernels accept only float16 and bfloat16 inputs; this call got float32,
    which happens when the model runs outside torch.autocast (eval scripts, notebooks).
  fix: >
    Run the forward pass under torch.autocast("cuda", dtype=torch.bfloat16), or cast q, k, v
    with .bfloat16() before flash_attn_func.
  examples:
    match:
      - 'RuntimeError: FlashAttention only support fp16 and bf16 data type'
    no_match:
      - 'RuntimeError: FlashAttention only supports Ampere GPUs or newer.'
"""

VIEW_OVERRIDE = """\
- id: shape.view-invalid
  category: shape
  title: packed batch of {{ numel }} elements cannot be viewed as [{{ shape }}]
  confidence: 0.9
  match:
    exception: RuntimeError
    message: "shape '\\\\[(?P<shape>[-\\\\d, ]*)\\\\]' is invalid for input of size (?P<numel>\\\\d+)"
  hypothesis: >
    In our code base this is almost always packed_collate dropping the padding of the last
    sequence: the view expects [{{ shape }}] but the packed tensor has {{ numel }} elements.
  fix: Pass pad_to_multiple=8 to packed_collate (see data/collate.py).
  examples:
    match:
      - log: "RuntimeError: shape '[3, -1]' is invalid for input of size 40"
        vars: {shape: '3, -1', numel: 40}
    no_match:
      - "RuntimeError: view size is not compatible with input tensor's size and stride"
"""

CONFIG = """\
disable:
  - shape.batchnorm-single-sample   # our eval runs BatchNorm on single samples on purpose
"""


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """A process environment with no user rules and no TRIAGE_RULES from the machine running the tests."""
    clean = {k: v for k, v in os.environ.items() if k not in ("TRIAGE_RULES", "XDG_CONFIG_HOME", "TRIAGE_DEBUG")}
    clean["HOME"] = str(tmp_path / "home")
    clean["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    clean["PYTHONPATH"] = str(REPO) + os.pathsep + clean.get("PYTHONPATH", "")
    for key in ("NO_COLOR", "FORCE_COLOR", "COLUMNS"):
        clean.pop(key, None)
    return clean


@pytest.fixture
def project(tmp_path) -> Path:
    """A project whose .triage/rules adds a rule, overrides a built-in one and disables another."""
    root = tmp_path / "project"
    rules = root / ".triage" / "rules"
    rules.mkdir(parents=True)
    (root / ".git").mkdir()  # the project's rules are looked for up to its repository root
    (rules / "flash_attn.yaml").write_text(FLASH_ATTN_RULE)
    (rules / "overrides.yaml").write_text(VIEW_OVERRIDE)
    (rules / "triage.yaml").write_text(CONFIG)
    (root / "src" / "deep").mkdir(parents=True)
    (root / "flash.log").write_text(FLASH_ATTN_LOG)
    (root / "view.log").write_text(VIEW_LOG)
    (root / "batchnorm.log").write_text(BATCHNORM_LOG)
    return root


def triage(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "triage", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def explain_json(log: Path, cwd: Path, env: dict[str, str], *extra: str) -> dict:
    done = triage("explain", str(log), "--format", "json", *extra, cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# --- explain, in a subprocess, from inside the project --------------------------------------------


def test_explain_uses_a_new_team_rule_found_upward_from_the_cwd(project, env):
    report = explain_json(project / "flash.log", project / "src" / "deep", env)
    leading = report["diagnoses"][0]
    assert leading["rule"] == "team.flash-attn-fp32"
    assert leading["category"] == "dtype"
    assert "/home/ana/llm/model.py:121" in leading["title"]


def test_explain_uses_the_teams_override_of_a_built_in_rule(project, env):
    report = explain_json(project / "view.log", project, env)
    [leading] = [d for d in report["diagnoses"] if d["rule"] == "shape.view-invalid"]
    assert "packed_collate" in leading["hypothesis"] and "[3, -1]" in leading["hypothesis"]
    assert "pad_to_multiple=8" in leading["fix"]
    assert leading["confidence"] == pytest.approx(0.9)


def test_explain_leaves_out_a_disabled_rule(project, env, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    before = explain_json(project / "batchnorm.log", outside, env)
    assert before["diagnoses"][0]["rule"] == "shape.batchnorm-single-sample"
    after = explain_json(project / "batchnorm.log", project, env)
    assert "shape.batchnorm-single-sample" not in [d["rule"] for d in after["diagnoses"]]


def test_explain_rules_option_is_the_last_layer(project, env, tmp_path):
    extra = tmp_path / "extra.yaml"
    text = FLASH_ATTN_RULE.replace("confidence: 0.93", "confidence: 0.5")
    extra.write_text(text.replace("title: flash-attn", "title: EXTRA flash-attn"))
    report = explain_json(project / "flash.log", project, env, "--rules", str(extra))
    assert report["diagnoses"][0]["title"].startswith("EXTRA")


# --- the loader function the runner calls ---------------------------------------------------------


def test_loader_function_gives_the_runner_the_same_rules(project, env):
    kb = load_knowledge_base(cwd=project / "src", env=env)
    assert not kb.problems
    assert kb.get("team.flash-attn-fp32").origin == "project"
    assert kb.get("shape.view-invalid").origin == "project"
    assert kb.get("shape.batchnorm-single-sample") is None
    [override] = kb.overridden
    assert override.replaced.origin == "built-in" and override.by.path.endswith("overrides.yaml")
    [disabled] = kb.disabled
    assert disabled.rule.id == "shape.batchnorm-single-sample" and disabled.at.endswith("triage.yaml:2")

    assert diagnose(parse_text(FLASH_ATTN_LOG), kb)[0].rule == "team.flash-attn-fp32"
    view = diagnose(parse_text(VIEW_LOG), kb)[0]
    assert view.rule == "shape.view-invalid" and "packed_collate" in view.hypothesis
    assert all(d.rule != "shape.batchnorm-single-sample" for d in diagnose(parse_text(BATCHNORM_LOG), kb))


def test_search_path_order_and_last_same_id_wins(tmp_path, env):
    def folder(name: str) -> Path:
        path = tmp_path / name
        path.mkdir(parents=True)
        text = FLASH_ATTN_RULE.replace("title: flash-attn", f"title: {name.upper()} flash-attn")
        (path / "team.yaml").write_text(text)
        return path

    user = folder("xdg/triage/rules")
    project = tmp_path / "repo"
    folder("repo/.triage/rules")
    first_env, second_env = folder("env1"), folder("env2")
    option = folder("option")
    env = {**env, "TRIAGE_RULES": f"{first_env}{os.pathsep}{second_env}"}
    layers = search_path([option], cwd=project, env=env)
    origins = [layer.origin for layer in layers]
    assert origins == ["built-in", "user", "project", "TRIAGE_RULES", "TRIAGE_RULES", "--rules"]
    assert layers[1].path == user
    kb = load_knowledge_base([option], cwd=project, env=env)
    assert kb.get("team.flash-attn-fp32").title.startswith("OPTION")
    assert len(kb.overridden) == 4
    del env["TRIAGE_RULES"]
    kb = load_knowledge_base([], cwd=project, env=env)
    assert kb.get("team.flash-attn-fp32").title.startswith("REPO/.TRIAGE/RULES")
    kb = load_knowledge_base([], cwd=tmp_path, env=env)
    assert kb.get("team.flash-attn-fp32").title.startswith("XDG/TRIAGE/RULES")


def test_user_folder_follows_xdg_and_falls_back_to_home(tmp_path):
    assert user_rules_dir({"XDG_CONFIG_HOME": "/cfg", "HOME": "/h"}) == Path("/cfg/triage/rules")
    assert user_rules_dir({"HOME": "/h"}) == Path("/h/.config/triage/rules")
    assert user_rules_dir({"XDG_CONFIG_HOME": "relative", "HOME": "/h"}) == Path("/h/.config/triage/rules")
    assert find_project_rules(tmp_path) is None


def test_missing_rules_paths_are_reported_not_fatal(tmp_path, env):
    env = {**env, "TRIAGE_RULES": str(tmp_path / "nope")}
    kb = load_knowledge_base([tmp_path / "also-nope"], cwd=tmp_path, env=env)
    assert len(kb.rules) > 5
    messages = sorted(p.message for p in kb.problems)
    assert messages == ["no such rule file or folder (from --rules)", "no such rule file or folder (from TRIAGE_RULES)"]


# --- triage rules list / show / test ---------------------------------------------------------------


def test_rules_list_shows_origins_overrides_and_disabled(project, env):
    done = triage("rules", "list", cwd=project, env=env)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "project       .triage/rules  (2 rules, config .triage/rules/triage.yaml)" in out
    assert "team.flash-attn-fp32" in out and ".triage/rules/flash_attn.yaml:2" in out
    [view] = [line for line in out.splitlines() if line.startswith("shape.view-invalid")]
    assert "project" in view and ".triage/rules/overrides.yaml:1" in view and "(overrides built-in " in view
    disabled = out.split("\ndisabled:\n")[1]
    assert disabled.startswith("shape.batchnorm-single-sample")
    assert "(disabled by .triage/rules/triage.yaml:2)" in disabled
    assert "1 overridden, 1 disabled" in done.stderr


def test_rules_show_says_where_a_rule_comes_from(project, env):
    done = triage("rules", "show", "shape.view-invalid", cwd=project, env=env)
    assert "defined at .triage/rules/overrides.yaml:1  [project]" in done.stdout
    assert "overrides " in done.stdout and "shape.yaml:" in done.stdout
    done = triage("rules", "show", "shape.batchnorm-single-sample", cwd=project, env=env)
    assert "DISABLED by .triage/rules/triage.yaml:2  [project]" in done.stdout


def test_rules_test_prints_each_failure_with_file_line_and_what_matched_instead(tmp_path, env):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "team.yaml").write_text(textwrap.dedent("""\
        - id: team.view
          category: shape
          title: view fails
          match:
            exception: RuntimeError
            message: 'is invalid for input of size (?P<numel>\\d+)'
          hypothesis: The view does not fit {{ numel }} elements.
          fix: Use -1.
          examples:
            match:
              - "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x57600 and 64x128)"
              - log: "RuntimeError: shape '[3, -1]' is invalid for input of size 40"
                vars: {numel: 41}
            no_match:
              - "RuntimeError: shape '[2, 2]' is invalid for input of size 5"
        """))
    done = triage("rules", "test", str(rules), cwd=tmp_path, env=env)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0].startswith("rules/team.yaml:11: team.view: match example did not match")
    assert "matched instead: shape.linear-in-features" in lines[0]
    assert lines[1] == "rules/team.yaml:12: team.view: expected numel=41, extracted '40'"
    assert lines[2] == "rules/team.yaml:15: team.view: no_match example matched the rule, extracting numel='5'"
    assert lines[3] == "0 passed, 3 failed (1 rules)"


def test_builtin_knowledge_base_passes_its_own_tests_and_lint(env):
    for command in ("test", "lint"):
        done = triage("rules", command, cwd=REPO, env=env)
        assert done.returncode == 0, done.stdout + done.stderr


# --- lint: each class of mistake at its file:line:col ------------------------------------------------

BROKEN = """\
- id: team.unknown-key
  category: shape
  title: a title
  hypotesis: misspelt key
  fix: x
  match: {exception: RuntimeError}
  examples: {match: ['RuntimeError: x'], no_match: ['ValueError: x']}

- id: team.bad-regex
  category: shape
  title: a title
  hypothesis: h
  fix: f
  match:
    message: 'fused_ln: (?P<dim>\\d+'
  examples: {match: ['RuntimeError: x'], no_match: ['ValueError: x']}

- id: team.uncaptured
  category: shape
  title: a title
  hypothesis: >
    The layer expects {{ want }} features
    but receives {{ gto }}.
  fix: f
  match:
    message: 'expected (?P<want>\\d+), got (?P<got>\\d+)'
  examples: {match: ['RuntimeError: expected 3, got 4'], no_match: ['ValueError: x']}

- id: team.category-and-probe
  category: shapes
  title: a title
  hypothesis: h
  fix: f
  probes: [shape_tracer]
  match: {exception: RuntimeError}
  examples: {match: ['RuntimeError: x'], no_match: ['ValueError: x']}

- id: team.example-mismatch
  category: shape
  title: a title
  hypothesis: h
  fix: f
  match:
    message: 'fused_ln: normalized dim (?P<dim>\\d+)'
  examples:
    match:
      - 'RuntimeError: fused_ln: normalised dim 768 does not match 1024'
    no_match: ['ValueError: x']

- id: team.duplicated
  category: shape
  title: a title
  hypothesis: h
  fix: f
  match: {exception: KeyError}
  examples: {match: ['KeyError: x'], no_match: ['ValueError: x']}
"""

DUPLICATE = """\
# the same id as in broken.yaml
- id: team.duplicated
  category: shape
  title: another title
  hypothesis: h
  fix: f
  match: {exception: KeyError}
  examples: {match: ['KeyError: y'], no_match: ['ValueError: y']}
"""


@pytest.fixture
def broken_rules(tmp_path) -> Path:
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "broken.yaml").write_text(BROKEN)
    (folder / "dup.yaml").write_text(DUPLICATE)
    return folder


def lint_output(folder: Path, env: dict[str, str]) -> tuple[int, list[str]]:
    done = triage("rules", "lint", str(folder), cwd=folder.parent, env=env)
    return done.returncode, done.stdout.strip().split("\n\n")


def block_for(blocks: list[str], location: str) -> str:
    [block] = [b for b in blocks if b.startswith(location)]
    return block


def test_lint_reports_every_class_of_mistake_at_once(broken_rules, env):
    code, blocks = lint_output(broken_rules, env)
    assert code == 1
    heads = [block.splitlines()[0] for block in blocks]
    assert heads == [
        "rules/broken.yaml:4:3: unknown key 'hypotesis' in a rule",
        "rules/broken.yaml:15:36: bad regex in 'message': missing ) at position 21",
        "rules/broken.yaml:23:21: 'hypothesis' uses 'gto', which no pattern of this rule captures",
        "rules/broken.yaml:30:13: unknown category 'shapes'",
        "rules/broken.yaml:34:12: unknown probe 'shape_tracer'",
        "rules/broken.yaml:47:9: example for team.example-mismatch: match example did not match "
        "(it parsed as 'RuntimeError: fused_ln: normalised dim 768 does not match 1024'; no rule matched it)",
        "rules/dup.yaml:2:1: rule id 'team.duplicated' is defined twice: here and at rules/broken.yaml:50",
    ]


def test_lint_shows_the_line_a_caret_and_help(broken_rules, env):
    _code, blocks = lint_output(broken_rules, env)
    assert block_for(blocks, "rules/broken.yaml:4:3").splitlines()[1:] == [
        "    4 |   hypotesis: misspelt key",
        "      |   ^",
        "  help: did you mean 'hypothesis'?",
    ]
    regex_block = block_for(blocks, "rules/broken.yaml:15:36").splitlines()
    assert regex_block[1:3] == [  # the caret is where the missing ')' belongs
        "   15 |     message: 'fused_ln: (?P<dim>\\d+'",
        "      |                                    ^",
    ]
    assert block_for(blocks, "rules/broken.yaml:23:21").splitlines()[1:] == [
        "   23 |     but receives {{ gto }}.",
        "      |                     ^",
        "  help: did you mean 'got'?",
    ]
    assert block_for(blocks, "rules/broken.yaml:30:13").endswith("help: did you mean 'shape'?")
    assert "help: did you mean 'shape_trace'?" in block_for(blocks, "rules/broken.yaml:34:12")
    assert "help: ids are unique within a rules folder" in block_for(blocks, "rules/dup.yaml:2:1")


def test_in_process_lint_of_the_same_fixture(broken_rules):
    from triage.kb import load_layers
    from triage.kb.lint import lint
    from triage.kb.loader import builtin_rules_dir
    from triage.kb.searchpath import Layer

    kb = load_layers([Layer("built-in", builtin_rules_dir()), Layer("given", broken_rules, required=True)])
    rules = [rule for rule in kb.rules if rule.origin == "given"]
    found = [(Path(p.path).name, p.line) for p in lint(kb, rules)]
    assert found == [("broken.yaml", 4), ("broken.yaml", 15), ("broken.yaml", 23), ("broken.yaml", 30),
                     ("broken.yaml", 34), ("broken.yaml", 47), ("dup.yaml", 2)]  # fmt: skip


# --- triage rules new ------------------------------------------------------------------------------


def test_a_scaffold_fails_lint_until_every_placeholder_is_filled(tmp_path, env):
    project = tmp_path / "proj"
    project.mkdir()
    done = triage("rules", "new", "team.flash-attn-fp32", cwd=project, env=env)
    assert done.returncode == 0, done.stderr
    target = project / ".triage" / "rules" / "team.yaml"
    assert f"{target.relative_to(project)}:3" in done.stdout
    code, blocks = lint_output(target.parent, env)
    assert code == 1
    assert len(blocks) == 9 and all("placeholder from `triage rules new` not filled in" in b for b in blocks)
    assert blocks[0].startswith("rules/team.yaml:4:14:")  # the category: 'team' is no category

    # Explain skips the unfinished rule with warnings; the rest of the knowledge base still works.
    (project / "view.log").write_text(VIEW_LOG)
    explained = triage("explain", "view.log", "--format", "json", cwd=project, env=env)
    assert json.loads(explained.stdout)["diagnoses"][0]["rule"] == "shape.view-invalid"
    assert explained.stderr.count("placeholder from `triage rules new`") == 9

    target.write_text(FLASH_ATTN_RULE)
    code, blocks = lint_output(target.parent, env)
    assert code == 0, blocks


def test_new_on_an_existing_id_copies_the_rule_to_override_it(tmp_path, env):
    project = tmp_path / "proj"
    (project / ".triage" / "rules").mkdir(parents=True)
    done = triage("rules", "new", "shape.view-invalid", cwd=project, env=env)
    assert done.returncode == 0, done.stderr
    assert "copied rule 'shape.view-invalid'" in done.stdout
    text = (project / ".triage" / "rules" / "shape.yaml").read_text()
    assert text.startswith("# Overrides shape.view-invalid from ") and "\n- id: shape.view-invalid\n" in text
    assert triage("rules", "lint", ".triage/rules", cwd=project, env=env).returncode == 0
    listed = triage("rules", "list", cwd=project, env=env).stdout
    assert "(overrides built-in " in listed
    again = triage("rules", "new", "shape.view-invalid", cwd=project, env=env)
    assert again.returncode == 2 and "already defined in this folder" in again.stderr


def test_new_refuses_a_bad_id(tmp_path, env):
    done = triage("rules", "new", "NotAnId", cwd=tmp_path, env=env)
    assert done.returncode == 2 and "is not a rule id" in done.stderr


# --- custom probes ---------------------------------------------------------------------------------

PROBE_RULE = FLASH_ATTN_RULE.replace("  examples:", "  probes: [flash_attn_dtypes]\n  examples:")


def test_a_probe_named_in_triage_yaml_validates_and_loads_only_when_run(tmp_path, env, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", env["XDG_CONFIG_HOME"])
    rules = tmp_path / "rules"
    tools = tmp_path / "tools"
    rules.mkdir()
    tools.mkdir()
    (rules / "team.yaml").write_text(PROBE_RULE)
    (tools / "team_probes_dtypes.py").write_text("def check(context):\n    return 'ran'\n")

    unregistered = load_knowledge_base([rules], cwd=tmp_path, env=env)
    [problem] = unregistered.problems
    found = (Path(problem.path).name, problem.line, problem.message)
    assert found == ("team.yaml", 15, "unknown probe 'flash_attn_dtypes'")

    config = "probes:\n  flash_attn_dtypes: team_probes_dtypes:check\npython_path: [../tools]\n"
    (rules / "triage.yaml").write_text(config)
    kb = load_knowledge_base([rules], cwd=tmp_path, env=env)
    assert not kb.problems and kb.get("team.flash-attn-fp32").probes == ["flash_attn_dtypes"]
    assert "team_probes_dtypes" not in sys.modules  # registering imports nothing

    from triage.probes import known_probes, load_probe, probe_target

    assert "flash_attn_dtypes" in known_probes()
    assert probe_target("flash_attn_dtypes") == "team_probes_dtypes:check"
    from triage.kb.trust import trust
    from triage.probes import ProbeLoadError

    with pytest.raises(ProbeLoadError, match="not trusted"):  # until the user trusts the triage.yaml
        load_probe("flash_attn_dtypes")
    assert "team_probes_dtypes" not in sys.modules
    trust(rules / "triage.yaml")
    assert load_probe("flash_attn_dtypes")(None) == "ran"


def test_probe_config_mistakes_are_reported(tmp_path, env):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "triage.yaml").write_text(textwrap.dedent("""\
        disabel: [shape.broadcast]
        disable: [shape.broadcats]
        probes:
          Bad-Name: a:b
          ok_name: not a target
        python_path: [missing]
        """))
    kb = load_knowledge_base([rules], cwd=tmp_path, env=env)
    found = sorted((p.line, p.col, p.message, p.hint) for p in kb.problems)
    assert [(line, col) for line, col, _m, _h in found] == [(1, 1), (2, 11), (4, 3), (5, 12), (6, 15)]
    assert found[0][3] == "did you mean 'disable'?"
    assert "disables 'shape.broadcats'" in found[1][2] and found[1][3] == "did you mean 'shape.broadcast'?"
    assert kb.get("shape.broadcast") is not None


def test_an_installed_entry_point_probe_validates(tmp_path, env):
    site = tmp_path / "site"
    dist = site / "teamprobes-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: teamprobes\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[triage.probes]\nflash_attn_dtypes = teamprobes.checks:dtypes\n")
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "team.yaml").write_text(PROBE_RULE)
    assert triage("rules", "lint", str(rules), cwd=tmp_path, env=env).returncode == 1
    env = {**env, "PYTHONPATH": f"{site}{os.pathsep}{env['PYTHONPATH']}"}
    done = triage("rules", "lint", str(rules), cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout


def test_code_named_in_a_rule_yaml_is_never_imported(tmp_path, env):
    rules = tmp_path / "rules"
    rules.mkdir()
    marker = tmp_path / "imported"
    (tmp_path / "evil_probe.py").write_text(f"open({str(marker)!r}, 'w').close()\ndef run(context): pass\n")
    rule = FLASH_ATTN_RULE.replace("  examples:", "  probes: ['evil_probe:run']\n  examples:")
    (rules / "team.yaml").write_text(rule)
    env = {**env, "PYTHONPATH": f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"}
    done = triage("rules", "lint", str(rules), cwd=tmp_path, env=env)
    assert done.returncode == 1 and "unknown probe 'evil_probe:run'" in done.stdout
    (tmp_path / "flash.log").write_text(FLASH_ATTN_LOG)
    triage("explain", "flash.log", "--rules", str(rules), cwd=tmp_path, env=env)
    assert not marker.exists()


# --- explain and rules never import torch ----------------------------------------------------------

NO_TORCH = """\
import sys
from triage.cli import main
codes = [main(argv) for argv in {commands!r}]
print("codes", codes)
print("torch imported:", sorted(name for name in sys.modules if name == "torch" or name.startswith("torch.")))
"""


def test_explain_and_rules_never_import_torch(project, env):
    commands = [
        ["explain", "flash.log", "--format", "json"],
        ["explain", "view.log"],
        ["rules", "list"],
        ["rules", "show", "shape.view-invalid"],
        ["rules", "test"],
        ["rules", "lint"],
        ["rules", "new", "team.other-thing", "--dir", str(project / "scratch")],
    ]
    done = subprocess.run([sys.executable, "-c", NO_TORCH.format(commands=commands)], cwd=project, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "codes [0, 0, 0, 0, 0, 0, 0]" in done.stdout
    assert "torch imported: []" in done.stdout


def test_the_guide_s_example_rule_lints_clean_and_renders_its_verify(tmp_path):
    guide = (REPO / "docs" / "team-rules.md").read_text()
    example = guide[guide.index("# .triage/rules/team.yaml") :]
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "team.yaml").write_text(example[: example.index("```")])
    kb = load_knowledge_base([rules])
    assert not kb.problems, kb.problems
    lead = diagnose(parse_text(FLASH_ATTN_LOG), kb, [])[0]
    assert lead.rule == "team.flash-attn-fp32"
    assert lead.verify.startswith("Re-run the eval: the forward pass gets past forward,")
