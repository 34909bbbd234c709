"""What a run under triage is asked to do (parsed by runner.cli, read by the supervisor and the child)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

DEFAULT_HANG_TIMEOUT = 300.0
ON_HANG = ("report", "kill")
STDIN_SCRIPT = "-"  # as with `python -`: the script is read from standard input


@dataclass
class RunOptions:
    """What to run and how to report."""

    target: str
    module: bool = False
    args: list[str] = field(default_factory=list)
    report_dir: str | None = None
    json: str | None = None
    probes: bool = True
    hang_timeout: float = DEFAULT_HANG_TIMEOUT
    on_hang: str = "report"
    rules: list[str] = field(default_factory=list)
    replay: str | None = None
    color: str = "auto"

    @property
    def label(self) -> str:
        """A short name for report folders: the script's stem or the module's last part."""
        if self.module:
            return self.target.rsplit(".", 1)[-1]
        if self.target == STDIN_SCRIPT:
            return "stdin"
        name = os.path.basename(os.path.normpath(self.target))
        return name[:-3] if name.endswith(".py") else name


def interpreter_argv() -> list[str]:
    """The interpreter and its own options from the parent's command line (`python -X dev` of `python -X dev -m triage`)."""
    orig = list(getattr(sys, "orig_argv", []) or [sys.executable])
    index = 1
    while index < len(orig):
        arg = orig[index]
        if arg in ("-m", "-c", "-") or not arg.startswith("-"):
            break
        index += 2 if arg in ("-X", "-W") else 1
    return orig[:index]
