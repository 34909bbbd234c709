import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


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
