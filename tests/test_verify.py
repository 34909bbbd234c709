"""The last step of the report: how to verify the fix, with the commands that re-run the failure."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from triage import render
from triage.diagnosis import Report
from triage.kb import diagnose, load_knowledge_base
from triage.logparse import parse_text
from triage.replay import rerun_commands

REPO = Path(__file__).resolve().parent.parent

# torch 2.13 (CPU): torch.zeros(40).view(3, -1)
VIEW_LOG = """\
Traceback (most recent call last):
  File "/home/ana/train.py", line 9, in <module>
    x = x.view(3, -1)
RuntimeError: shape '[3, -1]' is invalid for input of size 40
"""

TEAM_RULES = """\
- id: team.view-with-verify
  category: shape
  title: view to {{ shape }} fails
  confidence: 0.99
  match:
    exception: RuntimeError
    message: "shape '\\\\[(?P<shape>[^\\\\]]+)\\\\]' is invalid for input of size (?P<size>\\\\d+)"
  hypothesis: The tensor has {{ size }} elements.
  fix: Reshape to a shape whose product is {{ size }}.
  verify: Re-run; x.view({{ shape }}) should no longer see {{ size }} elements.
  examples:
    match: ["RuntimeError: shape '[3, -1]' is invalid for input of size 40"]
    no_match: ["RuntimeError: shape mismatch"]
- id: team.view-without-verify
  category: shape
  title: view fails
  confidence: 0.98
  match:
    exception: RuntimeError
    message: "is invalid for input of size"
  hypothesis: A view to a shape that does not fit.
  fix: Reshape to a shape that fits.
  examples:
    match: ["RuntimeError: shape '[3, -1]' is invalid for input of size 40"]
    no_match: ["RuntimeError: shape mismatch"]
