"""The integrations' one way into the pipeline: diagnose a caught exception with its live state, and remember
the report, so that a callback's diagnosis is shown (or attached) once by whatever catches the exception next."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from typing import Any

# The latest diagnosed exception, as (id, type, message, report). An id alone could be reused by a later
# exception once this one is freed; holding the exception itself would keep its frames (and tensors) alive.
_latest: tuple[int, type, str, Any] | None = None


def diagnose_exception(exc: BaseException, tracker: Any = None, *, quiet: bool = False) -> Any:
    """Match, probe and report `exc` through triage's live pipeline; returns the Report, or None if triage failed.

    The summary goes to stderr unless `quiet` (the caller shows the report its own way). A failure of triage
    itself is one line on stderr, never an exception, except under TRIAGE_DEBUG.
    """
    global _latest
    from ..tracking import TRACKER
    from ..wrapper import diagnose_live, incident_from_exception

    try:
        with contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():
            report = diagnose_live(incident_from_exception(exc), exc, TRACKER if tracker is None else tracker)
    except Exception as failure:
        if os.environ.get("TRIAGE_DEBUG"):
            raise
        print(f"triage: could not diagnose this failure: {type(failure).__name__}: {failure} "
              "(set TRIAGE_DEBUG=1 for details)", file=sys.stderr)
        return None
    _latest = (id(exc), type(exc), _message(exc), report)
    return report


def report_for(exc: BaseException) -> Any:
    """The Report already made for this very exception (by a callback, before it propagated), else None."""
    if _latest is None:
        return None
    ident, kind, message, report = _latest
    return report if ident == id(exc) and kind is type(exc) and message == _message(exc) else None


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # a hostile __str__ must not turn a report into a new failure
        return f"<{type(exc).__name__}: str() failed>"


def is_pytorch_error(exc: BaseException) -> bool:
    """True when the knowledge base's leading diagnosis of `exc` is a PyTorch failure (any category but python)."""
    from ..kb import diagnose, load_knowledge_base
    from ..wrapper import incident_from_exception

    diagnoses = diagnose(incident_from_exception(exc), load_knowledge_base())
    return bool(diagnoses) and diagnoses[0].category != "python"
