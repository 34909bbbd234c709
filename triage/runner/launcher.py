"""`python -m triage [OPTIONS] torchrun [TORCHRUN ARGS] SCRIPT [ARGS]`: triage a whole torchrun job, with one report.

The launch is rewritten so that every worker runs under triage
(`torchrun ARGS -m triage SCRIPT ARGS`) and leaves a record in a shared job
folder (`jobdir`). When the launcher has exited, the records become
RankOutcomes, `ranks.choose_root` picks the root rank, and one run-level report
is written: the root rank's incident, its diagnoses (with the experiments the
rank ran live), and every rank's outcome. The exit status is the launcher's.
Under `torchrun ... -m triage SCRIPT` (no parent) the ranks write the same
report themselves, each rewriting it as it exits, so the last one leaves the
whole job's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import jobdir
from .options import RunOptions

LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_FLAG_MODULE = ("-m", "--module")
_RANK_OPTIONS_WITH_VALUE = ("--hang-timeout", "--rules", "--on-hang")


def is_launcher(options: RunOptions) -> bool:
    """Whether SCRIPT is torchrun (or `-m torch.distributed.run` / `.launch`) rather than a training script."""
    if options.module:
        return options.target in LAUNCHER_MODULES
    return os.path.basename(options.target) == "torchrun"


def launcher_line(options: RunOptions) -> list[str]:
    """The launcher as the user named it: `torchrun` or `-m torch.distributed.run`."""
    return ["-m", options.target] if options.module else [options.target]


def split_launch(options: RunOptions) -> tuple[list[str], str, list[str], bool, bool]:
    """(launcher args, training script, its args, script is a module, --no-python), read by torch's own parser."""
    if options.module and options.target == "torch.distributed.launch":
        from torch.distributed.launch import get_args_parser
    else:
        from torch.distributed.run import get_args_parser
    parsed = get_args_parser().parse_args(options.args)
    script_args = list(parsed.training_script_args)
    launcher_args = options.args[: len(options.args) - len(script_args) - 1]
    module = bool(getattr(parsed, "module", False))
    if module:
        launcher_args = [arg for arg in launcher_args if arg not in _FLAG_MODULE]
    return launcher_args, parsed.training_script, script_args, module, bool(getattr(parsed, "no_python", False))


