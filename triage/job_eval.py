"""Score triage's multi-rank verdict on the torchrun jobs of the corpus: root rank and root error, beside torchrun's own.

`corpus/logs/distributed-jobs/labels.yaml` names each job's log, script, rank
count, root rank and a pattern for its root error. From the log, `explain`
must name them; live, `python -m triage torchrun ...` must, with the
launcher's exit status, no empty report folder and no process left behind.
torchrun's "Root Cause (first observed failure)" is scored the same way.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

LABELS = Path("logs") / "distributed-jobs" / "labels.yaml"
SCRIPTS = Path("scripts") / "distributed"
JOB_TIMEOUT_S = 120


@dataclass
class JobResult:
    """One job: what was expected, what triage and torchrun said."""

    name: str
    mode: str  # "log" or "live"
    expected_rank: int | None  # None: any rank
    expected_error: str
    rank: int | None = None
    error: str = ""
    torchrun_rank: int | None = None
    torchrun_error: str = ""
    exit_code: int | None = None
    expected_exit: int | None = None
    problems: list[str] = field(default_factory=list)
    stderr_tail: str = ""  # a live job's last output, to see why a verdict was wrong

    @property
    def rank_ok(self) -> bool:
        return self.rank is not None and (self.expected_rank is None or self.rank == self.expected_rank)

    @property
    def error_ok(self) -> bool:
        return bool(re.search(self.expected_error, self.error))

    @property
    def torchrun_ok(self) -> tuple[bool, bool]:
        rank = self.torchrun_rank is not None and (self.expected_rank is None or self.torchrun_rank == self.expected_rank)
        return rank, bool(re.search(self.expected_error, self.torchrun_error))

    @property
    def ok(self) -> bool:
        return self.rank_ok and self.error_ok and not self.problems


def load_labels(corpus: Path) -> dict[str, dict[str, Any]]:
    path = corpus / LABELS
    if not path.is_file():
        return {}
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def _said(report: dict[str, Any]) -> tuple[int | None, str]:
    """The root rank triage named, and the text that names its error (first error, exception, leading diagnosis)."""
    incident = report.get("incident") or {}
    root = next((r for r in report.get("ranks") or [] if r.get("role") == "root"), {})
    exception = incident.get("exception") or {}
    lead = (report.get("diagnoses") or [{}])[0]
    parts = [root.get("first_error") or "", f"{exception.get('type', '')}: {exception.get('message', '')}",
             lead.get("title", ""), root.get("why", "")]  # fmt: skip
    return incident.get("rank"), " | ".join(parts)


def _torchrun_said(text: str) -> tuple[int | None, str]:
    from .logparse import parse_text
    from .torchrun_log import read_job

    job = read_job(text, parse_text(text))
    verdict = job.torchrun_verdict if job is not None else None
    return (verdict["rank"], verdict["error"]) if verdict else (None, "")


def evaluate_job_logs(corpus: Path, kb) -> list[JobResult]:
    from .explain import explain_log

    results = []
    for name, label in load_labels(corpus).items():
        result = _new(name, "log", label)
        path = corpus / LABELS.parent / name
        report = explain_log(str(path), kb).to_dict()
        result.rank, result.error = _said(report)
        result.torchrun_rank, result.torchrun_error = _torchrun_said(path.read_text(encoding="utf-8", errors="replace"))
        results.append(result)
    return results


def evaluate_job_runs(corpus: Path) -> list[JobResult]:
    """Each job live under `python -m triage torchrun`, one at a time (each starts several interpreters)."""
    return [_run_job(corpus, name, label) for name, label in load_labels(corpus).items()]


def _run_job(corpus: Path, name: str, label: dict[str, Any]) -> JobResult:
    result = _new(name, "live", label)
    result.expected_exit = label.get("exit_code", 1)
    script = corpus / SCRIPTS / label["script"]
    with tempfile.TemporaryDirectory(prefix="triage-job-eval-") as tmp:
        out = Path(tmp) / "report"
        command = [sys.executable, "-m", "triage", "--report-dir", str(out), "--json", str(Path(tmp) / "job.json"),
                   "torchrun", "--standalone", f"--nproc_per_node={label.get('nproc', 2)}", script.name]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent.parent),
                                                                          os.environ.get("PYTHONPATH")]))}  # fmt: skip
        try:
            done = subprocess.run(command, cwd=script.parent, env=env, capture_output=True, text=True,
                                  timeout=label.get("timeout", JOB_TIMEOUT_S), stdin=subprocess.DEVNULL)  # fmt: skip
            result.exit_code = done.returncode
            result.stderr_tail = done.stderr[-4000:]
            result.torchrun_rank, result.torchrun_error = _torchrun_said(done.stderr)
        except subprocess.TimeoutExpired:
            result.problems.append("timed out")
        time.sleep(0.5)
        strays = _processes_running(script.name)
        if strays:
            result.problems.append(f"{len(strays)} process(es) left running")
        if (Path(tmp) / "job.json").is_file():
            result.rank, result.error = _said(json.loads((Path(tmp) / "job.json").read_text()))
        else:
            result.problems.append("no job report")
        empty = [str(p) for p in [out, *out.rglob("*")] if p.is_dir() and not any(p.iterdir())] if out.exists() else []
        if empty:
            result.problems.append(f"empty report folder(s): {empty}")
    if result.expected_exit is not None and result.exit_code != result.expected_exit:
        result.problems.append(f"exit {result.exit_code}, torchrun's is {result.expected_exit}")
    return result


def _processes_running(script_name: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if script_name.encode() in handle.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _new(name: str, mode: str, label: dict[str, Any]) -> JobResult:
    rank = label.get("root_rank")
    return JobResult(name=name, mode=mode, expected_rank=rank if isinstance(rank, int) else None,
                     expected_error=str(label.get("error", "")))  # fmt: skip


def format_jobs(results: list[JobResult]) -> str:
    """Per job: triage's verdict and torchrun's, each as rank/error right or wrong; then the totals."""
    lines = [f"{'torchrun job':<36} {'mode':<5} {'want':>4} {'triage':>7} {'torchrun':>9}  problems"]
    for r in results:
        want = "any" if r.expected_rank is None else str(r.expected_rank)
        mine = f"{r.rank}{'✓' if r.rank_ok else '✗'}{'✓' if r.error_ok else '✗'}"
        tr_rank, tr_error = r.torchrun_ok
        theirs = f"{r.torchrun_rank}{'✓' if tr_rank else '✗'}{'✓' if tr_error else '✗'}"
        lines.append(f"{r.name.removesuffix('.log'):<36} {r.mode:<5} {want:>4} {mine:>7} {theirs:>9}  {'; '.join(r.problems)}")
    for mode in ("log", "live"):
        group = [r for r in results if r.mode == mode]
        if group:
            both = sum(r.rank_ok and r.error_ok for r in group)
            theirs = sum(all(r.torchrun_ok) for r in group)
            their_rank = sum(r.torchrun_ok[0] for r in group)
            lines.append(f"{mode}: triage names the root rank and error in {both}/{len(group)} jobs "
                         f"({both / len(group):.0%}); torchrun's Root Cause names the rank in {their_rank}/{len(group)}, "
                         f"rank and error in {theirs}/{len(group)}; jobs with problems: {sum(bool(r.problems) for r in group)}")
    lines.append("(rank✓error✓ per verdict)")
    return "\n".join(lines)
