"""What every command-line module shares (exit statuses, the usage error, the parser); a leaf: imports no triage module."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70
COLOR_CHOICES = ("auto", "always", "never")


class UsageError(Exception):
    """Raised for arguments or input triage cannot use; printed as one line, exit status 2."""


class ParserExit(Exception):
    """Raised when a parser has printed what was asked for (--help, --version) and the command is done."""

    def __init__(self, status: int = EXIT_OK) -> None:
        super().__init__(status)
        self.status = status


class Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (a UsageError), not argparse's usage dump and exit."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)  # `--rep` is not `--report-dir`: an option is spelled out
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")

    def exit(self, status: int = EXIT_OK, message: str | None = None) -> NoReturn:  # type: ignore[override]
        if message:
            sys.stderr.write(message)
        raise ParserExit(status)


def add_version(parser: argparse.ArgumentParser) -> None:
    """`-V` / `--version`, the same on every command."""
    from .version import __version__

    parser.add_argument("-V", "--version", action="version", version=f"triage {__version__}",
                        help="print triage's version and exit")


def add_color(parser: argparse.ArgumentParser) -> None:
    """`--color`, as pytest has it: auto leaves the choice to rich (a terminal, NO_COLOR, FORCE_COLOR, TERM)."""
    parser.add_argument("--color", choices=COLOR_CHOICES, default="auto", metavar="auto|always|never",
                        help="colour the report: auto (default) follows the terminal and NO_COLOR / FORCE_COLOR")


def check_json_target(path: str) -> None:
    """Refuse a `--json FILE` that would overwrite something other than an earlier triage report: `--json train.log`
    (meant as `--json out.json train.log`) must not replace the user's log or script with a report."""
    if path == "-" or not os.path.lexists(path):
        return
    if os.path.isdir(path):
        raise UsageError(f"--json {path}: it is a folder; give a file name for the JSON report")
    try:
        with open(path, "rb") as handle:
            head = handle.read(256)
    except OSError as exc:
        raise UsageError(f"--json {path}: cannot read what is there ({exc.strerror or exc})") from None
    if head and b'"triage.report/' not in head:
        raise UsageError(f"--json {path}: the file exists and is not a triage JSON report; not overwriting it "
                         "(give a new file name)")
