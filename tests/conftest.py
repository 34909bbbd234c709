import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="session")
def _private_xdg(tmp_path_factory):
    """A cache and a config folder of the test session's own: not the user's rules, nor their ~/.cache."""
    root = tmp_path_factory.mktemp("xdg")
    (root / "cache").mkdir()
    (root / "config").mkdir()
    return root


@pytest.fixture(autouse=True)
def _plain_environment(monkeypatch, _private_xdg):
    """Fixed-width, colourless output, private XDG folders, and triage's internal errors raised rather than swallowed."""
    for name in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "TRIAGE_RULES", "TRIAGE_REPORT_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(_private_xdg / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(_private_xdg / "config"))
    monkeypatch.setenv("TRIAGE_DEBUG", "1")


def triage_env(**extra):
    """Environment for a `python -m triage` subprocess that imports this checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env["TRIAGE_DEBUG"] = "1"
    env.update(extra)
    return env


def run_triage(*args, input=None, cwd=None, **env):
    import subprocess

    return subprocess.run(
        [sys.executable, "-m", "triage", *map(str, args)],
        input=input, capture_output=True, cwd=cwd or ROOT, env=triage_env(**env), timeout=120,
    )


@pytest.fixture(autouse=True)
def _default_signal_handlers():
    """A test that leaves Ctrl-C ignored (Lightning ignores SIGINT while it shuts down) would pass SIG_IGN on to
    every process a later test starts, and a forwarded SIGINT would then do nothing: restore the handlers."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # left ignored before this test (at an import, say)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    saved = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    yield
    for number, handler in saved.items():
        if signal.getsignal(number) is not handler and handler is not None:
            signal.signal(number, handler)
