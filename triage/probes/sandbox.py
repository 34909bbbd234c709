"""Run one experiment in a disposable child forked from the live process, and bring back plain data.

Copy-on-write gives the child its own view of every object at the moment of
failure: whatever the experiment does to the model, the batch, the RNG or the
namespaces stays in the child. What fork does not isolate is handled as the
child starts: file descriptors (shared with the parent) are made private
(stdin and everything writable point at /dev/null, stdout and stderr at capture
files, readable regular files are reopened at their own offset), the working
directory is a private temp folder whose entries link to the run's (relative
reads find the user's files), Python-level writes to files outside it go to
shadow copies inside it (so that a log line in `forward` does not stop
the experiment), and an audit hook refuses what else would reach outside:
other file writes, subprocesses, forks, sockets, signals and `os._exit`.
`torch.save` and `torch.distributed`'s collectives are stubbed. CUDA does not survive fork: when the parent
holds a CUDA context, an experiment that reaches CUDA (torch's "Cannot re-initialize CUDA in forked subprocess")
has not run, whatever it made of the error, and comes back stopped as "unavailable"; so does one whose backward
autograd refuses (on a machine with a GPU its engine's worker threads, started by the run's first backward, do
not survive fork either). Nothing is collected
automatically in the child, so no finalizer of the run's objects runs there, and the run's unraisable hook is
not used. The child sends its value back through a pipe and always ends with its own `os._exit`,
so it never runs the parent's atexit handlers or flushes the parent's buffers.
The parent kills it with SIGKILL at the time limit and caps its address space.
"""

from __future__ import annotations

import errno
import faulthandler
import gc
import os
import pickle
import re
import select
import shutil
import signal
import stat
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

# Time a child gets past its limit to write where it was, before SIGKILL.
DUMP_GRACE_S = 0.3
# Share of the memory available at the failure that one experiment may allocate on top of what it inherits.
MEMORY_SHARE = 0.5
# Most bytes of the child's stdout/stderr and of its result the parent reads back.
CAPTURE_BYTES = 64 * 1024
RESULT_BYTES = 16 * 1024**2
# Largest file copied into the child's folder when the experiment appends to it or updates it.
SHADOW_COPY_BYTES = 64 * 1024**2
# Most entries of the run's working folder linked into the child's own (a home folder can hold thousands).
MIRRORED_ENTRIES = 4096

# torch's error for a CUDA call in a process forked from one that had initialised CUDA (torch/cuda/__init__.py), and
# the driver's for a CUDA call that bypasses torch's check (a kernel on a tensor left on the GPU).
BAD_FORK_MESSAGE = "Cannot re-initialize CUDA in forked subprocess"
CUDA_INIT_ERROR = "CUDA error: initialization error"
CUDA_AFTER_FORK = "the experiment reached CUDA, which a forked experiment cannot use (CUDA does not survive fork)"
# autograd's engine, once it has started worker threads (one per GPU at the first backward on a machine with a GPU,
# whatever the tensors' device; seen too after torch.compile on torch 2.14), refuses any backward in a forked child
# (torch/csrc/autograd/engine.cpp).
AUTOGRAD_FORK_MESSAGE = "Unable to handle autograd's threading in combination with fork-based multiprocessing"
BACKWARD_AFTER_FORK = ("the experiment needed a backward pass, which autograd refuses in a process forked after its "
                       "engine started worker threads (on a machine with a GPU, the run's first backward starts them)")

