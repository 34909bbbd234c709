"""`pytest --triage`: a test that fails with a PyTorch error gets a "triage" section in its failure report.

pytest imports this module in every run of every user who has triage installed (the pytest11 entry point),
so at import it loads nothing but pytest and the standard library; torch is never imported by the plugin,
and the knowledge base loads only when a test fails with --triage on. Plain assertion failures, and errors
no PyTorch rule recognises, are left as pytest shows them.
"""

from __future__ import annotations

import dataclasses
import io
import os
import sys

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("triage", "torch-triage")
    group.addoption("--triage", action="store_true", default=False,
                    help="attach a triage diagnosis to each test that fails with a PyTorch error")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """While a test runs, the plugin owns the capture of its failure: callbacks hand their reports to it."""
    if not item.config.getoption("triage"):
        yield
        return
    from .. import tracking

    owner = tracking.capture_owner
    if owner is None:
        tracking.capture_owner = "pytest"
    try:
        yield
    finally:
        if owner is None and tracking.capture_owner == "pytest":
            tracking.capture_owner = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if not report.failed or call.excinfo is None or not item.config.getoption("triage"):
        return
    text = diagnosis_text(call.excinfo.value)
    if text:
        report.sections.append(("triage", text))


def diagnosis_text(exc: BaseException) -> str | None:
    """The terminal report for a PyTorch error (live state: the test's frames are still alive), else None."""
    if not isinstance(exc, Exception) or isinstance(exc, AssertionError) or "torch" not in sys.modules:
        return None  # pytest.fail/skip, assert statements, torch.testing.assert_close; no torch, no torch error
    from . import reporting
    from .. import render

    report = reporting.report_for(exc)  # a Lightning callback may have diagnosed it inside the test
    if report is None:
        try:
            if not reporting.is_pytorch_error(exc):
                return None
        except Exception as failure:
            if os.environ.get("TRIAGE_DEBUG"):
                raise
            return f"triage: could not read this failure: {type(failure).__name__}: {failure}\n"
        report = reporting.diagnose_exception(exc, quiet=True)
    if report is None:
        return None
    out = io.StringIO()
    # Its commands to re-run "the script" would re-run pytest itself, where the runner sees no uncaught exception.
    render.to_terminal(dataclasses.replace(report, rerun=None), out, color=False)
    return out.getvalue()
