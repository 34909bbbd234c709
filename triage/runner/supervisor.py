"""The supervising parent: fork the child that runs the script, forward signals, watch for hangs, report deaths.

Standard library only until there is something to report. The parent blocks
the signals it forwards and collects them with sigtimedwait. The child stays
in the parent's process group (job control and Ctrl-C work as for python), so
a signal sent to the group (the terminal's Ctrl-C, `timeout`, `kill -- -PGID`,
SLURM, systemd) reaches both, and the parent forwards one only when the child
did not get it: the child has it pending, or reported receiving it. The child
reports through CPython's signal wakeup fd, which the interpreter's C-level
handler writes the signal number to the moment a signal with a Python handler
arrives. At the end the parent exits with the child's status, and for a death
by signal dies of the same signal, so the shell shows what it shows for python.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import deque
from typing import NoReturn

from .channel import PHASE_TRIAGING, STATUS, Beat, Channel
from .options import RunOptions, interpreter_argv

SI_KERNEL = 0x80  # si_code of a signal the kernel generated (the terminal's Ctrl-C, Ctrl-\, hangup)
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)
FORWARDED_SIGNALS = TERMINAL_SIGNALS + (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
CRASH_SIGNALS = frozenset(
    getattr(signal, name) for name in ("SIGSEGV", "SIGBUS", "SIGABRT", "SIGFPE", "SIGILL", "SIGSYS", "SIGTRAP", "SIGKILL", "SIGXCPU")
    if hasattr(signal, name)
)  # fmt: skip
EXIT_HANG_KILLED = 124
KILL_GRACE_S = 3.0
RECEIPT_MAX_AGE_S = 1.0  # a receipt this old is of another signal than the one the parent just got
RECEIPT_SETTLE_S = 0.002  # between the child dequeuing a signal and its handler writing the receipt


class Supervisor:
    """Runs one script under triage and ends this process with the script's exit status (or its signal)."""

    def __init__(self, options: RunOptions) -> None:
        self.options = options
        self.channel: Channel | None = None
        self.child_pid = 0
        self.hang_killed = False
        self._reporter = None
        self._last_seq = -1
        self._last_change = time.monotonic()
        self._reported_seq: int | None = None
        self._oom_before: int | None = None
        self._stderr_file = None  # the log file stderr goes to: a native crash's last words are read back from it
        self.config_for_reports: dict = {}
        self._receipts_fd = -1
        self._receipts: deque[tuple[int, float]] = deque()  # (signal, when read) the child reported receiving

    def config(self) -> dict:
        options = self.options
        cwd = os.getcwd()
        return _in_job({
            "target": options.target,
            "module": options.module,
            "args": list(options.args),
            "report_dir": os.path.abspath(options.report_dir) if options.report_dir else None,
            "report_root": os.path.join(cwd, "triage-reports"),
            "label": options.label + (f"-rank{rank}" if (rank := os.environ.get("RANK", "")).isdigit() else ""),
            "run_id": f"{os.getpid()}-{time.time_ns()}",
            "json": os.path.abspath(options.json) if options.json else None,
            "probes": options.probes,
            "rules": [os.path.abspath(path) for path in options.rules],
            "cwd": cwd,
            "hang_timeout": options.hang_timeout,
            "replay": os.path.abspath(options.replay) if options.replay else None,
            "color": options.color,
        })

    def run(self) -> NoReturn:
        try:
            config = self.config()
            self.channel = Channel.create()
        except Exception as exc:  # no temporary folder, no triage: the script still runs
            _internal_error(exc, "preparing the run")
            _exec_plain_python(self.options)
        watched = {signal.SIGCHLD} | {sig for sig in FORWARDED_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}
        previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
        self._oom_before = oom_kill_count()
        from ..capture.stderr_file import StderrFile

        self._stderr_file = StderrFile.at_start()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        parent = os.getpid()
        receipts_read, receipts_write = _receipt_pipe()
        try:
            pid = os.fork()
        except OSError as exc:  # out of processes or memory for a second one
            signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
            self.channel.remove()
            _internal_error(exc, "starting the child")
            _exec_plain_python(self.options)
        if pid == 0:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
            _die_with_parent(parent)
            _report_signal_receipts(receipts_read, receipts_write)
            self._become_child(config)
        if receipts_write >= 0:
            os.close(receipts_write)
        self._receipts_fd = receipts_read
        self.child_pid = pid
        config["child_pid"] = pid
        self.config_for_reports = config
        try:
            status = self._supervise(watched)
        except BaseException as exc:  # the parent must outlive the child whatever happens to it
            _internal_error(exc, "supervising the script")
            status = _wait(pid)
        code = os.waitstatus_to_exitcode(status)
        try:
            code = self._after_exit(code)
        except Exception as exc:
            _internal_error(exc, "reporting how the script died")
        finally:
            if config.get("job_dir"):  # a rank of a torchrun job: how it ended, into the job's folder
                try:
                    from .launcher import on_rank_exit

                    on_rank_exit(config, code, self.channel)
                except Exception as exc:
                    _internal_error(exc, "recording the rank's end")
            self.channel.remove()
        if self.hang_killed:
            code = EXIT_HANG_KILLED
        if code < 0:
            _die_of(-code)
        _exit_now(code)

    def _become_child(self, config: dict) -> NoReturn:
        options = self.options
        try:
            from .child import run_child
        except BaseException as exc:  # triage itself is broken: run the script as plain python would
            _internal_error(exc, "starting the child")
            _exec_plain_python(options)
        try:
            run_child(options.target, options.module, options.args, self.channel, config, self._stderr_file)
        except SystemExit:
            raise
        except BaseException as exc:  # never reached by design; the frames above (cli.main) must not see it
            _internal_error(exc, "ending the script")
            raise SystemExit(1) from None

    def _supervise(self, watched: set[int]) -> int:
        timeout = self.options.hang_timeout
        tick = min(1.0, max(0.05, timeout / 4)) if timeout > 0 else 1.0
        while True:
            info = signal.sigtimedwait(watched, tick)
            if info is not None and info.si_signo != signal.SIGCHLD:
                self._forward(info)
            self._read_receipts()  # keep the pipe drained; receipts of signals the parent never got age out
            done, status = os.waitpid(self.child_pid, os.WNOHANG)
            if done:
                return status
            if timeout > 0 and not self.hang_killed:
                try:
                    self._check_progress(timeout)
                except Exception as exc:
                    _internal_error(exc, "checking for a hang")

    def _forward(self, info) -> None:
        """Send the child a signal the parent got, unless the child got it too (sent to the whole group)."""
        if info.si_signo in TERMINAL_SIGNALS and info.si_code == SI_KERNEL:
            self._take_receipt(info.si_signo)
            return  # the terminal sent it to the whole foreground group, the child included
        if self._child_received(info.si_signo):
            return
        try:
            os.kill(self.child_pid, info.si_signo)
        except ProcessLookupError:
            pass

    def _child_received(self, signum: int) -> bool:
        """Whether the child got this signal itself: it reported it, or it is still pending there.

        Receipts are read before and after the pending set, so a signal the child dequeues
        between the two reads is still seen. A signal the child leaves to its default action
        (death) or ignores sends no receipt; forwarding it then changes nothing.
        """
        if self._take_receipt(signum) or signum in pending_signals(self.child_pid):
            return True
        time.sleep(RECEIPT_SETTLE_S)
        return self._take_receipt(signum)

    def _take_receipt(self, signum: int) -> bool:
        self._read_receipts()
        now = time.monotonic()
        while self._receipts and now - self._receipts[0][1] > RECEIPT_MAX_AGE_S:
            self._receipts.popleft()
        for index, (number, _when) in enumerate(self._receipts):
            if number == signum:
                del self._receipts[index]
                return True
        return False

    def _read_receipts(self) -> None:
        if self._receipts_fd < 0:
            return
        now = time.monotonic()
        while True:
            try:
                data = os.read(self._receipts_fd, 4096)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if not data:
                return
            self._receipts.extend((number, now) for number in data if number in _FORWARDED_NUMBERS)

    def _check_progress(self, timeout: float) -> None:
        beat = self.channel.read_beat()
        now = time.monotonic()
        if beat.seq != self._last_seq:
            self._last_seq = beat.seq
            self._last_change = now
            return
        if not beat.armed or self._reported_seq == beat.seq or now - self._last_change < timeout:
            return
        self._reported_seq = beat.seq
        try:
            self._report_hang(beat, now - self._last_change)
        finally:  # a report that fails (a closed stderr) must not keep a run the user asked to stop
            if self.options.on_hang == "kill":
                self.hang_killed = True
                kill_tree(self.child_pid)

    def reporter(self):
        if self._reporter is None:
            from .pipeline import Reporter

            self._reporter = Reporter(self.config_for_reports)
        return self._reporter

    def _report_hang(self, beat: Beat, stalled: float) -> None:
        from .postmortem import collect_stacks, hang_incident

        started = time.monotonic()
        stacks = collect_stacks(self.channel, self.child_pid)
        incident, texts = hang_incident(self.channel, stacks, beat, stalled, self.options.hang_timeout)
        timeout = self.options.hang_timeout
        lead = f"triage: no progress for {stalled:.0f} s (--hang-timeout {timeout:g}): the run looks hung."
        lead += " Stopping it (--on-hang kill)." if self.options.on_hang == "kill" else " It keeps running."
        lead += "".join(f"\n  - {line}" for line in incident.facts.get("hang_summary", []))
        self.reporter().handle(incident, texts=texts, lead_in=lead, timings={"capture_s": time.monotonic() - started})

    def _after_exit(self, code: int) -> int:
        """Report a death by signal; returns the exit status to end with."""
        if code >= 0 or self.hang_killed:
            return code
        signum = -code
        status = self.channel.read_json(STATUS) or {}
        promised = status.get("exit_code")
        if isinstance(promised, int) and self.channel.read_beat().phase == PHASE_TRIAGING:
            # The script had already ended with its exception; triage's own work (a probe re-running the
            # failing code) killed the process. The script's status stands.
            _internal_error(RuntimeError(f"the process died of {signal.Signals(signum).name} while triage examined "
                                         "the failure (a probe re-ran code that killed it)"), "examining the failure")
            return promised
        if signum not in CRASH_SIGNALS or status.get("handled") == "interrupt":
            return code
        from .postmortem import crash_incident

        started = time.monotonic()
        incident, texts = crash_incident(self.channel, signum, self._oom_before, oom_kill_count(), self._stderr_file)
        dump = texts.get("crash.txt", "").strip()
        if dump:
            sys.stderr.write(dump + "\n")
        self.reporter().handle(incident, texts=texts, timings={"capture_s": time.monotonic() - started})
        return code


