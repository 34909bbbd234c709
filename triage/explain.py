"""The explain pipeline for pasted logs: read -> parse -> the one pipeline -> Report. Never imports torch."""

from __future__ import annotations

from collections.abc import Callable

from .diagnosis import Report
from .kb.loader import KnowledgeBase
from .kb.matcher import diagnose
from .kb.safe_regex import PatternTimeout
from .logparse import adopt_known_message, parse_log
from .logread import read_log
from .pipeline import triage_incident

PYTHON_CATEGORY = "python"


def explain_log(path: str | None, kb: KnowledgeBase) -> Report:
    """Diagnose the log at `path` (standard input for None or '-'); raises LogReadError if unreadable."""
    log = read_log(path)
    incident = parse_log(log)
    from .job_report import job_incident

    job = job_incident("\n".join(log.segments), incident)  # a multi-rank job: one verdict, from its root rank
    if job is not None:
        return triage_incident(job, kb, source="log")
    typed = incident.exception is not None and incident.exception.type and incident.exception.message
    # A pattern that times out here is disabled for the run: its warning must still reach the report.
    warnings: list[str] = []
    leading = diagnose(incident, kb, warnings)
    if not typed and not leading:
        # No exception line and no log-line rule: a known message pasted without its type still names the failure.
        adopt_known_message(incident, _known_message_finder(kb))
    elif not typed and all(diagnosis.exception_index is None for diagnosis in leading):
        # Only log-line rules matched (a start-up warning, a logger's line). A known message pasted without its type
        # on another line is still the failure to explain; lines those rules read (each rank's copy too) are not.
        read = {line.strip() for diagnosis in leading for line in diagnosis.values.get("log_match", "").split("\n")}
        patterns = [pattern for rule in kb.rules if rule.id in {d.rule for d in leading} for pattern in rule.logs]
        adopt_known_message(incident, _skipping_lines(_known_message_finder(kb), read - {""}, patterns))
    elif typed and (not leading or leading[0].category == PYTHON_CATEGORY):
        # A Python error (or none a rule knows) leads, but a PyTorch message sits on another line: a wrapper's
        # error, an echo, or prose around the paste. The PyTorch message is the failure to explain.
        adopt_known_message(incident, _known_message_finder(kb, pytorch_only=True), beside=True)
    report = triage_incident(incident, kb, source="log", warnings=warnings)
    report.warnings = list(dict.fromkeys(report.warnings))  # matched twice: a rule's warning is still one line
    return report


def _known_message_finder(kb: KnowledgeBase, pytorch_only: bool = False):
    """Where the earliest message a rule knows starts in a text, and the exception type it is raised as.

    Only exact PyTorch wordings count: keyword patterns, catch-alls (a backend's `[^\\n]+`) and `*.generic`
    rules would read any line that mentions a worker or a device as an error. With `pytorch_only`, the
    messages of Python rules (`No such file or directory`) do not count either.

    Where two rules read a message from the same place, one that needs no frame gives the type: the message was
    pasted without its traceback, and a rule's first exception type need not be the one that pattern is raised
    as (checkpoint.pickled-class-missing reads `No module named` only in torch.load's frames, and lists
    AttributeError first, for `Can't get attribute`).
    """
    known = [(pattern, rule.exception_types[0].rsplit(".", 1)[-1] if rule.exception_types else "",
              bool(rule.frame) and not rule.frame.get("or_no_traceback"))
             for rule in kb.rules if not rule.id.endswith(".generic")
             and not (pytorch_only and rule.category == PYTHON_CATEGORY)
             for pattern in rule.messages if not _matches_ordinary_lines(pattern)]

    def find(text: str) -> tuple[str, int] | None:
        earliest: tuple[int, bool, str] | None = None
        for pattern, exc_type, needs_frame in known:
            try:
                found = pattern.search(text)
            except PatternTimeout:
                continue
            # An empty match is no message (`\A\Z`, an exception printed without one, matches any empty text).
            if found is not None and found.end() > found.start() and (
                    earliest is None or (found.start(), needs_frame) < earliest[:2]):
                earliest = (found.start(), needs_frame, exc_type)
        return None if earliest is None else (earliest[2], earliest[0])

    return find


def _skipping_lines(find, lines: set[str], patterns: list) -> Callable[[str], tuple[str, int] | None]:
    """`find`, blind to the lines in `lines` and to lines one of `patterns` matches (blanked to the same length, so
    every offset stays true)."""

    def read(line: str) -> bool:
        try:
            return line.strip() in lines or any(pattern.search(line) for pattern in patterns)
        except PatternTimeout:
            return True

    def recognise(text: str) -> tuple[str, int] | None:
        return find("\n".join(" " * len(line) if read(line) else line for line in text.split("\n")))

    return recognise


_ORDINARY_LINES = "x\nepoch 3 step 100 loss 0.512 lr 0.001\nTraceback (most recent call last):\n  File \"train.py\", line 9, in <module>"


def _matches_ordinary_lines(pattern) -> bool:
    try:
        return pattern.source.startswith("(?i)") or pattern.search(_ORDINARY_LINES) is not None
    except PatternTimeout:
        return True