"""


def _diagnoses(tmp_path: Path) -> list:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "team.yaml").write_text(TEAM_RULES)
    kb = load_knowledge_base([rules])
    assert not kb.problems, kb.problems
    return diagnose(parse_text(VIEW_LOG), kb, [])


def test_a_rule_s_verify_is_rendered_with_its_values_and_a_rule_without_one_gets_the_failure_it_must_end(tmp_path):
    by_rule = {d.rule: d for d in _diagnoses(tmp_path)}
    assert by_rule["team.view-with-verify"].verify == "Re-run; x.view(3, -1) should no longer see 40 elements."
    assert by_rule["team.view-without-verify"].verify == (
        "Re-run after the fix: the run should get past the step that failed at /home/ana/train.py:9 in <module> "
        "without RuntimeError."
    )


def test_every_built_in_rule_says_how_to_verify_its_fix():
    kb = load_knowledge_base([])
    missing = [rule.location for rule in kb.rules if rule.origin == "built-in" and not rule.verify.strip()]
    assert missing == []


def test_a_log_report_has_the_verify_step_and_no_command(tmp_path):
    report = Report(source="log", incident=parse_text(VIEW_LOG), diagnoses=_diagnoses(tmp_path))
    data = json.loads(render.to_json(report))
    assert data["rerun"] is None and data["diagnoses"][0]["verify"].startswith("Re-run; x.view(3, -1)")
    markdown = render.to_markdown(report)
    assert "**Verify the fix.** Re-run; x.view(3, -1) should no longer see 40 elements." in markdown
    assert "python -m triage" not in markdown


def test_commands_are_shown_once_under_the_leading_diagnosis(tmp_path):
    rerun = {"command": "python -m triage train.py", "replay": "python -m triage --replay out train.py"}
    report = Report(source="run", incident=parse_text(VIEW_LOG), diagnoses=_diagnoses(tmp_path), rerun=rerun)
    markdown = render.to_markdown(report)
    assert markdown.count("python -m triage --replay out train.py") == 1
    assert markdown.count("\npython -m triage train.py\n") == 1
    text = "".join("".join(piece for piece, _ in line) + "\n" for line in render.terminal_lines(report))
    assert "  Verify  Re-run; x.view(3, -1)" in text
    assert "    $ python -m triage --replay out train.py\n      feeds the failing batch first" in text
    assert "    $ python -m triage train.py\n      the whole run: checks a fix to the data" in text


def test_rerun_commands_name_the_script_from_where_the_run_started(tmp_path, monkeypatch):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("")
    folder = tmp_path / "triage-reports" / "run-1"
    folder.mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "src")  # the script changed directory; the commands are for the user's shell
    args = ["--lr", "0.1", "--api-key", "sk-secret", "name with space"]
    commands = rerun_commands("src/train.py", args, report_dir=folder, cwd=str(tmp_path))
    assert commands == {"command": "python -m triage src/train.py --lr 0.1 --api-key '[scrubbed]' 'name with space'",
                        "replay": None}  # fmt: skip
    (folder / "batch.pt").write_bytes(b"")
    commands = rerun_commands("src/train.py", [], report_dir=folder, cwd=str(tmp_path))
    assert commands["replay"] == "python -m triage --replay triage-reports/run-1 src/train.py"
    assert rerun_commands("pkg.train", ["-x"], module=True, cwd=str(tmp_path))["command"] == "python -m triage -m pkg.train -x"
    assert rerun_commands("gone.py", [], cwd=str(tmp_path)) is None
    assert rerun_commands("-c", [], cwd=str(tmp_path)) is None
    assert rerun_commands(None, [], cwd=str(tmp_path)) is None


# --- the loop a user goes through, for real ------------------------------------------------------

TRAIN = """\
import sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
features = torch.randn(40, 8)
labels = torch.arange(40) % 5
labels[29] = 5  # one label too many for 5 classes, in batch 7
loader = DataLoader(TensorDataset(features, labels), batch_size=4)
model = nn.Linear(8, 5)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (x, y) in enumerate(loader):
    print(f"step {step} labels {y.tolist()}", flush=True)
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
"""


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    argv = shlex.split(command)
    assert argv[0] == "python"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_printed_commands_reproduce_the_failure_and_check_each_kind_of_fix(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    failed = _run("python -m triage --report-dir first train.py", tmp_path)
    assert failed.returncode == 1, failed.stderr
    data = json.loads((tmp_path / "first" / "report.json").read_text())
    assert data["diagnoses"][0]["rule"] == "index.class-label-out-of-range"
    rerun = data["rerun"]
    assert rerun == {"command": "python -m triage train.py", "replay": "python -m triage --replay first train.py"}
    assert f"    $ {rerun['replay']}\n" in failed.stderr and f"    $ {rerun['command']}\n" in failed.stderr

    # The replay reproduces the failure at the first step: batch 7 comes first.
    replayed = _run(rerun["replay"], tmp_path)
    assert replayed.returncode == 1 and replayed.stdout == "step 0 labels [3, 5, 0, 1]\n"

    # A fix to the model passes the replay; a fix to the data does not (the saved batch predates it),
    # and the whole run checks it: each command checks what its note says.
    model_fixed = tmp_path / "model_fixed"
    data_fixed = tmp_path / "data_fixed"
    for folder, old, new in ((model_fixed, "nn.Linear(8, 5)", "nn.Linear(8, 6)"),
                             (data_fixed, "labels[29] = 5", "labels[29] = 4")):  # fmt: skip
        folder.mkdir()
        (folder / "train.py").write_text(TRAIN.replace(old, new))
        (folder / "first").symlink_to(tmp_path / "first")
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = [pool.submit(_run, command, folder) for command, folder in (
            (rerun["replay"], model_fixed), (rerun["replay"], data_fixed), (rerun["command"], data_fixed))]  # fmt: skip
        model_replay, data_replay, data_full = (run.result() for run in runs)
    assert model_replay.returncode == 0 and model_replay.stdout.endswith("done\n"), model_replay.stderr
    assert data_replay.returncode == 1 and data_replay.stdout == "step 0 labels [3, 5, 0, 1]\n"
    assert data_full.returncode == 0 and data_full.stdout.endswith("done\n"), data_full.stderr