def run_job(options: RunOptions, argv_options: list[str]) -> int:
    """Run the launcher with every worker under triage; write the job's report; return (or die of) its status."""
    import shutil
    import tempfile

    launcher = [sys.executable, "-m", options.target] if options.module else [shutil.which(options.target) or options.target]
    try:
        launcher_args, script, script_args, module, no_python = split_launch(options)
    except SystemExit as exc:  # torch's parser printed its usage error; the launcher would have said the same
        return int(exc.code or 0) if isinstance(exc.code, int) else 2
    if no_python:
        sys.stderr.write("triage: --no-python runs a program, not Python: its workers run without triage\n")
        return _finish(subprocess.call(launcher + options.args))
    if not module and (problem := _unrunnable(script)):
        # Said once, here, instead of by every worker the launcher would start, each failing to open it.
        sys.stderr.write(f"triage: {script}: {problem}; nothing was launched\n")
        return 2
    folder = Path(tempfile.mkdtemp(prefix="triage-job-"))
    rank_options = _rank_options(argv_options)
    command = launcher + launcher_args + ["-m", "triage", *rank_options, *(["-m"] if module else []), script, *script_args]
    env = {**os.environ, jobdir.JOB_DIR_ENV: str(folder), jobdir.JOB_PARENT_ENV: "1"}
    started = time.time()
    process = subprocess.Popen(command, env=env)
    previous = {sig: signal.signal(sig, lambda signum, _frame: _forward(process, signum))
                for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        while True:
            try:
                code = process.wait()
                break
            except KeyboardInterrupt:  # the terminal sent Ctrl-C to the launcher too; wait for it to stop the job
                continue
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    try:
        write_job_report(folder, _config(options, script, started), code)
    except Exception as exc:
        if os.environ.get("TRIAGE_DEBUG"):
            raise
        sys.stderr.write(f"triage: internal error while writing the job's report: {type(exc).__name__}: {exc}\n")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return _finish(code)


def _unrunnable(script: str) -> str:
    """Why python could not run `script` as a file ("" when it could: a file, or a folder with __main__.py)."""
    if os.path.isdir(script):
        return "" if os.path.isfile(os.path.join(script, "__main__.py")) else "a folder without __main__.py"
    return "" if os.path.isfile(script) else "no such file"


def _rank_options(argv: list[str]) -> list[str]:
    """The options each rank gets: the experiment and hang settings; the report options belong to the job."""
    out: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        name = arg.split("=", 1)[0]
        if arg == "--no-probes":
            out.append(arg)
        elif name in _RANK_OPTIONS_WITH_VALUE:
            if "=" in arg:
                out.append(arg)
            elif index + 1 < len(argv):
                out += [arg, argv[index + 1]]
                index += 1
        elif name in ("--report-dir", "--json") and "=" not in arg:
            index += 1
        index += 1
    return out


def _config(options: RunOptions, script: str, started: float) -> dict[str, Any]:
    """Where the job's report goes, and the command that re-runs the job."""
    import shlex

    cwd = os.getcwd()
    label = os.path.basename(script)
    return {
        "report_dir": os.path.abspath(options.report_dir) if options.report_dir else None,
        "report_root": os.path.join(cwd, "triage-reports"),
        "label": (label[:-3] if label.endswith(".py") else label) + "-job",
        "json": os.path.abspath(options.json) if options.json else None,
        "rules": [os.path.abspath(path) for path in options.rules],
        "cwd": cwd,
        "command": shlex.join(["python", "-m", "triage", *launcher_line(options), *options.args]),
        "started": started,
    }


def _forward(process: subprocess.Popen, signum: int) -> None:
    try:
        process.send_signal(signum)
    except ProcessLookupError:
        pass


def _finish(code: int) -> int:
    """The launcher's status as this process's: a negative one (a signal) by dying of the same signal."""
    if code >= 0:
        return code
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
    return 128 - code


# --- the job's report, from the ranks' records -------------------------------------------------------------------


def write_job_report(folder: Path, config: dict[str, Any], launcher_code: int | None) -> Path | None:
    """One report for the job from the ranks' records; None (and no folder) when no rank failed."""
    from ..job_report import root_incident
    from ..ranks import choose_root

    records = jobdir.read_records(folder)
    outcomes = [_outcome(record) for record in records]
    root = choose_root(outcomes)
    if root is None:
        return None
    record = next(r for r in records if r.get("rank") == root.rank)
    base = _root_incident_of(record)
    if root.oom == "" and root.signal == "SIGKILL":
        root.oom = _oom_check(record)
    incident = root_incident(root, outcomes, base=base, source="run")
    if root.signal == "SIGKILL" and root.oom:
        incident.notes.append(root.oom)
    report = _diagnose(incident, config, record)
    report.rerun = {"command": config["command"], "replay": None}
    return _write(report, folder, config, records, launcher_code)


def _outcome(record: dict[str, Any]):
    from ..incident import ExceptionInfo, Frame
    from ..ranks import RankOutcome, SIGNAL_NUMBERS

    outcome = RankOutcome(rank=int(record.get("rank", 0)))
    code = record.get("exit_code")
    outcome.exit_code = code
    if isinstance(code, int) and code < 0:
        outcome.signal = next((name for name, number in SIGNAL_NUMBERS.items() if number == -code), f"signal {-code}")
    for item in record.get("incidents", []):
        incident = item.get("incident") or {}
        if incident.get("kind") == "nan":
            continue  # NaN/Inf checks report and training goes on: not the failure that ended the rank
        exception = incident.get("exception")
        if exception and exception.get("type") and exception.get("type") != "Hang":
            outcome.error = ExceptionInfo.from_dict(exception)
            outcome.failed_at = item.get("at")
            break
        if incident.get("signal"):
            outcome.failed_at = item.get("at")
            outcome.signal = outcome.signal or incident.get("signal")
            outcome.oom = _oom_note(incident.get("facts") or {})
            break
    outcome.stacks = [Frame.from_dict(frame) for frame in record.get("stacks", [])]
    outcome.exited_at = record.get("exited_at")
    if outcome.error is None and outcome.stacks and outcome.failed_at is None:
        outcome.failed_at = record.get("stopped_at")
    return outcome


def _oom_note(facts: dict[str, Any]) -> str:
    kills = facts.get("oom_kills_during_run")
    if kills is None:
        return ""
    if kills > 0:
        return f"the kernel's OOM killer killed {kills} process(es) during the job: most likely this rank"
    return "the OOM killer's count did not change: something else sent SIGKILL"


def _oom_check(record: dict[str, Any]) -> str:
    """Whether the kernel log names this rank's process as an OOM kill; says so when the log cannot be read."""
    import subprocess

    pid = record.get("child_pid")
    try:
        done = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=3)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"could not check the kernel's OOM killer: dmesg is unavailable ({type(exc).__name__})"
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["permission denied"])[-1]
        return f"could not check the kernel's OOM killer: dmesg is unreadable here ({reason[:120]})"
    if pid and any(f"Killed process {pid}" in line for line in done.stdout.splitlines()):
        return f"the kernel log shows the OOM killer killed this rank's process (pid {pid})"
    return "the kernel log shows no OOM kill of this rank's process: something else sent SIGKILL"