_CHILD_EXIT_DONE = 0
_CHILD_EXIT_BROKEN = 70
_REFUSED_EVENTS = {
    "subprocess.Popen": "start a subprocess", "os.system": "run a shell command", "os.exec": "exec a program",
    "os.posix_spawn": "spawn a program", "os.spawn": "spawn a program", "os.fork": "fork",
    "os.forkpty": "fork", "os.startfile": "start a program", "pty.spawn": "spawn a program",
    "socket.connect": "open a connection", "socket.bind": "bind a socket", "socket.sendto": "send on a socket",
    "socket.sendmsg": "send on a socket", "socket.getaddrinfo": "look up a host", "socket.gethostbyname": "look up a host",
    "os.kill": "send a signal", "os.killpg": "send a signal", "signal.pthread_kill": "send a signal",
    "urllib.Request": "open a URL", "webbrowser.open": "open a browser",
}
# Events whose first argument is a path the experiment would change.
_PATH_EVENTS = {"os.remove", "os.rename", "os.replace", "os.rmdir", "os.mkdir", "os.truncate", "os.chmod", "os.chown",
                "os.link", "os.symlink", "os.utime", "os.chflags", "os.lchflags", "os.lchmod", "os.setxattr",
                "os.removexattr", "shutil.rmtree", "shutil.move", "shutil.chown", "sqlite3.connect"}
_TWO_PATH_EVENTS = {"os.rename", "os.replace", "os.link", "os.symlink", "shutil.move"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_DISTRIBUTED = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
                "all_to_all_single", "barrier", "monitored_barrier", "broadcast", "broadcast_object_list", "gather",
                "gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list",
                "send", "recv", "isend", "irecv", "batch_isend_irecv")


class Refused(PermissionError):
    """Raised inside the child when the experiment tries something that would reach outside it."""


@dataclass
class Outcome:
    """What the experiment did: its value, or the exception it raised, or why the child did not finish."""

    value: Any = None
    error: str | None = None  # "ZeroDivisionError: division by zero" (first line)
    error_type: str | None = None
    error_traceback: str = ""
    stopped: str | None = None  # "time", "memory", "signal", "unavailable" when the child did not finish
    reason: str = ""  # one line, for a stopped child
    seconds: float = 0.0
    # where a child stopped at its time limit was, or where an experiment reached CUDA it could not use
    stack: list[traceback.FrameSummary] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    refused: list[str] = field(default_factory=list)  # what the audit hook refused, in order
    saves: list[str] = field(default_factory=list)  # torch.save calls the stub swallowed
    redirected: list[str] = field(default_factory=list)  # files whose writes went to a shadow copy in the child


def fork_available() -> bool:
    """Whether experiments that run user code can be isolated here (fork is POSIX only)."""
    return hasattr(os, "fork") and sys.platform not in ("win32", "cygwin", "emscripten", "wasi")


def in_sandbox() -> bool:
    """True inside an experiment's child (where no CUDA call may be made: CUDA does not survive fork)."""
    return _state.active


def parent_threads() -> int | None:
    """torch's intra-op thread count in the forked-from process (the experiment itself runs with one); None outside one."""
    return _state.parent_threads if _state.active else None


class _State:
    active = False
    refused: list[str] = []
    saves: list[str] = []
    redirected: list[str] = []
    streams: list[Any] = []  # the child's own stdout and stderr
    parent_threads: int | None = None  # torch's intra-op threads in the process the child was forked from
    parent_cuda = False  # the process the child was forked from had initialised CUDA
    # why the experiment could not run in a fork (CUDA_AFTER_FORK, BACKWARD_AFTER_FORK) and where it first found so
    not_run: tuple[str, list[traceback.FrameSummary]] | None = None


_state = _State()


