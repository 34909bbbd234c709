"""`python -m triage [OPTIONS] SCRIPT [ARGS...]` / `triage run ...`: option parsing (standard library only)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from ..cli import UsageError

DEFAULT_HANG_TIMEOUT = 300.0
ON_HANG = ("report", "kill")

USAGE = """\
usage: python -m triage [OPTIONS] SCRIPT [ARGS...]
       python -m triage [OPTIONS] -m MODULE [ARGS...]
       triage run [OPTIONS] SCRIPT [ARGS...]

Run SCRIPT exactly as `python SCRIPT ARGS...` would (same sys.argv, __main__,
working directory, terminal and exit status) and triage whatever kills it: an
exception, a crash (segfault, abort, SIGKILL) or a hang. A run that succeeds
looks and behaves as without triage. Everything after SCRIPT belongs to it.

options:
  --report-dir DIR        where the report goes (default ./triage-reports/<time>-<script>/)
  --json FILE             also write the JSON report to FILE
  --no-probes             do not run confirmation experiments
  --hang-timeout SECONDS  no progress (batches, optimizer steps) for this long is a hang
                          (default 300; 0 turns it off); make it longer than the longest
                          stretch without either (evaluation without a DataLoader, saving)
  --on-hang report|kill   after a hang report keep the run going (default) or stop it
                          (the exit status is then 124, as with timeout(1))
  --rules PATH            extra rule file or folder (repeatable)
  --replay REPORT_DIR     feed the batch a failed run saved (REPORT_DIR/batch.pt) to the script
                          first, with the random states of that moment: the failure comes at once
  -m MODULE               run a module, as `python -m MODULE`
  -h, --help              show this help"""


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

    @property
    def label(self) -> str:
        """A short name for report folders: the script's stem or the module's last part."""
        if self.module:
            return self.target.rsplit(".", 1)[-1]
        name = os.path.basename(os.path.normpath(self.target))
        return name[:-3] if name.endswith(".py") else name


_WITH_VALUE = {"--report-dir", "--json", "--hang-timeout", "--on-hang", "--rules", "--replay"}


def parse(argv: list[str]) -> RunOptions | None:
    """Options up to SCRIPT (or -m MODULE); None when help was asked for."""
    values: dict[str, list[str]] = {}
    flags: set[str] = set()
    index = 0
    target = None
    module = False
    while index < len(argv):
        arg = argv[index]
        if arg in ("-h", "--help"):
            return None
        if arg == "--":
            index += 1
            if index < len(argv):
                target = argv[index]
            break
        if arg == "-m" or (arg.startswith("-m") and len(arg) > 2 and not arg.startswith("--")):
            module = True
            if arg == "-m":
                index += 1
                if index >= len(argv):
                    raise UsageError("-m needs a module name")
                target = argv[index]
            else:
                target = arg[2:]
            break
        if arg.startswith("--") and "=" in arg:
            name, _, value = arg.partition("=")
            if name not in _WITH_VALUE:
                raise UsageError(f"unknown option {name}")
            values.setdefault(name, []).append(value)
        elif arg in _WITH_VALUE:
            if index + 1 >= len(argv):
                raise UsageError(f"{arg} needs a value")
            index += 1
            values.setdefault(arg, []).append(argv[index])
        elif arg == "--no-probes":
            flags.add(arg)
        elif arg.startswith("-") and arg != "-":
            raise UsageError(f"unknown option {arg}")
        else:
            target = arg
            break
        index += 1
    if target is None:
        raise UsageError("no script given")
    options = RunOptions(target=target, module=module, args=list(argv[index + 1 :]))
    options.report_dir = _last(values, "--report-dir")
    options.json = _last(values, "--json")
    options.probes = "--no-probes" not in flags
    options.rules = values.get("--rules", [])
    timeout = _last(values, "--hang-timeout")
    if timeout is not None:
        try:
            options.hang_timeout = float(timeout)
        except ValueError:
            raise UsageError(f"--hang-timeout takes seconds, not {timeout!r}") from None
        if options.hang_timeout < 0:
            raise UsageError("--hang-timeout cannot be negative")
    options.replay = _last(values, "--replay")
    if options.replay is not None:
        saved = options.replay if os.path.isfile(options.replay) else os.path.join(options.replay, "batch.pt")
        if not os.path.isfile(saved):
            if os.path.isfile(os.path.join(options.replay, "step_inputs.pt")):
                raise UsageError(f"--replay: {options.replay} holds the failing step's inputs (step_inputs.pt), not a "
                                 f"DataLoader's batch, so there is nothing to feed them to; re-run the whole script")
            raise UsageError(f"--replay: {saved} does not exist (a failed run's report folder has it when the save_batch probe ran)")
    on_hang = _last(values, "--on-hang")
    if on_hang is not None:
        if on_hang not in ON_HANG:
            raise UsageError(f"--on-hang is one of {', '.join(ON_HANG)}, not {on_hang!r}")
        options.on_hang = on_hang
    return options


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


def _last(values: dict[str, list[str]], name: str) -> str | None:
    found = values.get(name)
    return found[-1] if found else None


def main(argv: list[str]) -> int:
    options = parse(argv)
    if options is None:
        print(USAGE)
        return 0
    from .launcher import is_launcher

    if is_launcher(options):  # torchrun / -m torch.distributed.run: the whole job, with one report
        from .launcher import run_job

        return run_job(options, argv[: len(argv) - len(options.args) - 1])
    from .supervisor import Supervisor

    return Supervisor(options).run()

