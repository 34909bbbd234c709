"""`%load_ext triage`: each IPython/Jupyter cell that fails with a PyTorch error is diagnosed with its live
state; `%triage` reprints the report (and diagnoses the last failing cell on demand when its error was plain
Python, which prints only its traceback: a NameError needs no report).

The extension is IPython's custom exception handler, as `triage.install()` is in a notebook: the traceback
prints as before, then the diagnosis, while the cell's frames (its model, tensors and batch) are still alive.
While it is loaded it owns the capture of uncaught exceptions (`tracking.capture_owner == "ipython"`), so
`triage.watch()` does not install a second handler, and a Lightning or Hugging Face callback leaves the
report to it (or hands over the report it made itself).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from .. import tracking
from . import reporting

FORMATS = ("text", "markdown", "json")


class TriageExtension:
    """The state of `%load_ext triage` in one shell: the handler it replaced and the last report."""

    def __init__(self, shell: Any) -> None:
        self.replaced = (shell.custom_exceptions, shell.CustomTB)
        self.last_report: Any = None
        # The last failing cell's exception, kept as IPython keeps it (sys.last_value) until the next failure,
        # so that %triage can still diagnose it with its frames alive.
        self.last_error: BaseException | None = None
        self.owns_capture = False

    def handle_exception(self, shell: Any, etype: type, value: BaseException, tb: Any,
                         tb_offset: int | None = None) -> None:
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        self.last_error, self.last_report = value, reporting.report_for(value)
        if self.last_report is None and _is_pytorch_error(value):
            self.last_report = reporting.diagnose_exception(value)

    def triage_magic(self, line: str) -> None:
        """%triage [text|markdown|json]: print the report of the last failing cell again."""
        from .. import render

        form = line.strip() or "text"
        if form not in FORMATS:
            print(f"triage: unknown format {form!r}; use %triage [{'|'.join(FORMATS)}]", file=sys.stderr)
            return
        if self.last_error is None:
            print("triage: no cell has failed since %load_ext triage", file=sys.stderr)
            return
        if self.last_report is None:
            self.last_report = reporting.diagnose_exception(self.last_error, quiet=True)
            if self.last_report is None:
                return  # triage itself failed, and said so in one line
        if form == "json":
            sys.stdout.write(render.to_json(self.last_report))
        elif form == "markdown":
            sys.stdout.write(render.to_markdown(self.last_report))
        else:
            from ..pipeline import print_summary

            folder = self.last_report.artifacts.get("report_md")
            print_summary(self.last_report, sys.stdout, folder=Path(folder).parent if folder else None)


def _is_pytorch_error(exc: BaseException) -> bool:
    """Whether triage has something to say (torch is loaded and a PyTorch rule matches); one line if it fails."""
    if "torch" not in sys.modules:
        return False
    try:
        return reporting.is_pytorch_error(exc)
    except Exception as failure:
        if os.environ.get("TRIAGE_DEBUG"):
            raise
        print(f"triage: could not read this failure: {type(failure).__name__}: {failure}", file=sys.stderr)
        return False


_loaded: TriageExtension | None = None


def load_ipython_extension(shell: Any) -> None:
    """Diagnose every cell that raises, and register the %triage magic."""
    global _loaded
    if _loaded is not None:
        return
    extension = TriageExtension(shell)
    shell.set_custom_exc((Exception,), extension.handle_exception)
    shell.register_magic_function(extension.triage_magic, "line", "triage")
    if tracking.capture_owner is None:
        tracking.capture_owner = "ipython"
        extension.owns_capture = True
    _loaded = extension


def unload_ipython_extension(shell: Any) -> None:
    """Put back the exception handler the extension replaced, and remove %triage."""
    global _loaded
    extension = _loaded
    if extension is None:
        return
    shell.custom_exceptions, shell.CustomTB = extension.replaced
    shell.magics_manager.magics["line"].pop("triage", None)
    if extension.owns_capture and tracking.capture_owner == "ipython":
        tracking.capture_owner = None
    _loaded = None
