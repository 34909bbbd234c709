"""Code runs only with consent: rules are text, a project's Python probe runs only once its triage.yaml is trusted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from triage.kb import load_knowledge_base
from triage.kb import trust as trust_store
from triage.kb.searchpath import find_project_rules

REPO = Path(__file__).resolve().parent.parent

# A catch-all rule naming a probe that a triage.yaml registers; the probe's module leaves a marker when imported.
CATCH_ALL = textwrap.dedent("""\
    - id: team.any-runtime-error
      category: python
      title: any RuntimeError
      confidence: 0.99
      match:
        exception: RuntimeError
      hypothesis: anything
      fix: nothing
      probes: [team_check]
      examples:
        match: ['RuntimeError: x']
        no_match: ['ValueError: x']
    """)
SCRIPT = "raise RuntimeError('boom')\n"
VIEW_OVERRIDE = textwrap.dedent("""\
    - id: shape.view-invalid
      category: shape
      title: our packed batch of {{ numel }} elements
      confidence: 0.95
      match:
        exception: RuntimeError
        message: "is invalid for input of size (?P<numel>\\\\d+)"
      hypothesis: packed_collate dropped the padding.
      fix: Pass pad_to_multiple=8.
      examples:
        match: ["RuntimeError: shape '[3, -1]' is invalid for input of size 40"]
        no_match: ["RuntimeError: view size is not compatible with input tensor's size and stride"]
    """)


def _plant(folder: Path, marker: Path) -> Path:
    """A rules folder whose triage.yaml registers `team_check`, implemented by a module that marks its import."""
    rules = folder / ".triage" / "rules"
    tools = folder / "tools"
    rules.mkdir(parents=True)
    tools.mkdir(parents=True, exist_ok=True)
    (tools / "team_check_probe.py").write_text(
        f"open({str(marker)!r}, 'a').close()\n"
        "from triage.diagnosis import ProbeResult\n"
        "def run(context):\n    return ProbeResult('team_check', 'confirmed', 'the team probe ran')\n"
    )
    (rules / "team.yaml").write_text(CATCH_ALL)
    config = rules / "triage.yaml"
    config.write_text("probes:\n  team_check: team_check_probe:run\npython_path: [../../tools]\n")
    return config


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("TRIAGE_RULES", "TRIAGE_DEBUG", "NO_COLOR", "FORCE_COLOR")}
    clean.update(HOME=str(tmp_path / "home"), XDG_CONFIG_HOME=str(tmp_path / "xdg"),
                 PYTHONPATH=str(REPO) + os.pathsep + clean.get("PYTHONPATH", ""))  # fmt: skip
    return clean


def triage(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "triage", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=180)  # fmt: skip


def _run(script: Path, cwd: Path, env: dict[str, str], report: Path) -> dict:
    done = triage("--report-dir", str(report), str(script), cwd=cwd, env=env)
    assert done.returncode == 1, done.stderr
    return json.loads((report / "report.json").read_text())


def test_a_config_in_a_folder_above_the_repository_is_never_read(tmp_path, env):
    marker = tmp_path / "imported"
    _plant(tmp_path, marker)  # /tmp/.triage/rules on a shared machine
    repo = tmp_path / "work" / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "train.py").write_text(SCRIPT)
    report = _run(repo / "train.py", repo, env, tmp_path / "r1")
    assert not marker.exists()
    assert "team.any-runtime-error" not in [d["rule"] for d in report["diagnoses"]]
    assert find_project_rules(repo) is None
    assert find_project_rules(tmp_path / "work") is None  # outside a repository only the folder itself counts


def test_an_untrusted_project_probe_is_never_imported_until_trusted(tmp_path, env):
    marker = tmp_path / "imported"
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    config = _plant(repo, marker)
    (repo / "src").mkdir()
    (repo / "src" / "train.py").write_text(SCRIPT)

    report = _run(repo / "src" / "train.py", tmp_path, env, tmp_path / "r1")
    assert not marker.exists()
    [leading] = [d for d in report["diagnoses"] if d["rule"] == "team.any-runtime-error"]
    assert leading["origin"] == "project"  # the rule is text: it matches and renders
    [probe] = leading["probes"]
    assert probe["status"] == "error" and "not trusted to run Python" in probe["detail"]
    assert f"triage trust {os.path.realpath(config)}" in probe["detail"]

    done = triage("trust", cwd=repo / "src", env=env)  # default: this repository's .triage/rules/triage.yaml
    assert done.returncode == 0 and os.path.realpath(config) in done.stdout, done.stderr
    stored = json.loads((tmp_path / "xdg" / "triage" / "trusted.json").read_text())
    assert stored["trusted"][0]["path"] == os.path.realpath(config) and len(stored["trusted"][0]["sha256"]) == 64
    report = _run(repo / "src" / "train.py", tmp_path, env, tmp_path / "r2")
    assert marker.exists()
    [leading] = [d for d in report["diagnoses"] if d["rule"] == "team.any-runtime-error"]
    assert leading["probes"][0]["status"] == "confirmed"

    # A changed file is untrusted again, as with direnv's allow.
    marker.unlink()
    config.write_text(config.read_text() + "# one more line\n")
    listed = triage("trust", "--list", cwd=tmp_path, env=env)
    assert "changed since trusted" in listed.stdout
    _run(repo / "src" / "train.py", tmp_path, env, tmp_path / "r3")
    assert not marker.exists()

    assert triage("trust", str(repo), cwd=tmp_path, env=env).returncode == 0
    assert triage("untrust", str(config.parent), cwd=tmp_path, env=env).returncode == 0
    assert "no trusted configs" in triage("trust", "--list", cwd=tmp_path, env=env).stdout
    _run(repo / "src" / "train.py", tmp_path, env, tmp_path / "r4")
    assert not marker.exists()


def test_the_project_is_the_scripts_repository_not_the_working_directory(tmp_path, env):
    marker = tmp_path / "imported"
    elsewhere = tmp_path / "cloned"
    (elsewhere / ".git").mkdir(parents=True)
    config = _plant(elsewhere, marker)
    assert trust_store.trust(config, env) == Path(os.path.realpath(config))  # even trusted, it is not this script's
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "train.py").write_text(SCRIPT)
    report = _run(repo / "train.py", elsewhere, env, tmp_path / "r1")
    assert "team.any-runtime-error" not in [d["rule"] for d in report["diagnoses"]]
    assert not marker.exists()


def test_trust_commands_refuse_what_they_cannot_use(tmp_path, env):
    done = triage("trust", cwd=tmp_path, env=env)
    assert done.returncode == 2 and "no .triage/rules/triage.yaml" in done.stderr
    done = triage("trust", str(tmp_path / "nope"), cwd=tmp_path, env=env)
    assert done.returncode == 2 and "no such file" in done.stderr
    config = tmp_path / "triage.yaml"
    config.write_text("disable: []\n")
    assert triage("untrust", str(config), cwd=tmp_path, env=env).returncode == 1
    assert triage("trust", "--list", str(config), cwd=tmp_path, env=env).returncode == 2


def test_a_malformed_trust_record_trusts_nothing(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path)}
    config = tmp_path / "triage.yaml"
    config.write_text("probes: {}\n")
    store = trust_store.store_path(env)
    store.parent.mkdir(parents=True)
    store.write_text("{not json")
    assert not trust_store.is_trusted(config, env)
    store.write_text(json.dumps({"trusted": [{"path": os.path.realpath(config), "sha256": "0" * 64}]}))
    assert not trust_store.is_trusted(config, env)  # recorded, but with another digest
    trust_store.trust(config, env)
    assert trust_store.is_trusted(config, env)
    assert oct(store.stat().st_mode & 0o777) == "0o600"


def test_a_report_says_where_each_rule_came_from_and_what_it_overrides(tmp_path, env):
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / ".triage" / "rules").mkdir(parents=True)
    (repo / ".triage" / "rules" / "overrides.yaml").write_text(VIEW_OVERRIDE)
    (repo / "view.log").write_text("RuntimeError: shape '[3, -1]' is invalid for input of size 40\n")
    done = triage("explain", "view.log", "--format", "json", cwd=repo, env=env)
    leading = json.loads(done.stdout)["diagnoses"][0]
    assert leading["rule"] == "shape.view-invalid" and leading["origin"] == "project"
    assert leading["overrides"].startswith("built-in ") and leading["overrides"].endswith(".yaml:" + leading["overrides"].rsplit(":", 1)[1])
    text = triage("explain", "view.log", cwd=repo, env=env).stdout
    assert "from a project rule, overrides built-in" in text
    markdown = triage("explain", "view.log", "--format", "markdown", cwd=repo, env=env).stdout
    assert "· project rule, overrides built-in" in markdown
    kb = load_knowledge_base(cwd=tmp_path, env=env)  # outside the repository: built-in only
    assert kb.get("shape.view-invalid").origin == "built-in"