def run(fn: Callable[[], Any], limit_s: float, *, allowed: Iterable[str | os.PathLike] = (),
        memory_bytes: int | None = None) -> Outcome:
    """Call fn() in a forked child for at most `limit_s` seconds; its return value must pickle.

    `allowed` are folders besides the child's temp folder it may write (triage's report folder).
    `memory_bytes` caps what the child may allocate beyond what it inherits (default: a share of
    the memory available now)."""
    if not fork_available():
        return Outcome(stopped="unavailable", reason=f"experiments that run user code need fork, which "
                       f"{sys.platform} does not have")
    if _state.active:  # an experiment inside an experiment: already isolated
        return call_here(fn)
    started = time.monotonic()
    folder = tempfile.mkdtemp(prefix="triage-experiment-")
    try:
        budget = memory_bytes if memory_bytes is not None else memory_budget()
        python_random = _python_rng_state()
        parent_cuda = cuda_initialised()
        read_end, write_end = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(read_end)
            os.close(write_end)
            return Outcome(stopped="unavailable", reason=f"cannot fork an experiment: {exc.strerror or exc}")
        if pid == 0:  # the child: never returns
            try:
                _child(fn, read_end, write_end, folder, [str(a) for a in allowed], budget, limit_s, python_random,
                       parent_cuda)
            finally:
                os._exit(_CHILD_EXIT_BROKEN)
        os.close(write_end)
        try:
            outcome = _wait(pid, read_end, limit_s, started, budget)
        finally:
            os.close(read_end)
        _read_captures(outcome, folder)
        return outcome
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def cuda_initialised() -> bool:
    """Whether this process holds a CUDA context, which no process forked from it can use (never starts CUDA)."""
    cuda = sys.modules.get("torch.cuda")
    if cuda is None:
        return False
    try:
        return bool(cuda.is_initialized())  # False in a process that is itself a bad fork: its CUDA errors are real
    except Exception:
        return False


def memory_budget() -> int:
    """Bytes one experiment may allocate: a share of the memory available (cgroup limit included)."""
    available = _available_memory()
    return int(available * MEMORY_SHARE) if available else 4 * 1024**3


def _available_memory() -> int | None:
    found: list[int] = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    for limit_path, usage_path in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = Path(limit_path).read_text().strip()
            usage = int(Path(usage_path).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:
            found.append(max(int(limit) - usage, 0))
            break
    return min(found) if found else None


def _python_rng_state() -> Any:
    import random

    return random.getstate()  # `random` reseeds itself in a forked child; the experiment should see the parent's


# ---------------------------------------------------------------------------- parent side


def _wait(pid: int, read_end: int, limit_s: float, started: float, budget: int) -> Outcome:
    """Read the child's result until it ends or its time is up; the child is reaped whatever happens."""
    deadline = started + max(limit_s, 0.01) + DUMP_GRACE_S
    chunks: list[bytes] = []
    size = 0
    killed = False
    poller = select.poll()
    poller.register(read_end, select.POLLIN | select.POLLHUP)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                killed = True
                break
            if poller.poll(min(left, 0.5) * 1000):
                chunk = os.read(read_end, 1 << 16)
                if not chunk:
                    break
                size += len(chunk)
                if size <= RESULT_BYTES:
                    chunks.append(chunk)
        status = None
        while status is None:  # the result is in (or the pipe was closed): the child ends at once, or by the deadline
            reaped, code = os.waitpid(pid, os.WNOHANG)
            if reaped:
                status = code
            elif time.monotonic() > deadline or killed:
                os.kill(pid, signal.SIGKILL)
                killed = killed or not chunks
                status = os.waitpid(pid, 0)[1]
            else:
                time.sleep(0.005)
    except BaseException:  # Ctrl-C while waiting: the experiment goes, the interrupt goes on
        _kill(pid)
        raise
    seconds = time.monotonic() - started
    if killed:
        return Outcome(stopped="time", reason=f"stopped at its time limit of {limit_s:.3g} s", seconds=seconds)
    if size > RESULT_BYTES:
        return Outcome(error=f"the experiment's result is over {RESULT_BYTES // 1024**2} MB", seconds=seconds)
    if chunks:
        try:
            sent = pickle.loads(b"".join(chunks))
        except Exception as exc:
            return Outcome(error=f"the experiment's result cannot be read: {type(exc).__name__}: {exc}",
                           seconds=seconds)
        outcome = Outcome(**sent)
        outcome.seconds = seconds
        if outcome.error is not None and _out_of_memory(outcome.error_type, outcome.error):
            outcome.stopped = "memory"
            outcome.reason = f"the experiment ran out of its memory budget of {_gb(budget)} ({outcome.error})"
        return outcome
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        name = signal.Signals(number).name if number in signal.valid_signals() else str(number)
        why = " (out of memory?)" if number == signal.SIGKILL else ""
        return Outcome(stopped="memory" if number == signal.SIGKILL else "signal", seconds=seconds,
                       reason=f"the experiment's process was killed by {name}{why}")
    return Outcome(stopped="signal", seconds=seconds,
                   reason=f"the experiment's process ended with status {os.WEXITSTATUS(status)} without a result")


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _out_of_memory(error_type: str | None, message: str) -> bool:
    return error_type == "MemoryError" or "can't allocate memory" in message or "std::bad_alloc" in message


def _gb(n: int) -> str:
    return f"{n / 1024**3:.1f} GB"


_DUMP_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in (?P<name>.+)$')


def _read_captures(outcome: Outcome, folder: str) -> None:
    outcome.stdout = _tail(Path(folder, "stdout"))
    outcome.stderr = _tail(Path(folder, "stderr"))
    if outcome.stopped == "time":
        outcome.stack = _dumped_stack(_tail(Path(folder, "stack")))


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - CAPTURE_BYTES, 0))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _dumped_stack(text: str) -> list[traceback.FrameSummary]:
    """faulthandler's dump (most recent call first) as frames, oldest first; the thread that ran the experiment."""
    threads: list[list[traceback.FrameSummary]] = []
    for line in text.splitlines():
        if line.startswith(("Thread ", "Current thread ")):
            threads.append([])
            continue
        found = _DUMP_FRAME.match(line)
        if found and threads:
            threads[-1].append(traceback.FrameSummary(found["file"], int(found["line"]), found["name"]))
    for frames in threads:
        if any(f.name == "_experiment" for f in frames):
            return list(reversed(frames))
    return list(reversed(threads[0])) if threads else []