_FORWARDED_NUMBERS = frozenset(int(number) for number in FORWARDED_SIGNALS)


def _receipt_pipe() -> tuple[int, int]:
    """A non-blocking pipe for the child's signal receipts; (-1, -1) where one cannot be made."""
    try:
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)  # set_wakeup_fd requires it: a full pipe must not block a signal handler
        return read, write
    except OSError:
        return -1, -1


def _report_signal_receipts(read: int, write: int) -> None:
    """In the child: have the interpreter write the number of each signal it receives to the parent's pipe."""
    if read >= 0:
        os.close(read)
    if write < 0:
        return
    try:
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(write)


def pending_signals(pid: int) -> set[int]:
    """Signals pending for a process (its own and its main thread's), from /proc; empty when unreadable."""
    found: set[int] = set()
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(("SigPnd:", "ShdPnd:")):
                    mask = int(line.split(":", 1)[1].strip(), 16)
                    found.update(number + 1 for number in range(64) if mask >> number & 1)
    except (OSError, ValueError):
        pass
    return found


def _in_job(config: dict) -> dict:
    """A rank of a torchrun job reports into the job's shared folder (see launcher.rank_config)."""
    from .jobdir import job_dir

    if job_dir() is None:
        return config
    from .launcher import rank_config

    return rank_config(config)


