"""What the parent learns about a child that cannot speak for itself: stacks of a hung run, a crash dump, the last heartbeat.

A hung run is asked for its stacks with a signal faulthandler answers (the
child registered it before the script started; forked DataLoader workers
inherit it), one process at a time so the dumps do not interleave. A process
started by exec (spawn/forkserver workers, other programs) never had the
handler, so it is not signalled: the default action of the signal would kill it.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from functools import lru_cache

from ..capture.environment import launcher_rank, relevant_env_vars
from ..capture.faultdump import Dump, format_stack, parse_dumps, without_hidden_frames
from ..capture.stderr_file import StderrFile
from ..incident import ExceptionInfo, Frame, Incident
from .channel import (CRASH_DUMP, DUMP_SIGNAL, ENVIRONMENT, STACK_DUMP, STATUS, WORKERS, Beat, Channel,
                      dump_ready_marker)

DUMP_WAIT_S = 2.0
DUMP_QUIET_S = 0.1
PY_SPY_TIMEOUT_S = 10.0
MAX_SOURCE_BYTES = 2 * 1024 * 1024
SHELL_WORDS = {
    "SIGSEGV": "Segmentation fault",
    "SIGBUS": "Bus error",
    "SIGABRT": "Aborted",
    "SIGFPE": "Floating point exception",
    "SIGILL": "Illegal instruction",
    "SIGKILL": "Killed",
    "SIGXCPU": "CPU time limit exceeded",
}
_DATALOADER_WAIT = re.compile(r"[\\/]torch[\\/]utils[\\/]data[\\/]dataloader\.py$")
_WORKER_LOOP = re.compile(r"[\\/]torch[\\/]utils[\\/]data[\\/]_utils[\\/]worker\.py$")
_PROCESS_START = re.compile(r"[\\/]multiprocessing[\\/]process\.py$")


@dataclass
class ProcessStacks:
    """The stacks of one process of the run, or why there are none."""

    pid: int
    role: str  # main, worker or process
    worker: int | None = None
    dump: Dump | None = None
    skipped: str | None = None
    raw: str = ""
    state: str = ""  # from /proc/<pid>/stat: R running, S sleeping, D waiting on I/O

    @property
    def label(self) -> str:
        if self.role == "main":
            return f"main process (pid {self.pid})"
        if self.role == "worker":
            return f"DataLoader worker {self.worker} (pid {self.pid})"
        return f"child process (pid {self.pid})"


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, breadth first."""
    found: list[int] = []
    queue = [pid]
    while queue:
        for child in _children(queue.pop(0)):
            if child not in found and child != pid:
                found.append(child)
                queue.append(child)
    return found


def _children(pid: int) -> list[int]:
    children: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    readable = False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as handle:
                children += [int(value) for value in handle.read().split()]
            readable = True
        except (OSError, ValueError):
            continue
    if readable:
        return children
    # Kernels without CONFIG_PROC_CHILDREN: scan every process's parent.
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat and stat[1] == pid:
                children.append(int(entry))
    return children


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return None


def collect_stacks(channel: Channel, child_pid: int) -> list[ProcessStacks]:
    """Stacks of the child and of each process below it that inherited the dump handler."""
    workers = channel.read_json(WORKERS) or {}
    own = _cmdline(child_pid)
    out: list[ProcessStacks] = []
    for pid in [child_pid] + descendants(child_pid):
        worker = (workers.get(str(pid)) or {}).get("worker")
        role = "main" if pid == child_pid else "worker" if worker is not None else "process"
        stacks = ProcessStacks(pid, role, worker)
        out.append(stacks)
        state = _stat(pid)
        if state is None or state[0] in ("Z", "X"):
            stacks.skipped = "already exited"
            continue
        stacks.state = state[0]
        forked = _cmdline(pid) == own  # a fork without exec inherited the handler
        if pid != child_pid and not forked and not os.path.exists(channel.file(dump_ready_marker(pid))):
            stacks.skipped = "started by exec (spawn/forkserver or another program) without the stack-dump handler"
            continue
        stacks.raw = _dump_one(channel, pid)
        dumps = parse_dumps(stacks.raw)
        if dumps:
            stacks.dump = dumps[0]
        else:
            stacks.skipped = "no stack dump arrived (blocked in C code with signals masked?)"
    return out


