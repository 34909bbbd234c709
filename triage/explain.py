"""`triage explain`: a pasted log, read and parsed into an Incident, through the one pipeline. Never imports torch."""

from __future__ import annotations

from .diagnosis import Report
from .kb.loader import KnowledgeBase
from .logparse import parse_log
from .logread import read_log
from .pipeline import triage_incident


def explain_log(path: str | None, kb: KnowledgeBase) -> Report:
    """Diagnose the log at `path` (standard input for None or '-'); raises LogReadError if unreadable."""
    return triage_incident(parse_log(read_log(path)), kb, source="log")
