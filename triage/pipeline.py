"""The one path from an Incident to a Report: match -> root exception -> probes -> rank, written as it goes.

The runner (runner/pipeline.py), the wrapper (`install()`, `watch()`) and
`triage explain` all hand their Incident here, a live run with the live
context beside it. With a ReportWriter the report folder is written before
the first experiment starts and again after each probe result, so a triage
killed by one of its experiments still leaves report.json behind.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable

from .diagnosis import Diagnosis, Report
from .incident import Incident
from .kb.loader import KnowledgeBase
from .kb.matcher import diagnose

if TYPE_CHECKING:  # `triage explain` writes no folder and runs no probe: it need not import either module
    from .context import ProbeContext
    from .report_dir import ReportWriter

# What the capture found on the stack that the probes' own reading of the failure may lack: a failure
# before the first optimizer step (in the first backward, say) leaves the Tracker without a model.
CAPTURED_FOR_PROBES = ("model", "module", "optimizer", "loader", "loss_fn", "batch", "batch_index", "step")


@dataclass
class LiveContext:
    """What a live process adds to its Incident for the experiments; a pasted log has none.

    `captured` is what capture.live found on the stack (the failing module and its
    arguments, the model, the batch); `tracker` the wrapper's Tracker; `script` and
    `script_args` the command the probes may name.
    """

    exception: BaseException | None = None
    captured: ProbeContext | None = None
    tracker: Any = None
    script: str | None = None
    script_args: list[str] = field(default_factory=list)


def triage_incident(
    incident: Incident,
    kb: KnowledgeBase,
    *,
    source: str = "run",
    live: LiveContext | None = None,
    writer: ReportWriter | None = None,
    rerun: Callable[[], dict[str, str | None] | None] | None = None,
    warnings: list[str] | None = None,
    timings: dict[str, float] | None = None,
) -> Report:
    """Diagnose `incident`, run the experiments its diagnoses name (when `live`), rank, and write the report.

    `rerun` gives the commands that re-run the script (asked again after the
    probes, which may have saved a batch to replay); `timings` receives the
    seconds each stage took.
    """
    timings = {} if timings is None else timings
    started = time.monotonic()
    report = diagnose_incident(incident, kb, source=source, warnings=warnings)
    timings["diagnose_s"] = time.monotonic() - started
    if rerun is not None:
        report.rerun = rerun()
    if live is not None and report.diagnoses and any(d.probe_names or any(f.trial for f in d.fixes)
                                                     for d in report.diagnoses):
        _write(writer, report, timings, complete=False)  # before the first experiment
        started = time.monotonic()
        context = run_experiments(report, live, writer.folder if writer is not None else None,
                                  on_result=lambda: _write(writer, report, timings, complete=False))
        choose_causes_again(report, kb)
        if context is not None:
            try_leading_fixes(report, context)
        timings["probes_s"] = time.monotonic() - started
        if rerun is not None:
            report.rerun = rerun()
    started = time.monotonic()
    _write(writer, report, timings, complete=True)
    timings["report_s"] = time.monotonic() - started
    return report


def _write(writer: ReportWriter | None, report: Report, timings: dict[str, float], *, complete: bool) -> None:
    """A folder that cannot be written (a full disk, a read-only tree) costs the files, never the diagnosis."""
    if writer is None:
        return
    try:
        writer.write(report, timings=timings, complete=complete)
    except OSError as exc:
        warning = f"could not write the report folder {writer.folder}: {exc}"
        if warning not in report.warnings:
            report.warnings.append(warning)


def diagnose_incident(incident: Incident, kb: KnowledgeBase, *, source: str = "run",
                      warnings: list[str] | None = None) -> Report:
    """Match the incident against the rules; the exception the leading diagnosis explains becomes the root cause."""
    warnings = list(warnings or [])
    diagnoses = diagnose(incident, kb, warnings)
    choose_root_exception(incident, diagnoses)
    report = Report(source=source, incident=incident, diagnoses=diagnoses, environment=dict(incident.environment),
                    warnings=warnings)
    report.ranks = incident.facts.get("ranks")  # a multi-rank job's (job_report.root_incident), else None
    return report


def choose_root_exception(incident: Incident, diagnoses: list[Diagnosis]) -> None:
    """Show the exception the leading diagnosis explains, with its rank and DataLoader worker.

    A rank or worker the chosen exception does not name stays the incident's (the
    launcher's rank; the worker a wrapper's "Caught ... in DataLoader worker
    process N" stands for), except that an ordinary main-process exception has no worker.
    """
    if not diagnoses or diagnoses[0].exception_index is None or not incident.exceptions:
        return
    chosen = incident.exceptions[diagnoses[0].exception_index]
    incident.exception = chosen
    if chosen.rank is not None:
        incident.rank = chosen.rank
    if chosen.worker is not None or not chosen.wrapper:
        incident.worker = chosen.worker


def rule_warnings(kb: KnowledgeBase) -> list[str]:
    """The rules the knowledge base skipped, as report warnings."""
    return [f"rule skipped: {problem}" for problem in kb.problems]


def run_experiments(report: Report, live: LiveContext, folder: Path | None,
                    on_result: Callable[[], None] | None = None) -> ProbeContext | None:
    """The probes the diagnoses name, on the live objects; they re-rank `report.diagnoses` in place.
    Returns the context they ran in (for the fix trials), None when the probes failed."""
    from .probes import runner as probe_runner

    context = probe_runner.context_from_failure(
        report.incident, live.exception, folder, tracker=live.tracker, script=live.script,
        script_args=list(live.script_args),
    )  # fmt: skip
    for name in CAPTURED_FOR_PROBES:
        if getattr(context, name) is None and getattr(live.captured, name, None) is not None:
            setattr(context, name, getattr(live.captured, name))
    try:
        ranked = probe_runner.run_probes(report.diagnoses, context, on_result=on_result)
    except Exception as exc:
        if os.environ.get("TRIAGE_DEBUG"):
            raise
        report.warnings.append(f"probes failed: {type(exc).__name__}: {exc}")
        return None
    if isinstance(ranked, list):
        report.diagnoses = ranked
    return context


def choose_causes_again(report: Report, kb: KnowledgeBase) -> None:
    """With the experiments' facts known, each diagnosis chooses its cause again (and is re-ranked by it)."""
    from .kb.matcher import rechoose
    from .probes.runner import rerank

    rules = {rule.id: rule for rule in kb.rules}
    for diagnosis in report.diagnoses:
        if diagnosis.rule in rules and diagnosis.probes:
            rechoose(diagnosis, rules[diagnosis.rule], report.warnings)
    rerank(report.diagnoses)