def _dump_one(channel: Channel, pid: int) -> str:
    start = channel.size(STACK_DUMP)
    try:
        os.kill(pid, DUMP_SIGNAL)
    except OSError:
        return ""
    deadline = time.monotonic() + DUMP_WAIT_S
    last, quiet_since = start, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.02)
        size = channel.size(STACK_DUMP)
        now = time.monotonic()
        if size != last:
            last, quiet_since = size, now
        elif size > start and now - quiet_since >= DUMP_QUIET_S:
            break
    return channel.read_text(STACK_DUMP, start, max(0, last - start))


def hang_incident(channel: Channel, processes: list[ProcessStacks], beat: Beat, stalled: float, timeout: float) -> tuple[Incident, dict[str, str]]:
    """A `hang` Incident: one pseudo-exception of type `Hang` per process stack, the main thread's first.

    Rules match hangs with `kind: hang` and `frame:`; the message of each says
    in words what that process is doing.
    """
    summary: list[str] = []
    exceptions: list[ExceptionInfo] = []
    other_threads: list[dict] = []
    main = processes[0]
    main_frames = _main_thread(main, beat)
    waits = _main_waits(main_frames, beat, main.state)
    head = f"no progress for {stalled:.0f} s: {waits}"
    summary.append(head)
    exceptions.append(ExceptionInfo(type="Hang", message=head, frames=main_frames))
    other_threads += _other_threads(main, beat)
    for process in processes[1:]:
        if process.dump is None:
            if process.role == "worker":  # other helper processes (a resource tracker) would only add noise
                summary.append(f"{process.label}: stack not read ({process.skipped})")
            continue
        frames = _main_thread(process, beat)
        line = f"{process.label} {_describe(frames, process.state)}"
        summary.append(line)
        exceptions.append(ExceptionInfo(type="Hang", message=line, frames=frames, worker=process.worker))
        other_threads += _other_threads(process, beat)
    incident = Incident(kind="hang", source="run", exception=exceptions[0], exceptions=exceptions, rank=launcher_rank())
    incident.log_lines = list(summary)
    incident.facts = {
        "hang_summary": summary,
        "stalled_s": round(stalled, 1),
        "hang_timeout_s": timeout,
        "last_state": beat.last_state(),
        "processes": [
            {"pid": p.pid, "role": p.role, "worker": p.worker, **({"skipped": p.skipped} if p.skipped else {})} for p in processes
        ],
    }
    if other_threads:
        incident.facts["other_threads"] = other_threads
    incident.environment = parent_environment(channel)
    texts = {
        "stacks.txt": "\n\n".join(f"=== {p.label} ===\n{without_hidden_frames(p.raw).strip() or p.skipped}" for p in processes) + "\n"
    }
    native = _py_spy(processes[0].pid)
    if native:
        texts["py-spy.txt"] = native
    return incident, texts


def _main_thread(process: ProcessStacks, beat: Beat) -> list[Frame]:
    if process.dump is None:
        return []
    thread = process.dump.main_thread(beat.main_thread or None)
    frames = thread.frames if thread else []
    if process.role != "main":
        # A forked worker's stack still holds the frames that forked it; its own life starts after `_bootstrap`.
        starts = [i for i, frame in enumerate(frames) if _PROCESS_START.search(frame.file) and frame.function == "_bootstrap"]
        if starts:
            frames = frames[starts[-1] + 1 :]
            if frames and _PROCESS_START.search(frames[0].file) and frames[0].function == "run":
                frames = frames[1:]
    return frames


