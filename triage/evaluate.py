"""`triage eval [DIR]`: score triage against a corpus of logs and scripts with expected diagnoses.

Layout (ours under corpus/, a team's own the same): `logs/<category>/*.log` and
`scripts/<category>/*.py`, each folder with an `expected.yaml` mapping a file name to
`{category, rule, facts, exit_code, args}`. Logs go through explain in-process;
scripts run under the runner in a subprocess, as a user would run them.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from .cli_common import EXIT_FAILED, EXIT_OK, Parser, UsageError, add_version

SCRIPT_TIMEOUT_S = 180
PYTHON_CATEGORY = "python"
_KIND_TOTALS = {"log": "logs", "fresh": "fresh logs", "script": "scripts"}


@dataclass
class CaseResult:
    """One corpus case: what was expected, what triage said, and how long it took."""

    path: str
    kind: str  # "log" or "script"
    expected_category: str | None
    expected_rule: str | None
    categories: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    missing_facts: list[str] = field(default_factory=list)
    # The experiments the leading diagnosis named, as (probe, status, detail, seconds): a live run's only.
    probes: list[tuple[str, str, str, float]] = field(default_factory=list)
    # The labelled specific cause and fix (`cause_id`, `fix_id`), and what the leading diagnosis named.
    expected_cause: str | None = None
    expected_fix: str | None = None
    cause: str | None = None
    cause_basis: str = ""  # "evidence", or "base_rate" where nothing decided and the commonest cause was named
    fix_id: str | None = None
    verified_fixes: list[str] = field(default_factory=list)  # fix ids a trial verified on the leading diagnosis
    trial_applies: bool = False  # the leading diagnosis's cause has a fix a trial can test
    expected_exit: int | None = None
    exit_code: int | None = None
    seconds: float = 0.0
    error: str = ""

    @property
    def top1(self) -> bool:
        leading = self.categories[0] if self.categories else None
        return leading == self.expected_category and not self.error

    @property
    def top3(self) -> bool:
        if self.expected_category is None:
            return not self.categories and not self.error
        return self.expected_category in self.categories[:3] and not self.error

    @property
    def rule_ok(self) -> bool:
        return not self.expected_rule or (bool(self.rules) and self.rules[0] == self.expected_rule)

    @property
    def cause_ok(self) -> bool | None:
        """Whether the leading diagnosis names the labelled cause (None: no cause labelled)."""
        return None if not self.expected_cause else self.cause == self.expected_cause and not self.error

    @property
    def fix_ok(self) -> bool | None:
        """Whether the labelled fix leads, or a trial verified it (None: no fix labelled)."""
        if not self.expected_fix:
            return None
        return (self.fix_id == self.expected_fix or self.expected_fix in self.verified_fixes) and not self.error

    @property
    def experiment(self) -> str | None:
        """The experiments' verdict on the leading diagnosis: confirmed, refuted, or None (none decided)."""
        statuses = {status for name, status, *_ in self.probes if name != "save_batch"}
        for verdict, other in (("confirmed", "refuted"), ("refuted", "confirmed")):
            if verdict in statuses and other not in statuses:
                return verdict
        return None

    @property
    def exit_ok(self) -> bool:
        return self.expected_exit is None or self.exit_code == self.expected_exit

    @property
    def python_negative_misread(self) -> bool:
        """A plain Python failure given a PyTorch diagnosis."""
        return self.expected_category == PYTHON_CATEGORY and bool(self.categories) and self.categories[0] != PYTHON_CATEGORY

    @property
    def ok(self) -> bool:
        return (self.top1 and self.rule_ok and not self.missing_facts and self.exit_ok
                and self.cause_ok is not False and self.fix_ok is not False)


def default_corpus() -> Path:
    return Path(__file__).resolve().parent.parent / "corpus"