def try_leading_fixes(report: Report, context: ProbeContext) -> None:
    """The leading diagnosis's fixes that have a trial, each applied to copies of the failing step in a forked child
    until one is verified (probes/fix_trials.py): the verdicts reorder its fixes (verified first, failed last) and
    join its experiments as `fix_trial`, which ranks it like any other."""
    from .probes.fix_trials import order_fixes, try_fixes
    from .probes.runner import rerank

    leading = report.diagnoses[0]
    try:
        result = try_fixes(leading, context)
    except Exception as exc:
        if os.environ.get("TRIAGE_DEBUG"):
            raise
        report.warnings.append(f"fix trials failed: {type(exc).__name__}: {exc}")
        return
    if result is None:
        return
    leading.probes.append(result)
    order_fixes(leading)
    rerank(report.diagnoses)


def print_summary(report: Report, stream: IO[str], *, folder: Path | None = None, lead_in: str | None = None,
                  color: str | None = None) -> None:
    """The terminal summary after the traceback: a blank line, `lead_in`, the report, and where the folder is."""
    from .render import to_terminal
    from .report_dir import shown_path

    try:
        stream.flush()
    except (OSError, ValueError):
        pass
    stream = _Scrubbing(stream)
    stream.write("\n")
    if lead_in:
        stream.write(lead_in.rstrip("\n") + "\n")
    to_terminal(report, stream, color=color)
    if folder is not None and (folder / "report.md").is_file():
        stream.write(f"triage: report written to {shown_path(folder / 'report.md')}\n")
    stream.flush()


class _Scrubbing:
    """A text stream that scrubs secrets from all it is given: the summary quotes source lines and probe
    details, read after the capture scrubbed its own data. Everything else (isatty, fileno) is the stream's."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        from .capture.secrets import scrub_text

        return self._stream.write(scrub_text(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
