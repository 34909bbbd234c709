"""Which frames are the runner's own (triage and runpy), hidden from tracebacks, stack dumps and Incidents.

Under plain `python script.py` none of these frames exist; showing them would
only make the user's traceback longer and point at the wrong code.
"""

from __future__ import annotations

import os
import sys
import types

_TRIAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_RUNPY_FILES = {"<frozen runpy>", os.path.abspath(getattr(sys.modules.get("runpy"), "__file__", "") or "runpy.py")}


def is_hidden_file(filename: str) -> bool:
    """Frames of the runner and of runpy, which a plain `python script.py` would not show."""
    return filename in _RUNPY_FILES or filename.startswith(_TRIAGE_DIR)


def user_traceback(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback with triage and runpy frames removed (a new chain; the original is untouched)."""
    kept = []
    while tb is not None:
        if not is_hidden_file(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    trimmed = None
    for entry in reversed(kept):
        trimmed = types.TracebackType(trimmed, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return trimmed
