"""The one pipeline: report.json before and between experiments, one writer for runner and wrapper, the root choice."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, triage_env
from triage import wrapper
from triage.diagnosis import Diagnosis, ProbeResult
from triage.incident import ExceptionInfo, Incident
from triage.kb.loader import load_paths
from triage.logparse import parse_text
from triage.pipeline import LiveContext, choose_root_exception, print_summary, triage_incident
from triage.probe_registry import PROBES
from triage.report_dir import ReportWriter
from triage.runner.pipeline import Reporter
from triage.runner.postmortem import descendants
from triage.tracking import Tracker

RULE = """\
- id: test.order-of-writes
  category: python
  title: Division by zero in the script
  confidence: 0.9
  match:
    exception: ZeroDivisionError
  hypothesis: The script divides by zero.
  fix: Do not.
  probes: [peek_report, peek_report_again]
  examples:
    match: ['ZeroDivisionError: division by zero']
    no_match: ['KeyError: 1']
"""

TRACEBACK = """\
Traceback (most recent call last):
  File "/home/ana/train.py", line 3, in <module>
    1 / 0
ZeroDivisionError: division by zero
"""


def _peek(ctx) -> ProbeResult:
    """What report.json says while this probe runs."""
    data = json.loads((ctx.report_dir / "report.json").read_text(encoding="utf-8"))
    seen = [p["name"] for d in data["diagnoses"] for p in d["probes"]]
    return ProbeResult("peek", "inconclusive", "read the report", facts={"complete": data["complete"], "probes": seen})


@pytest.fixture
def order_rules(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIAGE_NO_CACHE", "1")
    monkeypatch.setitem(PROBES, "peek_report", f"{__name__}:_peek")
    monkeypatch.setitem(PROBES, "peek_report_again", f"{__name__}:_peek")
    path = tmp_path / "rules.yaml"
    path.write_text(RULE, encoding="utf-8")
    kb = load_paths([path], origin="--rules")
    assert not kb.problems, kb.problems
    return kb


def _division_error() -> ZeroDivisionError:
    try:
        1 / 0
    except ZeroDivisionError as exc:
        return exc
    raise AssertionError("unreachable")


def test_report_json_is_written_before_the_first_experiment_and_after_each_result(tmp_path, order_rules):
    folder = tmp_path / "report"
    folder.mkdir()
    incident = parse_text(TRACEBACK)
    report = triage_incident(incident, order_rules, live=LiveContext(exception=_division_error()),
                             writer=ReportWriter(folder))
    first, second = report.diagnoses[0].probes
    assert first.facts == {"complete": False, "probes": []}  # written before the first experiment started
    assert second.facts == {"complete": False, "probes": ["peek"]}  # and again once the first result was in
    final = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    assert final["complete"] is True and len(final["diagnoses"][0]["probes"]) == 2
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]  # each write replaced its file whole


def test_without_a_live_context_there_is_one_complete_write_and_no_experiment(tmp_path, order_rules):
    report = triage_incident(parse_text(TRACEBACK), order_rules, source="log")
    assert report.source == "log" and report.diagnoses[0].rule == "test.order-of-writes"
    assert report.diagnoses[0].probes == [] and report.artifacts == {}


def test_a_folder_that_cannot_be_written_costs_the_files_not_the_diagnosis(tmp_path, order_rules):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    stream = io.StringIO()
    report = triage_incident(parse_text(TRACEBACK), order_rules, writer=ReportWriter(blocked))
    print_summary(report, stream, folder=blocked)
    assert report.diagnoses[0].rule == "test.order-of-writes"
    assert [w for w in report.warnings if w.startswith(f"could not write the report folder {blocked}: ")]
    assert "Division by zero in the script" in stream.getvalue() and "report written to" not in stream.getvalue()


def test_the_runner_and_the_wrapper_write_the_same_report_with_one_writer(tmp_path, order_rules, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exc = _division_error()
    rules = str(tmp_path / "rules.yaml")
    runner_folder = Reporter({"report_dir": str(tmp_path / "runner"), "rules": [rules], "probes": False,
                              "cwd": str(tmp_path)}).handle(parse_text(TRACEBACK), exception=exc, tracker=Tracker(),
                                                            stream=io.StringIO())
    stream = io.StringIO()
    wrapper.install(report_dir=tmp_path / "wrapper", probes=False, rules=[rules], stream=stream)
    try:
        wrapper.diagnose_live(parse_text(TRACEBACK), exc, Tracker())
    finally:
        wrapper.uninstall()
    runner = json.loads((runner_folder / "report.json").read_text(encoding="utf-8"))
    ours = json.loads((tmp_path / "wrapper" / "report.json").read_text(encoding="utf-8"))
    assert runner["diagnoses"] == ours["diagnoses"] and runner["diagnoses"][0]["rule"] == "test.order-of-writes"
    assert set(runner) - {"run", "timings"} == set(ours) - {"timings"}
    assert set(runner["artifacts"]) == set(ours["artifacts"]) == {"report_md", "report_json", "report_html"}
    for folder in (runner_folder, tmp_path / "wrapper"):
        assert "## Live state" in (folder / "report.md").read_text(encoding="utf-8")
    assert stream.getvalue().rstrip().endswith(f"triage: report written to {Path('wrapper') / 'report.md'}")


def test_a_second_incident_of_an_installed_process_gets_its_own_folder(tmp_path, order_rules, monkeypatch):
    monkeypatch.chdir(tmp_path)
    wrapper.install(report_dir=tmp_path / "r", probes=False, rules=[str(tmp_path / "rules.yaml")], stream=io.StringIO())
    try:
        for _ in range(2):
            wrapper.diagnose_live(parse_text(TRACEBACK), _division_error(), Tracker())
    finally:
        wrapper.uninstall()
    assert (tmp_path / "r" / "report.json").is_file() and (tmp_path / "r-2" / "report.json").is_file()


def _diagnosis_of(index: int) -> Diagnosis:
    return Diagnosis(rule="t.t", category="dataloader", confidence=0.9, title="t", hypothesis="h", fix="f",
                     exception_index=index)


def test_the_root_exception_is_the_one_the_leading_diagnosis_explains():
    caught = ExceptionInfo(type="RuntimeError", message="Caught KeyError in DataLoader worker process 1.", wrapper=True)
    inner = ExceptionInfo(type="KeyError", message="'label'", worker=1)
    main = ExceptionInfo(type="ValueError", message="bad", rank=3)
    incident = Incident(source="log", exception=inner, exceptions=[caught, inner, main], worker=1, rank=0)
    choose_root_exception(incident, [_diagnosis_of(0)])
    assert (incident.exception, incident.worker, incident.rank) == (caught, 1, 0)  # the wrapper stands for worker 1
    choose_root_exception(incident, [_diagnosis_of(2)])
    assert (incident.exception, incident.worker, incident.rank) == (main, None, 3)  # not in a worker, on rank 3


SLOW_REPLAY = """\
import time

