"""One report for a multi-rank job: the root rank's incident, diagnosed alone, with every rank's outcome beside it.

Live records and pasted logs both become RankOutcomes; `ranks.choose_root`
picks the root, and only the root rank's failure goes to the knowledge base, so
a secondary rank's "connection closed by peer" cannot outrank the cause. The
report's `ranks` list holds every rank (DESIGN.md, contract — multi-rank jobs).
Standard library only (explain uses it).
"""

from __future__ import annotations

from .incident import ExceptionInfo, Incident
from .ranks import ROOT, RankOutcome, choose_root

MAX_RANK_NOTES = 16
MAX_NOTE_CHARS = 160


def root_incident(root: RankOutcome, outcomes: list[RankOutcome], *, base: Incident | None = None,
                  chain: list[ExceptionInfo] | None = None, log_lines: list[str] | None = None,
                  source: str = "log") -> Incident:
    """The incident to diagnose: the root rank's own (`base`, from a live record) or one built from its outcome."""
    incident = base if base is not None else Incident(source=source)
    if base is None:
        incident.exception = root.error
        incident.exceptions = list(chain or ([root.error] if root.error is not None else []))
        incident.log_lines = list(log_lines or [])
        incident.exit_code, incident.signal = root.exit_code, root.signal
        incident.kind = _kind(root)
    if root.native_abort and root.native_abort not in incident.log_lines:
        incident.log_lines.append(root.native_abort)
    if root.why:
        incident.log_lines.append(f"triage: {root.why}")  # the root's evidence, for rules about stuck or early ranks
    incident.rank = root.rank
    incident.facts["ranks"] = [outcome.to_dict() for outcome in outcomes]
    incident.notes += rank_notes(outcomes)
    return incident


def _kind(root: RankOutcome) -> str:
    if root.error is not None and root.error.type and root.error.frames:
        return "exception"
    if root.signal and root.signal != "SIGTERM":
        return "hard-crash"
    if root.error is None and root.exit_code != 0:
        return "hang"  # stopped while the others waited for it
    return "exception"


def rank_notes(outcomes: list[RankOutcome]) -> list[str]:
    """One line per rank, root first: what it died of and why it is (not) the root."""
    ordered = sorted(outcomes, key=lambda o: (o.role != ROOT, o.rank))[:MAX_RANK_NOTES]
    notes = []
    for outcome in ordered:
        said = outcome.first_error_text() or ("exited normally" if outcome.exit_code == 0 else "no error shown")
        said = said if len(said) <= MAX_NOTE_CHARS else said[: MAX_NOTE_CHARS - 1] + "…"
        end = f"exit {outcome.exit_code}" if outcome.exit_code is not None else "exit unknown"
        if outcome.role == ROOT:
            notes.append(f"rank {outcome.rank} is the root cause ({end}): {said}. {outcome.why}".rstrip())
        else:
            because = f" [{outcome.consequence}]" if outcome.consequence else ""
            notes.append(f"rank {outcome.rank} ({end}): {said}{because}")
    return notes


def job_incident(text: str, incident: Incident) -> Incident | None:
    """The root rank's incident of a pasted multi-rank log, every rank in its facts; None when the log is not a job."""
    from .torchrun_log import read_job

    job = read_job(text, incident)
    if job is None:
        return None
    root = choose_root(job.outcomes)
    if root is None:
        return None
    if root.signal == "SIGKILL" and not root.oom:
        root.oom = "a log cannot show whether the kernel's OOM killer sent it: `dmesg -T | grep -i killed` on its node can"
    chain = [e for e in incident.exceptions if e.rank == root.rank and not e.wrapper] if root.error is not None else []
    if root.error is not None and root.error not in chain:
        chain = [root.error]
    lines = job.lines_by_rank.get(root.rank, [])[-200:]
    found = root_incident(root, job.outcomes, chain=chain, log_lines=lines)
    found.environment = incident.environment
    found.notes[:0] = incident.notes
    if job.torchrun_verdict is not None:
        found.facts["torchrun_verdict"] = job.torchrun_verdict
    return found