def _root_incident_of(record: dict[str, Any]):
    """The root rank's own incident (the first that ended it), or None when it left none (stopped, or exited early)."""
    from ..incident import ExceptionInfo, Incident

    for item in record.get("incidents", []):
        data = item.get("incident") or {}
        if data.get("kind") == "nan":
            continue
        incident = Incident.from_dict(data, source="run")
        incident.environment = data.get("environment") or {}
        return incident
    if record.get("stacks"):
        from ..incident import Frame

        frames = [Frame.from_dict(frame) for frame in record["stacks"]]
        hang = ExceptionInfo(type="Hang", message="stopped by the launcher while the other ranks waited for it", frames=frames)
        return Incident(kind="hang", source="run", exception=hang, exceptions=[hang], exit_code=record.get("exit_code"))
    return None


def _diagnose(incident, config: dict[str, Any], record: dict[str, Any]):
    """Match the root incident; keep the experiments the root rank ran live for the rules both found."""
    from ..diagnosis import ProbeResult
    from ..kb import load_knowledge_base
    from ..pipeline import diagnose_incident, rule_warnings

    cwd = config.get("cwd")
    kb = load_knowledge_base([Path(p) for p in config.get("rules") or []], cwd=Path(cwd) if cwd else None)
    report = diagnose_incident(incident, kb, source="run", warnings=rule_warnings(kb))
    diagnoses = report.diagnoses
    live = _rank_report(record)
    by_rule = {d.get("rule"): d for d in (live or {}).get("diagnoses", [])}
    for diagnosis in diagnoses:
        ran = by_rule.get(diagnosis.rule)
        if ran and ran.get("probes"):
            diagnosis.probes = [ProbeResult(p.get("name", ""), p.get("status", ""), p.get("detail", ""),
                                            facts=p.get("facts") or {}, artifacts=p.get("artifacts") or [],
                                            seconds=p.get("seconds")) for p in ran["probes"]]  # fmt: skip
    if live:
        order = {d.get("rule"): index for index, d in enumerate(live.get("diagnoses", []))}
        diagnoses.sort(key=lambda d: order.get(d.rule, len(order)))  # the live ranking saw the experiments
    return report


