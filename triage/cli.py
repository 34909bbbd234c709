"""The `triage` command line: run (also `triage SCRIPT` and `python -m triage SCRIPT`), explain, rules, eval."""

from __future__ import annotations

import os
import sys

from .cli_common import (  # noqa: F401 (UsageError and the statuses are re-exported)
    EXIT_FAILED,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_USAGE,
    Parser,
    ParserExit,
    UsageError,
    add_color,
    add_version,
    check_json_target,
)

SUBCOMMANDS = ("explain", "rules", "run", "eval", "trust", "untrust")
FORMATS = ("text", "json", "markdown")
COMMANDS_HELP = """\
Commands:
  run       run a script and triage whatever kills it (the default: `triage SCRIPT` is `triage run SCRIPT`)
  explain   diagnose a pasted error log without running anything
  rules     list, show, test, lint and scaffold knowledge-base rules
  eval      score triage against a corpus of failing logs and scripts
  trust     let a project's triage.yaml run its Python probes (untrust takes it back)
`triage COMMAND --help` describes each command."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _dispatch(argv)
    except UsageError as exc:
        print(f"triage: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ParserExit as exc:  # --help or --version was printed
        return exc.status
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
    if not argv:
        raise UsageError(f"no script or command given (see `{_prog()} --help`)")
    command, rest = argv[0], argv[1:]
    if command == "explain":
        return _explain(rest)
    if command == "rules":
        from .rules_cli import main as rules_main

        return rules_main(rest)
    if command in ("trust", "untrust"):
        from .trust_cli import main as trust_main

        return trust_main(argv)
    if command == "eval":
        from .evaluate import main as eval_main

        return eval_main(rest)
    from .runner.cli import main as run_main

    if command == "run":
        return run_main(rest, prog="triage run")
    prog = _prog()
    return run_main(argv, prog=prog, help_text=lambda: top_level_help(prog))


def _prog() -> str:
    """How the user called us: `python -m triage` runs triage/__main__.py; the console script is `triage`."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return "python -m triage" if getattr(spec, "name", None) == "triage.__main__" else "triage"


def top_level_help(prog: str = "triage") -> str:
    """`triage --help`: every command's usage, then the run options (the default command's)."""
    from .runner.cli import run_parser

    parser = run_parser(prog)
    parser.usage = (
        f"{prog} [OPTIONS] SCRIPT [ARGS...]\n"
        f"       {prog} [OPTIONS] -m MODULE [ARGS...]\n"
        "       triage run [OPTIONS] SCRIPT [ARGS...]\n"
        "       triage explain [FILE|-] [--format text|json|markdown] [--json FILE|-]\n"
        "       triage rules list|show ID|test [PATH...]|lint [PATH...]|new ID\n"
        "       triage eval [DIR]\n"
        "       triage trust [PATH] | --list;  triage untrust PATH"
    )
    parser.description = f"{COMMANDS_HELP}\n\n{parser.description}"
    return parser.format_help()


def explain_parser() -> Parser:
    description = ("Diagnose a pasted PyTorch error log without running anything (torch is not needed). Exit status "
                   "0 when the log was read, whether or not a rule matched; 2 when it could not be read.")
    parser = Parser(prog="triage explain", description=description)
    parser.add_argument("file", nargs="?", default="-", metavar="FILE",
                        help="log file; `-` or nothing reads standard input")
    parser.add_argument("--format", choices=FORMATS, default=None, metavar="text|json|markdown",
                        help="what to print on standard output (default: text)")
    parser.add_argument("--json", metavar="FILE",
                        help="also write the JSON report (triage.report/1) to FILE (an existing file only if it is an earlier "
                             "triage report); `-` prints it on standard output instead of the text view")
    parser.add_argument("--rules", action="append", default=[], metavar="PATH",
                        help="extra rule file or folder (repeatable)")
    add_color(parser)
    add_version(parser)
    return parser


def _explain(argv: list[str]) -> int:
    args = explain_parser().parse_args(argv)
    output = args.format or "text"
    if args.json == "-":
        if args.format not in (None, "json"):
            raise UsageError(f"--json - and --format {args.format} would both print on standard output; choose one")
        output = "json"
    if args.json is not None:
        check_json_target(args.json)

    from pathlib import Path

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

    if args.json not in (None, "-"):
        try:
            with open(args.json, "w", encoding="utf-8") as handle:
                handle.write(render.to_json(report))
        except OSError as exc:
            raise UsageError(f"--json {args.json}: cannot write it ({exc.strerror or exc})") from None
    if output == "json":
        sys.stdout.write(render.to_json(report))
    elif output == "markdown":
        sys.stdout.write(render.to_markdown(report))
    else:
        render.to_terminal(report, sys.stdout, color=args.color)
    return EXIT_OK