# ---------------------------------------------------------------------------- child side


def _child(fn: Callable[[], Any], read_end: int, write_end: int, folder: str, allowed: list[str], budget: int,
           limit_s: float, python_random: Any, parent_cuda: bool) -> None:
    """Isolate this process, run the experiment, send the outcome, and end here whatever happens."""
    real_exit = os._exit
    code = _CHILD_EXIT_BROKEN
    try:
        os.close(read_end)
        try:
            _isolate(folder, allowed, write_end, budget, limit_s, python_random, parent_cuda)
        except BaseException as exc:  # noqa: BLE001 - an experiment that cannot be isolated does not run
            sent = {"error": f"the experiment's process could not be isolated: {type(exc).__name__}: {exc}",
                    "error_type": type(exc).__name__, "error_traceback": traceback.format_exc()[-4000:]}
        else:
            sent = _experiment(fn)
        _send(write_end, sent)
        code = _CHILD_EXIT_DONE
    except BaseException:  # noqa: BLE001 - nothing may escape into the parent's code path
        pass
    finally:
        for stream in _state.streams:  # ours only: the parent's keep data that is the parent's to write
            try:
                stream.flush()
            except Exception:
                pass
        real_exit(code)


def _experiment(fn: Callable[[], Any]) -> dict[str, Any]:
    try:
        sent: dict[str, Any] = {"value": fn()}
    except BaseException as exc:  # noqa: BLE001 - the experiment's failure is sent back as data
        reason = _fork_limit(exc)
        if reason is not None and _state.not_run is None:
            _state.not_run = (reason, traceback.extract_tb(exc.__traceback__))
        first = str(exc).strip().split("\n", 1)[0]
        sent = {"error": f"{type(exc).__name__}: {first}" if first else type(exc).__name__,
                "error_type": type(exc).__name__, "error_traceback": "".join(traceback.format_exception(exc))[-8000:]}
    if _state.not_run is not None:  # raised, or caught and made a verdict of by the probe: no verdict holds
        reason, stack = _state.not_run
        sent = {"stopped": "unavailable", "reason": reason, "stack": stack}
    sent.update(refused=list(_state.refused), saves=list(_state.saves), redirected=list(_state.redirected))
    return sent