def _other_threads(process: ProcessStacks, beat: Beat) -> list[dict]:
    if process.dump is None:
        return []
    main = process.dump.main_thread(beat.main_thread or None)
    return [
        {"process": process.label, "thread": hex(thread.ident or 0), "stack": format_stack(thread.frames)}
        for thread in process.dump.threads
        if thread is not main
    ]


def _main_waits(frames: list[Frame], beat: Beat, state: str) -> str:
    if any(_DATALOADER_WAIT.search(frame.file) for frame in frames[-6:]):
        text = f"the main thread waits for batch {beat.epoch_batches + 1} (index {beat.epoch_batches}) of the DataLoader"
        if beat.iterators > 1:
            text += f" (its iteration {beat.iterators})"
        if beat.awaited_worker >= 0:
            text += f", which DataLoader worker {beat.awaited_worker} is preparing"
        return text
    return "the main thread " + _describe(frames, state)


def _describe(frames: list[Frame], state: str = "") -> str:
    """'is blocked in MyDataset.__getitem__ at data.py:41: `self.lock.acquire()`' or 'is idle, waiting for indices'.

    A process the kernel reports as running (R) is busy, not blocked: a loop, not a lock.
    """
    if not frames:
        return "has no Python frames (it is in C code)"
    user = next((frame for frame in reversed(frames) if frame.user), None)
    innermost = frames[-1]
    if user is None:
        if any(_WORKER_LOOP.search(frame.file) for frame in frames):
            return "is idle, waiting for indices to load"
        return f"is in {_qualname(innermost)} at {_short(innermost.file)}:{innermost.line}"
    verb = "is busy in" if state == "R" else "is blocked in"
    text = f"{verb} {_qualname(user)} at {_short(user.file)}:{user.line}"
    if user.code:
        text += f" in `{user.code}`"
    if innermost is not user:
        text += f", inside {_qualname(innermost)} ({_short(innermost.file)}:{innermost.line})"
    return text


def _qualname(frame: Frame) -> str:
    owner = _enclosing_class(frame.file, frame.line or 0, frame.function)
    return f"{owner}.{frame.function}" if owner else frame.function