def _die_with_parent(parent: int) -> None:
    """In the child: if the supervising parent is killed (kill -9, the OOM killer), go too, as plain python would."""
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


def kill_tree(pid: int) -> None:
    """Stop the child and every process below it: SIGTERM, then SIGKILL for those still there."""
    from .postmortem import descendants

    family = [pid] + descendants(pid)
    for member in family:
        _signal(member, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline and any(_alive(member) for member in family[1:]):
        time.sleep(0.05)
    for member in family[1:]:
        _signal(member, signal.SIGKILL)
    _signal(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().split(b") ", 1)[-1][:1] not in (b"Z", b"X")
    except OSError:
        return False


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def oom_kill_count() -> int | None:
    """OOM kills so far in this cgroup (v2), else system-wide; None where neither can be read."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("0::"):
                    path = "/sys/fs/cgroup" + line[3:].strip()
                    with open(os.path.join(path, "memory.events"), encoding="utf-8") as events:
                        for event in events:
                            if event.startswith("oom_kill "):
                                return int(event.split()[1])
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/vmstat", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _exit_now(code: int) -> NoReturn:
    """The parent has nothing left to clean up: skip the interpreter's finalization (tens of milliseconds)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code & 0xFF if code >= 0 else 1)


def _die_of(signum: int) -> NoReturn:
    """End this process by `signum`, as the child ended, so the shell reports the same death."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if signum not in (signal.SIGKILL, signal.SIGSTOP):
        try:
            import resource

            # The child's core dump (if any) is the useful one; the parent's would only mislead.
            soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
            resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
        except (ImportError, ValueError, OSError):
            pass
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    time.sleep(1.0)
    os._exit(128 + signum)


def _exec_plain_python(options: RunOptions) -> NoReturn:
    command = interpreter_argv() + (["-m", options.target] if options.module else [options.target]) + list(options.args)
    os.execv(sys.executable, command)


def _wait(pid: int) -> int:
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except InterruptedError:
            continue
        except ChildProcessError:
            return 0


def _internal_error(exc: BaseException, doing: str) -> None:
    """One line on stderr (the whole traceback and exit status 70 under TRIAGE_DEBUG); never raises."""
    try:
        if os.environ.get("TRIAGE_DEBUG"):
            import traceback

            sys.stderr.write(f"triage: internal error while {doing} (TRIAGE_DEBUG is set):\n")
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
            sys.stderr.flush()
            os._exit(70)
        sys.stderr.write(f"triage: internal error while {doing}: {type(exc).__name__}: {exc} (TRIAGE_DEBUG=1 for details)\n")
    except Exception:
        pass