def load_cases(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every (file, expectation) under `root` from its folders' expected.yaml files."""
    cases = []
    for expected_file in sorted(root.rglob("expected.yaml")):
        try:
            entries = yaml.safe_load(expected_file.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"{expected_file}: cannot read expectations ({exc})") from None
        if not isinstance(entries, dict):
            raise UsageError(f"{expected_file}: expected a mapping of file name to expectation")
        for name, expectation in entries.items():
            cases.append((expected_file.parent / name, expectation or {}))
    return cases


def evaluate_logs(root: Path, kb, kind: str = "log", on_case: Callable[[CaseResult], None] | None = None) -> list[CaseResult]:
    """Each log through explain. `kind` names the corpus in the table: "log" for ours, "fresh" for logs gathered
    after the rules were written; `on_case` hears of each result as it is scored (a progress bar)."""
    from .explain import explain_log
    from .logread import LogReadError

    results = []
    for path, expectation in load_cases(root):
        result = _new_result(path, kind, expectation)
        started = time.perf_counter()
        try:
            report = explain_log(str(path), kb)
            _fill(result, [d.to_dict() for d in report.diagnoses], expectation)
        except LogReadError as exc:
            result.error = str(exc)
        result.seconds = time.perf_counter() - started
        results.append(result)
        if on_case is not None:
            on_case(result)
    return results


def evaluate_scripts(
    root: Path, jobs: int = 2, on_case: Callable[[CaseResult], None] | None = None
) -> list[CaseResult]:
    """Each script labelled for this machine under the runner, `jobs` at once; `on_case` hears of each result (from
    a worker thread)."""
    cases = script_cases(root)
    # One card for all: a GPU script run beside another (an OOM one filling the card) fails for the wrong reason.
    one_gpu_script_at_a_time = threading.Lock()

    def run(case: tuple[Path, dict[str, Any]]) -> CaseResult:
        with one_gpu_script_at_a_time if uses_gpu(case[1]) else contextlib.nullcontext():
            result = _run_script(*case)
        if on_case is not None:
            on_case(result)
        return result

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(run, cases))