def _fork_limit(exc: BaseException) -> str | None:
    """Why the experiment could not run in a fork, when the exception or one it was raised from or during says so:
    CUDA reached from a child of a CUDA process, or a backward refused by autograd's engine."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        try:
            text = str(current)
        except Exception:  # a user exception whose __str__ fails says nothing about the fork
            text = ""
        if AUTOGRAD_FORK_MESSAGE in text:
            return BACKWARD_AFTER_FORK
        if _state.parent_cuda and (BAD_FORK_MESSAGE in text or CUDA_INIT_ERROR in text):
            return CUDA_AFTER_FORK
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def call_here(fn: Callable[[], Any]) -> Outcome:
    """fn() in this process, with its exception turned into data as in a child (for work that runs no user code)."""
    started = time.monotonic()
    outcome = Outcome(**_experiment(fn))
    outcome.seconds = time.monotonic() - started
    return outcome


def _send(write_end: int, sent: dict[str, Any]) -> None:
    try:
        data = pickle.dumps(sent, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        data = pickle.dumps({"error": f"the experiment's result cannot be sent back: {type(exc).__name__}: {exc}",
                             "error_type": type(exc).__name__, "refused": list(_state.refused)})
    view = memoryview(data)
    while view:
        written = os.write(write_end, view)
        view = view[written:]
    os.close(write_end)


def _isolate(folder: str, allowed: list[str], write_end: int, budget: int, limit_s: float, python_random: Any,
             parent_cuda: bool) -> None:
    _state.active = True
    _state.parent_cuda, _state.not_run = parent_cuda, None
    # No automatic collection here: the garbage inherited from the run would be finalized in this process, acting on
    # the run's resources (its temporary folders, connections), refused, and reported through the run's own
    # unraisable hook (a test runner's formats a traceback, whose ast.parse inside another parse's tree-building
    # breaks CPython 3.11's AST builder: "AST constructor recursion depth mismatch", gh-106905).
    gc.disable()
    sys.unraisablehook = sys.__unraisablehook__
    _state.refused, _state.saves, _state.redirected = [], [], []
    stack_file = open(os.path.join(folder, "stack"), "w")  # noqa: SIM115 - faulthandler keeps it to the end
    _private_fds(folder, keep={write_end, stack_file.fileno()})
    _fresh_std_streams()
    faulthandler.enable(file=stack_file)  # a crash of the experiment is written here, not in the run's crash file
    faulthandler.dump_traceback_later(max(limit_s, 0.01), file=stack_file)
    os.chdir(_mirror_working_folder(folder))
    os.environ["TMPDIR"] = folder
    tempfile.tempdir = folder
    sys.dont_write_bytecode = True
    import random

    random.setstate(python_random)
    _limit_memory(budget)
    _stub_torch()
    if parent_cuda:
        _note_cuda_starts()
    _note_backward_refusals()
    roots = [os.path.realpath(folder)] + [os.path.realpath(a) for a in allowed]
    _shadow_writes(folder, roots)
    os._exit = _refuse_exit  # no audit event exists for it: the experiment gets an exception instead
    posix = sys.modules.get("posix")
    if posix is not None:
        posix._exit = _refuse_exit
    sys.addaudithook(_audit_hook(roots))


def _mirror_working_folder(folder: str) -> str:
    """A working folder of the child's own whose entries link to the run's: `open("data/train.csv")` and
    `os.path.exists("ckpt.pt")` in the replayed code find the user's files, a new relative file is made in the
    child's folder, and a write to a linked file resolves outside it (the shadow copy or the audit hook's refusal)."""
    mirror = os.path.join(folder, "cwd")
    os.mkdir(mirror)
    try:
        entries = os.scandir(os.getcwd())
    except OSError:  # the run's working folder was deleted or is unreadable: nothing to link
        return mirror
    with entries:
        for count, entry in enumerate(entries):
            if count >= MIRRORED_ENTRIES:
                break
            try:
                os.symlink(entry.path, os.path.join(mirror, entry.name))
            except OSError:
                continue
    return mirror


def _private_fds(folder: str, keep: set[int]) -> None:
    """Give the child descriptors of its own: a write, a read or a seek through a shared one would reach the parent."""
    import fcntl

    stdout = os.open(os.path.join(folder, "stdout"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    stderr = os.open(os.path.join(folder, "stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    keep = keep | {0, 1, 2, stdout, stderr, null}
    for fd in _open_fds():
        if fd in keep:
            continue
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            info = os.fstat(fd)
        except OSError:
            continue
        reopened = None
        if stat.S_ISREG(info.st_mode) and flags & os.O_ACCMODE == os.O_RDONLY:
            try:  # a Dataset's open file: the same file, at the same place, with an offset of its own
                reopened = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
                os.lseek(reopened, os.lseek(fd, 0, os.SEEK_CUR), os.SEEK_SET)
            except OSError:
                reopened = None
        os.dup2(reopened if reopened is not None else null, fd, inheritable=os.get_inheritable(fd))
        if reopened is not None:
            os.close(reopened)
    for fd in (stdout, stderr, null):
        os.close(fd)


def _open_fds() -> list[int]:
    for listing in ("/proc/self/fd", "/dev/fd"):
        try:
            return sorted(int(name) for name in os.listdir(listing))
        except (OSError, ValueError):
            continue
    return list(range(3, 1024))


def _fresh_std_streams() -> None:
    """New stdio objects on the captured descriptors; the parent's keep their unflushed data, never written here."""
    sys.stdin = open(0, "r", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    _state.streams = [sys.stdout, sys.stderr]


def _limit_memory(budget: int) -> None:
    """Cap the address space at what the child inherits plus `budget`: a runaway allocation fails in the child."""
    try:
        import resource

        with open("/proc/self/status", encoding="ascii") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = size + budget
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (OSError, ValueError, StopIteration, ImportError):
        pass


def _stub_torch() -> None:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    _state.parent_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # libgomp's pool does not survive fork: a second thread would wait forever

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        _state.saves.append(str(getattr(f, "name", f)))

    torch.save = save
    serialization = sys.modules.get("torch.serialization")
    if serialization is not None:
        serialization.save = save
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None:
        for name in _DISTRIBUTED:
            if hasattr(distributed, name):
                setattr(distributed, name, _collective(name))


def _note_cuda_starts() -> None:
    """Note where the experiment first meets torch's bad-fork error, which any start of CUDA raises in this child:
    the experiment may catch that error and read it as the user's failure, so the note, not its verdict, decides.

    torch starts CUDA through `torch.cuda._lazy_init`, looked up by name from C++ (a CUDA tensor, `.to("cuda")`) and
    imported by name into torch.cuda's own modules; each of those names is wrapped."""
    original = getattr(sys.modules.get("torch.cuda"), "_lazy_init", None)
    if original is None:
        return
    lazy_init_noted = _noting(original, BAD_FORK_MESSAGE, CUDA_AFTER_FORK)
    for name, module in list(sys.modules.items()):
        if (name == "torch.cuda" or name.startswith("torch.cuda.")) and getattr(module, "_lazy_init", None) is original:
            module._lazy_init = lazy_init_noted


def _note_backward_refusals() -> None:
    """Note where autograd's engine first refuses a backward in this child (see AUTOGRAD_FORK_MESSAGE): a fix trial
    catches the error and would report the fix as failing. backward() and autograd.grad() both run the engine
    through `_engine_run_backward`, imported by name into torch.autograd from torch.autograd.graph."""
    graph = sys.modules.get("torch.autograd.graph")
    original = getattr(graph, "_engine_run_backward", None)
    if original is None:
        return
    engine_run_backward_noted = _noting(original, AUTOGRAD_FORK_MESSAGE, BACKWARD_AFTER_FORK)
    for module in (graph, sys.modules.get("torch.autograd")):
        if getattr(module, "_engine_run_backward", None) is original:
            module._engine_run_backward = engine_run_backward_noted


def _noting(original: Callable[..., Any], marker: str, reason: str) -> Callable[..., Any]:
    """`original`, noting in `_state.not_run` where it first raises a RuntimeError that says `marker` (the experiment
    could not run in a fork, for `reason`), then raising it on."""

    def noted(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except RuntimeError as exc:
            if _state.not_run is None and marker in str(exc):
                _state.not_run = (reason, traceback.extract_stack()[:-1])
            raise

    return noted


def _collective(name: str) -> Callable[..., Any]:
    def alone(*args: Any, **kwargs: Any) -> Any:
        """What the collective does in a group of one rank: the tensors stay as they are."""
        return None

    alone.__name__ = name
    return alone


def _shadow_writes(folder: str, roots: list[str]) -> None:
    """Send the experiment's Python-level file writes outside its folder to a shadow copy inside it.

    A log line in `forward` should not stop the experiment short of the failure it is testing: the write lands
    in `<folder>/shadow/<the same path>` (which starts as a copy of the file, for appends and updates). What
    opens files some other way meets the audit hook's refusal."""
    import builtins
    import io

    original_open, original_os_open = io.open, os.open
    shadow_root = os.path.join(folder, "shadow")

    def shadow(path: Any, writes: bool, keeps_content: bool) -> Any:
        if not writes or isinstance(path, int) or _inside(path, roots):
            return path
        real = os.path.realpath(os.fsdecode(path))
        target = os.path.join(shadow_root, real.lstrip(os.sep))
        if not os.path.exists(target):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if keeps_content and os.path.isfile(real) and os.path.getsize(real) <= SHADOW_COPY_BYTES:
                shutil.copyfile(real, target)
            _state.redirected.append(real)
        return target

    def open_shadowed(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        writes = isinstance(mode, str) and any(c in mode for c in "wax+")
        return original_open(shadow(file, writes, "a" in mode or "+" in mode), mode, *args, **kwargs)

    def os_open_shadowed(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        keeps = not flags & os.O_TRUNC
        return original_os_open(shadow(path, bool(flags & _WRITE_FLAGS), keeps), flags, *args, **kwargs)

    io.open = builtins.open = open_shadowed
    os.open = os_open_shadowed


def _inside(path: Any, roots: list[str]) -> bool:
    if isinstance(path, int):
        return path in (1, 2)  # the captured stdout and stderr
    try:
        real = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return real == os.path.realpath(os.devnull) or any(real == root or real.startswith(root + os.sep)
                                                       for root in roots)


def _refuse_exit(status: int = 0) -> None:
    _state.refused.append(f"end the process (os._exit({status}))")
    raise Refused(errno.EPERM, f"triage's experiment refused os._exit({status}): an experiment cannot end the run")


def _audit_hook(roots: list[str]) -> Callable[[str, tuple], None]:
    def inside(path: Any) -> bool:
        return _inside(path, roots)

    def refuse(what: str) -> None:
        _state.refused.append(what)
        raise Refused(errno.EPERM, f"triage's experiment refused to {what}")

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writes and not inside(path):
                refuse(f"write {os.fsdecode(path) if not isinstance(path, int) else f'descriptor {path}'}")
        elif event in _PATH_EVENTS:
            paths = args[:2] if event in _TWO_PATH_EVENTS else args[:1]
            for path in paths:
                if path is not None and path != ":memory:" and not inside(path):
                    refuse(f"{event.split('.', 1)[1]} {path}")
        elif event in _REFUSED_EVENTS:
            refuse(_REFUSED_EVENTS[event])

    return hook
