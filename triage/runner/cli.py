"""`python -m triage [OPTIONS] SCRIPT [ARGS...]` / `triage run ...`: option parsing (standard library only)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import Callable

from ..cli_common import Parser, UsageError, add_color, add_version, check_json_target
from .options import DEFAULT_HANG_TIMEOUT, ON_HANG, STDIN_SCRIPT, RunOptions


DESCRIPTION = """\
Run SCRIPT exactly as `python SCRIPT ARGS...` would (same sys.argv, __main__,
working directory, terminal and exit status) and triage whatever kills it: an
exception, a crash (segfault, abort, SIGKILL) or a hang. A run that succeeds
looks and behaves as without triage. Options go before SCRIPT; everything after
SCRIPT belongs to it. SCRIPT `-` reads the script from standard input, as
`python -` does.

Reports go to ./triage-reports/<time>-<script>/ (each folder ignores itself in
git); TRIAGE_REPORT_DIR moves that root, --report-dir names the folder."""


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options of `triage run`, which `triage` / `python -m triage` take before SCRIPT too."""
    parser.add_argument("-h", "--help", action="store_true", help="show this help message and exit")
    add_version(parser)
    parser.add_argument("--report-dir", metavar="DIR",
                        help="where the report goes (default: $TRIAGE_REPORT_DIR or ./triage-reports, "
                             "in a new <time>-<script> folder)")
    parser.add_argument("--json", metavar="FILE",
                        help="also write the JSON report to FILE (an existing file only if it is an earlier triage report); not "
                             "`-`: standard output is the script's")
    parser.add_argument("--no-probes", dest="probes", action="store_false",
                        help="do not run confirmation experiments")
    parser.add_argument("--hang-timeout", metavar="SECONDS", type=_seconds, default=DEFAULT_HANG_TIMEOUT,
                        help="no progress (batches, optimizer steps) for this long is a hang (default 300; 0 turns "
                             "it off); make it longer than the longest stretch without either (evaluation "
                             "without a DataLoader, saving)")
    parser.add_argument("--on-hang", choices=ON_HANG, default="report", metavar="report|kill",
                        help="after a hang report, keep the run going (default) or stop it (the exit status is "
                             "then 124, as with timeout(1))")
    parser.add_argument("--rules", action="append", default=[], metavar="PATH",
                        help="extra rule file or folder (repeatable)")
    parser.add_argument("--replay", metavar="REPORT_DIR",
                        help="feed the batch a failed run saved (REPORT_DIR/batch.pt) to the script first, with "
                             "the random states of that moment: the failure comes at once")
    add_color(parser)
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module, as `python -m MODULE`")
    parser.add_argument("script", nargs="?", metavar="SCRIPT",
                        help="the script to run (`-`: read it from standard input)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's own arguments")


def run_parser(prog: str = "triage run") -> Parser:
    usage = f"{prog} [OPTIONS] SCRIPT [ARGS...]\n       {prog} [OPTIONS] -m MODULE [ARGS...]"
    parser = Parser(prog=prog, usage=usage, description=DESCRIPTION, add_help=False,
                    formatter_class=argparse.RawDescriptionHelpFormatter)  # the description is laid out by hand
    add_run_options(parser)
    return parser


def split_at_target(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """(triage's options, [SCRIPT, ARGS...]): the script's arguments are never read as triage's.

    The first word that is not an option or an option's value is SCRIPT; `-m MODULE`
    and `--` also end triage's options. Which options take a value comes from the
    parser itself, so the two never disagree.
    """
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--":
            return argv[:index], argv[index + 1 :]
        if arg == "-m" or (arg.startswith("-m") and not arg.startswith("--")):
            return argv[:index], argv[index:]
        if arg == STDIN_SCRIPT or not arg.startswith("-"):
            return argv[:index], argv[index:]
        action = parser._option_string_actions.get(arg)
        index += 2 if action is not None and action.nargs is None else 1  # `--opt VALUE` vs a flag, `--opt=VALUE`
    return argv, []


def parse(argv: list[str], prog: str = "triage run") -> RunOptions | None:
    """Options up to SCRIPT (or -m MODULE); None when help was asked for."""
    parser = run_parser(prog)
    own, rest = split_at_target(parser, argv)
    args = parser.parse_args(own)
    if args.help:
        return None
    options = _target(rest, prog)
    options.report_dir = args.report_dir
    options.json = args.json
    if options.json == "-":
        raise UsageError("--json -: standard output belongs to the script; give a file name "
                         "(the report folder always holds report.json)")
    if options.json is not None:
        check_json_target(options.json)
    options.probes = args.probes
    options.rules = args.rules
    options.hang_timeout = args.hang_timeout
    options.on_hang = args.on_hang
    options.color = args.color
    options.replay = args.replay
    if options.replay is not None:
        _check_replay(options.replay)
    return options


def _target(rest: list[str], prog: str) -> RunOptions:
    """SCRIPT ARGS..., or -m MODULE ARGS... (also -mMODULE, as python takes it)."""
    if not rest:
        raise UsageError(f"no script given (see `{prog} --help`)")
    if rest[0] == "-m" or (rest[0].startswith("-m") and rest[0] != "-"):
        if rest[0] != "-m":
            return RunOptions(target=rest[0][2:], module=True, args=rest[1:])
        if len(rest) < 2:
            raise UsageError("-m needs a module name")
        return RunOptions(target=rest[1], module=True, args=rest[2:])
    return RunOptions(target=rest[0], args=rest[1:])


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if value != value:  # not a number, or NaN itself
        raise argparse.ArgumentTypeError(f"takes seconds, not {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError("cannot be negative")
    return value


def _check_replay(replay: str) -> None:
    saved = replay if os.path.isfile(replay) else os.path.join(replay, "batch.pt")
    if os.path.isfile(saved):
        return
    if os.path.isfile(os.path.join(replay, "step_inputs.pt")):
        raise UsageError(f"--replay: {replay} holds the failing step's inputs (step_inputs.pt), not a "
                         f"DataLoader's batch, so there is nothing to feed them to; re-run the whole script")
    raise UsageError(f"--replay: {saved} does not exist "
                     "(a failed run's report folder has it when the save_batch probe ran)")


def main(argv: list[str], prog: str = "triage run", help_text: Callable[[], str] | None = None) -> int:
    """Parse, then hand the run to the supervisor, which ends this process with the script's status."""
    options = parse(argv, prog)
    if options is None:
        sys.stdout.write(help_text() if help_text is not None else run_parser(prog).format_help())
        return 0
    if importlib.util.find_spec("torch") is None:
        # The experiments re-run torch code; without torch the script is still run, captured and diagnosed.
        sys.stderr.write(f"triage: torch is not installed for {sys.executable}: running {options.target} without "
                         f"triage's experiments (`{sys.executable} -m pip install torch` adds it)\n")
        options.probes = False
    from .launcher import is_launcher

    if is_launcher(options):  # torchrun / -m torch.distributed.run: the whole job, with one report
        from .launcher import run_job

        return run_job(options, split_at_target(run_parser(prog), argv)[0])
    from .supervisor import Supervisor

    return Supervisor(options).run()

