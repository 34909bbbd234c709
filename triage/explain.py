"""The explain pipeline for pasted logs: read -> parse -> match -> Report. Never imports torch."""

from __future__ import annotations

from .diagnosis import Report
from .kb.loader import KnowledgeBase
from .kb.matcher import diagnose
from .logparse import parse_log
from .logread import read_log


def explain_log(path: str | None, kb: KnowledgeBase) -> Report:
    """Diagnose the log at `path` (standard input for None or '-'); raises LogReadError if unreadable."""
    log = read_log(path)
    incident = parse_log(log)
    from .job_report import explain_job

    job = explain_job("\n".join(log.segments), incident, kb)  # a multi-rank job: one verdict, from its root rank
    if job is not None:
        return job
    warnings: list[str] = []
    diagnoses = diagnose(incident, kb, warnings)
    if diagnoses and diagnoses[0].exception_index is not None:
        # The exception the leading diagnosis explains is the root cause the report shows.
        incident.exception = incident.exceptions[diagnoses[0].exception_index]
        incident.rank = incident.exception.rank if incident.exception.rank is not None else incident.rank
        incident.worker = incident.exception.worker
    return Report(source="log", incident=incident, diagnoses=diagnoses, warnings=warnings)
