import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


_ISOLATED_HOMES: str | None = None


def pytest_configure(config):
    """The suite's rule cache and config live in a temp folder, never in the user's ~/.cache or ~/.config."""
    global _ISOLATED_HOMES
    _ISOLATED_HOMES = tempfile.mkdtemp(prefix="triage-tests-")
    for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
        os.environ[name] = os.path.join(_ISOLATED_HOMES, name.lower())


def pytest_unconfigure(config):
    if _ISOLATED_HOMES:
        shutil.rmtree(_ISOLATED_HOMES, ignore_errors=True)


@pytest.fixture(autouse=True)
def _plain_environment(monkeypatch):
    """Fixed-width, colourless output, and triage's internal errors raised rather than swallowed."""
    for name in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "TRIAGE_RULES"):
        monkeypatch.delenv(name, raising=False)
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