@lru_cache(maxsize=64)
def _classes_of(path: str) -> tuple[tuple[int, int, str, tuple[str, ...]], ...]:
    """(first line, last line, class name, method names) for every class in a source file."""
    try:
        if os.path.getsize(path) > MAX_SOURCE_BYTES:
            return ()
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return ()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            methods = tuple(n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
            found.append((node.lineno, node.end_lineno or node.lineno, node.name, methods))
    return tuple(found)


def _enclosing_class(path: str, line: int, function: str) -> str | None:
    best = None
    for first, last, name, methods in _classes_of(path):
        if first <= line <= last and function in methods and (best is None or first > best[0]):
            best = (first, name)
    return best[1] if best else None


def _short(path: str) -> str:
    """A path as short as it can be and still say where: relative to the working folder, or to site-packages."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


def _py_spy(pid: int) -> str | None:
    """Native frames too, when py-spy is installed and ptrace is allowed; nothing otherwise."""
    tool = shutil.which("py-spy")
    if tool is None:
        return None
    try:
        result = subprocess.run(
            [tool, "dump", "--pid", str(pid), "--native", "--subprocesses"],
            capture_output=True, text=True, timeout=PY_SPY_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout if result.returncode == 0 and result.stdout.strip() else None


def _note_death_at_exit(incident: Incident, name: str, status: dict) -> None:
    """The script had ended without an error when the signal came: the interpreter was shutting down."""
    incident.facts["died_at_exit"] = True
    line = f"triage: the script had ended without an error when {name} came: the process died while its interpreter shut down"
    if status.get("process_group_alive"):
        incident.facts["process_group_alive_at_exit"] = True
        line += ", with torch.distributed's process group still initialized (destroy_process_group() was never called)"
    incident.log_lines.append(line)


def crash_incident(channel: Channel, signum: int, oom_before: int | None, oom_after: int | None,
                   stderr_file: StderrFile | None = None) -> tuple[Incident, dict[str, str]]:
    """A `hard-crash` Incident from the faulthandler dump (if the signal allowed one), the native failure's lines in
    the stderr log (if stderr is one) and the last heartbeat."""
    name = signal.Signals(signum).name
    beat = channel.read_beat()
    raw = channel.read_text(CRASH_DUMP)
    dumps = [dump for dump in parse_dumps(raw) if dump.fatal]
    # SIGKILL leaves no dump; any there came from DataLoader workers earlier.
    dump = dumps[-1] if dumps and signum != signal.SIGKILL else None
    incident = Incident(kind="hard-crash", source="run", signal=name, exit_code=128 + signum, rank=launcher_rank())
    texts: dict[str, str] = {}
    if dump is not None:
        crashed = dump.crashed_thread()
        root = ExceptionInfo(type="Fatal Python error", message=dump.fatal or name, frames=crashed.frames if crashed else [])
        incident.exception = root
        incident.exceptions = [root]
        incident.log_lines.append(f"Fatal Python error: {dump.fatal}")
        others = [thread for thread in dump.threads if thread is not crashed]
        if others:
            incident.facts["other_threads"] = [{"thread": hex(t.ident or 0), "stack": format_stack(t.frames)} for t in others]
    if raw.strip():
        texts["crash.txt"] = without_hidden_frames(raw)
    if stderr_file is not None:
        incident.log_lines.extend(stderr_file.native_failure())
    if SHELL_WORDS.get(name):
        incident.log_lines.append(SHELL_WORDS[name])
    status = channel.read_json(STATUS) or {}
    if status.get("ended_cleanly"):  # (the exiting phase alone also follows sys.exit(1) and Ctrl-C)
        _note_death_at_exit(incident, name, status)
    state = beat.last_state()
    incident.facts["last_state"] = state
    incident.notes.append(_last_words(name, state))
    if signum == signal.SIGKILL:
        _oom_evidence(incident, oom_before, oom_after)
        if dumps:
            incident.notes.append(f"{len(dumps)} fatal-signal dump(s) from DataLoader workers came before (see crash.txt)")
    incident.environment = parent_environment(channel)
    return incident, texts


def _last_words(name: str, state: dict) -> str:
    text = f"the process died of {name}"
    if state.get("batches") or state.get("optimizer_steps"):
        text += f" after {state.get('batches', 0)} batches and {state.get('optimizer_steps', 0)} optimizer steps"
    if state.get("rss_bytes"):
        text += f"; its last resident memory was {state['rss_bytes'] / 2**30:.2f} GiB (peak {state.get('peak_rss_bytes', 0) / 2**30:.2f} GiB)"
    if state.get("gpu_allocated_bytes"):
        text += f", GPU memory allocated {state['gpu_allocated_bytes'] / 2**30:.2f} GiB"
    return text


def _oom_evidence(incident: Incident, before: int | None, after: int | None) -> None:
    limit = _memory_limit()
    if limit:
        incident.facts["memory_limit_bytes"] = limit
    if before is None or after is None:
        return
    incident.facts["oom_kills_during_run"] = after - before
    if after > before:
        incident.notes.append(
            f"the kernel's OOM killer killed {after - before} process(es) during the run (oom_kill {before} → {after}): "
            "most likely this one, out of host memory"
            + (f" (limit {limit / 2**30:.1f} GiB)" if limit else "")
        )
    else:
        incident.notes.append("the OOM killer's count did not change: another process (a scheduler, a user, a watchdog) sent SIGKILL")


def _memory_limit() -> int | None:
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("0::"):
                    with open("/sys/fs/cgroup" + line[3:].strip() + "/memory.max", encoding="utf-8") as limit:
                        value = limit.read().strip()
                    if value.isdigit():
                        return int(value)
    except OSError:
        pass
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def parent_environment(channel: Channel) -> dict:
    import platform
    import sys

    env = {"python": platform.python_version(), "implementation": platform.python_implementation(), "executable": sys.executable}
    env.update(channel.read_json(ENVIRONMENT) or {})
    env["env"] = relevant_env_vars()
    return env