def _rank_report(record: dict[str, Any]) -> dict[str, Any] | None:
    for folder in record.get("reports", []):
        try:
            return json.loads((Path(folder) / "report.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
    return None


def _write(report, folder: Path, config: dict[str, Any], records: list[dict[str, Any]], launcher_code: int | None) -> Path:
    """The job's report folder, with each rank's own report under ranks/; the summary on stderr."""
    import shutil

    from ..report_dir import claim_folder, shown_path, write_report

    target = config.get("final_folder")
    if target:
        out = Path(target)
        out.mkdir(parents=True, exist_ok=True)
    else:
        out = claim_folder(explicit=config.get("report_dir"), root=config["report_root"], label=config["label"],
                           run_id=f"job-{os.getpid()}-{time.time_ns()}")  # fmt: skip
    ranks_folder = out / "ranks"
    for record in records:
        for index, rank_report in enumerate(record.get("reports", [])):
            source = Path(rank_report)
            if source.is_dir() and any(source.iterdir()):
                name = f"rank{record.get('rank')}" + (f"-{index + 1}" if index else "")
                shutil.copytree(source, ranks_folder / name, dirs_exist_ok=True)
    report.incident.facts["launcher_exit_code"] = launcher_code
    _point_into(report, folder, ranks_folder)
    write_report(report, out, run={"command": config.get("command"), "cwd": config.get("cwd")},
                 json_copy=config.get("json"))  # fmt: skip
    if config.get("print", True):
        from ..pipeline import print_summary

        print_summary(report, sys.stderr, lead_in=None)
        sys.stderr.write(f"triage: job report written to {shown_path(out / 'report.md')}\n")
        sys.stderr.flush()
    return out


def _point_into(report, job_folder: Path, ranks_folder: Path) -> None:
    """The experiments' artifacts now live in the report's ranks/ folder, not in the job folder that goes away."""
    old, new = str(job_folder), str(ranks_folder)
    for diagnosis in report.diagnoses:
        for probe in diagnosis.probes:
            probe.detail = probe.detail.replace(old, new)
            probe.artifacts = [path.replace(old, new) for path in probe.artifacts]


# --- the rank's side: hooks the supervisor calls in a torchrun job ----------------------------------------------


def rank_config(config: dict[str, Any]) -> dict[str, Any]:
    """In a torchrun job, a rank's report goes into the job folder and its summary is left to the job's report."""
    folder = jobdir.job_dir()
    if folder is None:
        return config
    rank = jobdir.rank_of()
    config.update(job_dir=str(folder), rank=rank, report_dir_user=config.get("report_dir"),
                  report_dir=str(folder / f"rank{rank}"), json=None, quiet=True)  # fmt: skip
    return config


def stacks_at_sigterm(channel) -> tuple[list[dict[str, Any]], str]:
    """The main thread's stack the rank dumped when the agent's SIGTERM killed it (see child.Session.start)."""
    from ..capture.faultdump import parse_dumps, without_hidden_frames
    from .channel import STACK_DUMP

    raw = channel.read_text(STACK_DUMP)
    dumps = parse_dumps(raw)
    if not dumps:
        return [], ""
    main = dumps[-1].main_thread(channel.read_beat().main_thread or None)
    frames = [frame.to_dict() for frame in main.frames] if main is not None else []
    return frames, without_hidden_frames(dumps[-1].text)[:20000]


def on_rank_exit(config: dict[str, Any], code: int, channel) -> None:
    """The rank's exit status (and, stopped by the agent, its stacks) into its record; without a parent
    `triage torchrun`, rewrite the job's report."""
    import fcntl
    import shlex
    import shutil

    folder, rank = Path(config["job_dir"]), int(config.get("rank", 0))
    reports = sorted(str(path) for path in folder.glob(f"rank{rank}") if path.is_dir())
    reports += sorted(str(path) for path in folder.glob(f"rank{rank}-*") if path.is_dir())
    jobdir.update_record(folder, rank, exit_code=code, exited_at=time.time(), reports=reports,
                         child_pid=config.get("child_pid"))  # fmt: skip
    if code == -signal.SIGTERM:  # after the exit status, which must be there whatever the dump holds
        frames, text = stacks_at_sigterm(channel)
        if frames:
            # Once every rank of the node has its exit status in, the last one removes the folder: this late write
            # must not create it again (left behind, with a report of this rank alone).
            jobdir.update_record(folder, rank, create=False, stacks=frames, stack_text=text, stopped_at=time.time())
    if os.environ.get(jobdir.JOB_PARENT_ENV):
        return
    try:
        lock = open(folder / ".lock", "a+")
    except FileNotFoundError:
        return  # the node's last rank has written the job's report, this rank's record in it, and cleaned up
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not folder.is_dir():
            return  # removed while this rank waited for the lock: the report is written
        job = folder / "job.json"
        shared = jobdir.read_record(job)
        if shared is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            name = f"{stamp}-{config.get('label', 'script').rsplit('-rank', 1)[0]}-job"
            root = config.get("report_dir_user") or os.path.join(config.get("report_root") or "triage-reports", name)
            shared = {"final_folder": root}
            job.write_text(json.dumps(shared), encoding="utf-8")
        job_config = {
            "final_folder": shared["final_folder"], "cwd": config.get("cwd"), "rules": config.get("rules"),
            "command": shlex.join(["torchrun", *_torchrun_argv(), "-m", "triage", config.get("target", ""),
                                   *config.get("args", [])]),
            "print": False, "report_root": config.get("report_root"), "label": config.get("label"),
        }  # fmt: skip
        written = write_job_report(folder, job_config, None)
        world = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
        done = [r for r in jobdir.read_records(folder) if r.get("exited_at")]
        if written is not None and world and len(done) >= world:
            sys.stderr.write(f"triage: job report written to {written / 'report.md'}\n")
        if world and len(done) >= world:
            shutil.rmtree(folder, ignore_errors=True)  # the last rank of the node: the records are in the report


def _torchrun_argv() -> list[str]:
    """torchrun's own arguments, as far as a worker can know them (its world size)."""
    size = os.environ.get("LOCAL_WORLD_SIZE")
    return [f"--nproc_per_node={size}"] if size else []