import torch
from torch import nn


class Head(nn.Linear):
    calls = 0

    def forward(self, x):
        Head.calls += 1
        if Head.calls > 1:  # a probe replaying this layer: stay inside the experiment
            time.sleep(120)
        return super().forward(x)


model = nn.Sequential(nn.ReLU(), Head(8, 2))
model(torch.randn(4, 16))
"""


def test_a_triage_killed_during_an_experiment_leaves_its_report(tmp_path):
    script = tmp_path / "slow_replay.py"
    script.write_text(SLOW_REPLAY, encoding="utf-8")
    folder = tmp_path / "report"
    run = subprocess.Popen([sys.executable, "-m", "triage", "--hang-timeout", "0", "--report-dir", str(folder),
                            str(script)], cwd=tmp_path, env=triage_env(TRIAGE_DEBUG=""),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not (folder / "report.json").is_file() and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.1)
        time.sleep(1.0)  # well inside the replay's sleep
        written = json.loads((folder / "report.json").read_text(encoding="utf-8"))
        assert run.poll() is None and written["complete"] is False
        child = written["run"]["pid"]  # the process that runs the script and its probes
        for pid in [child, *descendants(child)]:  # an experiment may run in a process of its own
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, stderr = run.communicate(timeout=60)
    finally:
        try:
            os.killpg(run.pid, signal.SIGKILL)  # whatever is left of the run's process group
        except ProcessLookupError:
            pass
        if run.returncode is None:
            run.communicate()
    assert run.returncode == 1, stderr  # python's status for the script's exception, whatever killed triage
    report = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    assert report["complete"] is False and report["diagnoses"][0]["rule"] == "shape.linear-in-features"
    assert "shape_trace" not in [p["name"] for p in report["diagnoses"][0]["probes"]]  # killed in that experiment
    assert "mat1 and mat2 shapes cannot be multiplied (4x16 and 8x2)" in report["incident"]["exception"]["message"]
    assert (folder / "report.md").is_file() and "Experiments were still running" in (folder / "report.md").read_text()
    assert "while triage examined the failure" in stderr
