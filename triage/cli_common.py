"""What every triage command line shares: exit statuses, the usage error and the one-line-error parser (a leaf)."""

from __future__ import annotations

import argparse

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70


class UsageError(Exception):
    """Raised for arguments or input triage cannot use; printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one-line UsageErrors, not argparse's usage dump and exit."""

    def error(self, message: str) -> None:
        raise UsageError(f"{message} (see `{self.prog} --help`)")
