"""Pieces every command-line module shares (exit statuses, the usage error, the parser): a leaf, it imports no triage module."""

from __future__ import annotations

import argparse

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70


class UsageError(Exception):
    """Raised for arguments or input triage cannot use; printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (a UsageError), not argparse's usage dump and exit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")
