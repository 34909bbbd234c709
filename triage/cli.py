"""The `triage` command line: explain, rules, run (and `python -m triage SCRIPT`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70
SUBCOMMANDS = ("explain", "rules", "run", "eval", "trust", "untrust")


class UsageError(Exception):
    """Raised for arguments or input triage cannot use; printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not argparse's usage dump
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _dispatch(argv)
    except UsageError as exc:
        print(f"triage: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`triage explain log | head`); nothing left to say.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:
        if os.environ.get("TRIAGE_DEBUG"):
            raise
        print(f"triage: internal error: {type(exc).__name__}: {exc} (set TRIAGE_DEBUG=1 for details)", file=sys.stderr)
        return EXIT_INTERNAL


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return EXIT_OK if argv else EXIT_USAGE
    if argv[0] == "--version":
        from . import __version__

        print(f"triage {__version__}")
        return EXIT_OK
    if argv[0] == "explain":
        return _explain(argv[1:])
    if argv[0] == "rules":
        from .rules_cli import main as rules_main

        return rules_main(argv[1:])
    if argv[0] in ("trust", "untrust"):
        from .trust_cli import main as trust_main

        return trust_main(argv)
    if argv[0] == "eval":
        from .evaluate import main as eval_main

        return eval_main(argv[1:])
    if argv[0] == "run":
        argv = argv[1:]
    from .runner.cli import main as run_main

    return run_main(argv)


_USAGE = """\
usage: triage run [OPTIONS] SCRIPT [ARGS...]     run a script; triage whatever kills it
       python -m triage [OPTIONS] SCRIPT [ARGS...]
       triage explain [FILE|-] [--format text|json|markdown]
                                                 diagnose a pasted error log
       triage rules list|show ID|test [PATH...]|lint [PATH...]|new ID
       triage eval [DIR]                         score triage against a corpus
       triage trust [PATH] | --list; triage untrust PATH
                                                 let a project's triage.yaml run its Python probes"""


def _explain(argv: list[str]) -> int:
    parser = _Parser(prog="triage explain", description="Diagnose a pasted PyTorch error log without running anything.")
    parser.add_argument("file", nargs="?", default="-", help="log file; '-' or nothing reads standard input")
    parser.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    parser.add_argument("--rules", action="append", default=[], metavar="PATH", help="extra rule file or folder (repeatable)")
    args = parser.parse_args(argv)

    from .explain import explain_log
    from .kb import load_knowledge_base
    from .logread import LogReadError

    kb = load_knowledge_base([Path(p) for p in args.rules])
    for problem in kb.problems:
        print(f"triage: warning: rule skipped: {problem}", file=sys.stderr)
    if args.file == "-" and sys.stdin is not None and sys.stdin.isatty():
        print("triage: reading the log from standard input (paste it, then Ctrl-D)", file=sys.stderr)
    try:
        report = explain_log(args.file, kb)
    except LogReadError as exc:
        raise UsageError(str(exc)) from None
    from . import render

    if args.format == "json":
        sys.stdout.write(render.to_json(report))
    elif args.format == "markdown":
        sys.stdout.write(render.to_markdown(report))
    else:
        render.to_terminal(report, sys.stdout)
    return EXIT_OK