def script_cases(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The scripts under `root` with their expectation on this machine, less those labelled for no machine like it."""
    cases = [(path, expectation_here(expectation)) for path, expectation in load_cases(root)]
    return [(path, expectation) for path, expectation in cases if expectation is not None]


_TORCH_HERE_CODE = "import torch; print(torch.backends.cuda.is_built(), torch.cuda.is_available())"


@functools.cache
def torch_here() -> dict[str, bool]:
    """What the scripts' torch offers on this machine: {"cuda-build": ..., "cuda": ...}, asked once of a child
    python (the evaluating process does not import torch; a script picks "cuda" by `torch.cuda.is_available()`)."""
    try:
        done = subprocess.run([sys.executable, "-c", _TORCH_HERE_CODE], capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
        built, available = done.stdout.split()[-2:] if done.returncode == 0 else ("False", "False")
    except (OSError, subprocess.TimeoutExpired, ValueError):
        built, available = "False", "False"
    return {"cuda-build": built == "True", "cuda": available == "True"}


REQUIREMENTS = ("cuda", "cpu-build")


def uses_gpu(expectation: dict[str, Any]) -> bool:
    """Whether a script labelled for this machine runs on its GPU (a `requires: cuda` script where CUDA works)."""
    return expectation.get("requires") == "cuda" and torch_here()["cuda"]


def expectation_here(expectation: dict[str, Any]) -> dict[str, Any] | None:
    """A script's expectation on this machine. `requires: cuda` scripts fail as labelled only where CUDA works,
    `requires: cpu-build` ones only where torch has no CUDA; elsewhere such a script must run to completion with
    triage adding nothing, unless its `otherwise:` block says how the same bug fails there. None: a `cpu-build`
    script where torch is built with CUDA but sees no GPU, which fails a third way, labelled nowhere."""
    needs = expectation.get("requires")
    if needs is None:
        return expectation
    here = torch_here()
    met = here["cuda"] if needs == "cuda" else not here["cuda-build"]
    if met:
        return expectation
    if needs == "cpu-build" and not here["cuda"]:
        return None
    succeeds = {"category": None, "rule": None, "facts": [], "exit_code": 0, "cause_id": None, "fix_id": None}
    return {**expectation, **succeeds, **expectation.get("otherwise", {})}


def _run_script(path: Path, expectation: dict[str, Any]) -> CaseResult:
    result = _new_result(path, "script", expectation)
    result.expected_exit = expectation.get("exit_code", 1)
    with tempfile.TemporaryDirectory(prefix="triage-eval-") as tmp:
        report_json = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "triage", "--report-dir", str(Path(tmp) / "report"), "--json", str(report_json)]
        command += [*expectation.get("options", []), str(path.name), *map(str, expectation.get("args", []))]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")]))}
        started = time.perf_counter()
        try:
            done = subprocess.run(command, cwd=path.parent, env=env, capture_output=True, text=True,
                                  timeout=expectation.get("timeout", SCRIPT_TIMEOUT_S), stdin=subprocess.DEVNULL)
            result.exit_code = done.returncode
        except subprocess.TimeoutExpired:
            result.error = "timed out"
        result.seconds = time.perf_counter() - started
        if report_json.exists():
            diagnoses = json.loads(report_json.read_text()).get("diagnoses", [])
            _fill(result, diagnoses, expectation)
        elif result.expected_category is not None and not result.error:
            result.error = "no report written"
            _fill(result, [], expectation)
    return result


def _new_result(path: Path, kind: str, expectation: dict[str, Any]) -> CaseResult:
    return CaseResult(
        path=str(path), kind=kind,
        expected_category=expectation.get("category"), expected_rule=expectation.get("rule"),
        expected_cause=expectation.get("cause_id"), expected_fix=expectation.get("fix_id"),
    )  # fmt: skip


def _fill(result: CaseResult, diagnoses: list[dict[str, Any]], expectation: dict[str, Any]) -> None:
    result.categories = [d["category"] for d in diagnoses]
    result.rules = [d["rule"] for d in diagnoses]
    if diagnoses:
        lead = diagnoses[0]
        text = " ".join([lead["title"], lead["hypothesis"], lead["fix"], lead.get("confirm", ""), *lead.get("evidence", [])])
        text += " " + " ".join(p.get("detail", "") for p in lead.get("probes", []))
        result.probes = [(p["name"], p["status"], p.get("detail", ""), float(p.get("seconds") or 0.0))
                         for p in lead.get("probes", [])]
        result.missing_facts = [str(fact) for fact in expectation.get("facts", []) if str(fact) not in text]
        result.cause = lead.get("cause") or lead["rule"]
        result.cause_basis = lead.get("cause_basis") or ""
        result.fix_id = lead.get("fix_id") or lead["rule"]
        fixes = lead.get("fixes") or []
        result.verified_fixes = [f["id"] for f in fixes if f.get("verdict") == "verified"]
        result.trial_applies = any(f.get("trial") for f in fixes)
    else:
        result.missing_facts = [str(fact) for fact in expectation.get("facts", [])]


@dataclass
class Score:
    """Corpus-wide figures, the ones the test suite holds the line on."""

    cases: int
    top1: float
    top3: float
    rule_top1: float
    facts: float
    exit_parity: float
    python_negatives_misread: int
    seconds_per_case: float
    # Over the cases labelled with a cause (a fix): the leading diagnosis names it (leads with it, or verified it).
    cause: float | None = None
    fix: float | None = None
    cause_cases: int = 0
    fix_cases: int = 0


def _share(flags: list[bool | None]) -> tuple[float | None, int]:
    labelled = [flag for flag in flags if flag is not None]
    return (sum(labelled) / len(labelled) if labelled else None), len(labelled)


def score(results: list[CaseResult]) -> Score:
    n = len(results) or 1
    cause, cause_cases = _share([r.cause_ok for r in results])
    fix, fix_cases = _share([r.fix_ok for r in results])
    return Score(
        cases=len(results),
        top1=sum(r.top1 for r in results) / n,
        top3=sum(r.top3 for r in results) / n,
        rule_top1=sum(r.rule_ok for r in results) / n,
        facts=sum(not r.missing_facts for r in results) / n,
        exit_parity=sum(r.exit_ok for r in results) / n,
        python_negatives_misread=sum(r.python_negative_misread for r in results),
        seconds_per_case=sum(r.seconds for r in results) / n,
        cause=cause, fix=fix, cause_cases=cause_cases, fix_cases=fix_cases,
    )


def format_table(results: list[CaseResult]) -> str:
    by_category: dict[str, list[CaseResult]] = {}
    for result in results:
        by_category.setdefault(f"{result.kind}:{result.expected_category or '(passes)'}", []).append(result)
    lines = [f"{'corpus / category':<24} {'cases':>5} {'top-1':>6} {'top-3':>6} {'rule':>6} {'facts':>6} "
             f"{'cause':>6} {'fix':>6} {'ms/case':>8}"]
    for name in sorted(by_category):
        s = score(by_category[name])
        lines.append(f"{name:<24} {s.cases:>5} {s.top1:>6.0%} {s.top3:>6.0%} {s.rule_top1:>6.0%} {s.facts:>6.0%} "
                     f"{_percent(s.cause, 0):>6} {_percent(s.fix, 0):>6} {s.seconds_per_case * 1000:>8.0f}")
    for kind in ("log", "fresh", "script"):
        group = [r for r in results if r.kind == kind]
        if group:
            s = score(group)
            lines.append(f"{'ALL ' + _KIND_TOTALS[kind]:<24} {s.cases:>5} {s.top1:>6.1%} {s.top3:>6.1%} "
                         f"{s.rule_top1:>6.1%} {s.facts:>6.1%} {_percent(s.cause, 1):>6} {_percent(s.fix, 1):>6} "
                         f"{s.seconds_per_case * 1000:>8.0f}")
    labelled = [r for r in results if r.cause_ok is not None or r.fix_ok is not None]
    if labelled:
        s = score(labelled)
        lines.append(f"cause named: {s.cause_cases and round(s.cause * s.cause_cases)} of {s.cause_cases} labelled; "
                     f"labelled fix leading or verified: {s.fix_cases and round(s.fix * s.fix_cases)} of {s.fix_cases}")
        by_rate = [r for r in labelled if r.cause_ok is not None and r.cause_basis == "base_rate"]
        if by_rate:
            lines.append(f"causes the evidence left undecided, named by base rate: {len(by_rate)}, "
                         f"{sum(bool(r.cause_ok) for r in by_rate)} of them the labelled one")
    total = score(results)
    lines.append(f"python negatives given a PyTorch diagnosis: {total.python_negatives_misread}")
    if any(r.kind == "script" for r in results):
        scripts = score([r for r in results if r.kind == "script"])
        lines.append(f"script exit-status parity: {scripts.exit_parity:.1%}")
        lines += _experiment_lines([r for r in results if r.kind == "script"])
        lines += _probe_lines([r for r in results if r.kind == "script"])
    misses = [r for r in results if not r.ok]
    if misses:
        lines.append("")
        lines.append("misses:")
        for r in misses:
            got = f"{r.categories[0]}/{r.rules[0]}" if r.rules else "no diagnosis"
            reasons = []
            if not r.top1 or not r.rule_ok:
                reasons.append(f"expected {r.expected_category}/{r.expected_rule or '-'}, got {got}")
            if r.missing_facts:
                reasons.append(f"missing facts {r.missing_facts}")
            if r.cause_ok is False:
                reasons.append(f"cause {r.cause}, labelled {r.expected_cause}")
            if r.fix_ok is False:
                reasons.append(f"fix {r.fix_id}, labelled {r.expected_fix}")
            if not r.exit_ok:
                reasons.append(f"exit {r.exit_code}, expected {r.expected_exit}")
            if r.error:
                reasons.append(r.error)
            lines.append(f"  {r.path}: {'; '.join(reasons)}")
    return "\n".join(lines)


def _percent(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}%}"


def _experiment_lines(scripts: list[CaseResult]) -> list[str]:
    """Issue 13's figures: a confirming experiment on the leading diagnosis of each non-Python failure, and a fix
    verified by a trial wherever the leading cause has a fix a trial can test."""
    failing = [r for r in scripts if r.expected_category not in (None, PYTHON_CATEGORY)]
    lines = []
    if failing:
        confirmed = sum(r.experiment == "confirmed" for r in failing)
        lines.append(f"experiment confirming the leading diagnosis: {confirmed} of {len(failing)} non-Python failures "
                     f"({confirmed / len(failing):.1%})")
    applies = [r for r in scripts if r.trial_applies]
    if applies:
        verified = sum(bool(r.verified_fixes) for r in applies)
        lines.append(f"fix verified by a trial: {verified} of {len(applies)} where a trial applies "
                     f"({verified / len(applies):.1%})")
    return lines


def _probe_lines(results: list[CaseResult]) -> list[str]:
    """How many of the experiments the leading diagnoses named confirmed their cause, and why the others did not."""
    runs = [(r, name, status, detail) for r in results for name, status, detail, _seconds in r.probes]
    if not runs:
        return []
    confirmed = sum(status == "confirmed" for _r, _name, status, _detail in runs)
    lines = [f"experiments named by the leading diagnosis: {confirmed} of {len(runs)} confirmed "
             f"({confirmed / len(runs):.1%}), in {len({r.path for r, *_ in runs})} scripts"]
    lines += [f"  {Path(r.path).name}: {name} {status}: {detail[:120]}"
              for r, name, status, detail in runs if status != "confirmed"]
    seconds: dict[str, list[float]] = {}
    for r in results:
        for name, _status, _detail, took in r.probes:
            seconds.setdefault(name, []).append(took)
    lines.append("probe time, median / max seconds (runs): " + ", ".join(
        f"{name} {statistics.median(times):.2f} / {max(times):.2f} ({len(times)})"
        for name, times in sorted(seconds.items())))
    return lines


def main(argv: list[str]) -> int:
    description = ("Score triage against a corpus of failing logs and scripts, each with its expected diagnosis. "
                   "Exit status 1 when a case misses. A progress bar shows on a terminal.")
    parser = Parser(prog="triage eval", description=description)
    add_version(parser)
    parser.add_argument("dir", nargs="?", type=Path, metavar="DIR",
                        help="corpus folder with logs/ and/or scripts/ (default: ours)")
    parser.add_argument("--logs-only", action="store_true", help="skip running scripts")
    parser.add_argument("--format", choices=("text", "json"), default="text", metavar="text|json",
                        help="the score table (default) or every case as JSON")
    parser.add_argument("--rules", action="append", default=[], metavar="PATH",
                        help="extra rule file or folder (repeatable)")
    parser.add_argument("--jobs", type=_jobs, default=2, metavar="N", help="scripts run at once (default 2)")
    args = parser.parse_args(argv)
    root = args.dir or default_corpus()
    if not root.is_dir():
        raise UsageError(f"{root}: not a corpus folder")
    logs = root / "logs" if (root / "logs").is_dir() else None
    scripts = root / "scripts" if (root / "scripts").is_dir() else None
    # Logs gathered after the rules were written: scored on their own line, never part of the pass/fail.
    fresh = root / "logs-fresh" if (root / "logs-fresh").is_dir() else None
    if logs is None and scripts is None and fresh is None:
        # A bare folder: corpus/logs-fresh itself (its own line); of scripts when its expectations name .py files
        # (one category, e.g. scripts/learning); else of logs.
        if root.resolve().name == "logs-fresh":
            fresh = root
        elif any(path.suffix == ".py" for path, _ in load_cases(root)):
            scripts = root
        else:
            logs = root

    from .kb import load_knowledge_base

    from .progress import ProgressBar

    kb = load_knowledge_base([Path(p) for p in args.rules])
    run_scripts = scripts is not None and not args.logs_only
    total = sum(len(load_cases(folder)) for folder in (logs, fresh) if folder) + (len(script_cases(scripts)) if run_scripts else 0)
    with ProgressBar(total, "triage eval") as bar:
        on_case = lambda result: bar.advance(Path(result.path).name)  # noqa: E731
        results = evaluate_logs(logs, kb, on_case=on_case) if logs else []
        if fresh:
            results += evaluate_logs(fresh, kb, kind="fresh", on_case=on_case)
        if run_scripts:
            results += evaluate_scripts(scripts, jobs=args.jobs, on_case=on_case)
    from .job_eval import evaluate_job_logs, evaluate_job_runs, format_jobs, load_labels

    # torchrun jobs (logs/distributed-jobs/labels.yaml): the root rank and error, from the log and live.
    jobs = evaluate_job_logs(root, kb) if load_labels(root) else []
    if jobs and run_scripts:
        jobs += evaluate_job_runs(root)
    if not results and not jobs:
        raise UsageError(f"{root}: no cases (no expected.yaml under logs/ or scripts/)")
    if args.format == "json":
        cases = [asdict(r) | {"ok": r.ok, "cause_ok": r.cause_ok, "fix_ok": r.fix_ok, "experiment": r.experiment}
                 for r in results]
        print(json.dumps({"score": asdict(score(results)), "cases": cases,
                          "jobs": [asdict(j) | {"ok": j.ok} for j in jobs]}, indent=2))
    else:
        print(format_table(results) + ("\n\n" + format_jobs(jobs) if jobs else ""))
    return EXIT_OK if all(r.ok for r in results if r.kind != "fresh") and all(j.ok for j in jobs) else EXIT_FAILED


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("takes 1 or more")
    return value
