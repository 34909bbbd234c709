"""The child side of the runner: run the script as plain `python` would, and triage what kills it while it is alive.

The child is forked from the supervising parent, so it starts with no second
interpreter start-up. It makes `sys.argv`, `sys.path[0]`, `__main__` and the
exit status what `python SCRIPT` gives, prints the original traceback without
runpy or triage frames, and only then captures, diagnoses and reports.
"""

from __future__ import annotations

import atexit
import faulthandler
import marshal
import mmap
import os
import re
import signal
import sys
import threading
import time
import types
from typing import Any, NoReturn

from .. import tracking
from ..capture.stderr_file import StderrFile
from ..tracking import TRACKER
from .channel import CRASH_DUMP, DUMP_SIGNAL, PHASE_EXITING, PHASE_RUNNING, PHASE_TRIAGING, STACK_DUMP, STATUS, WORKERS, Channel
from .options import STDIN_SCRIPT, interpreter_argv
from .hooks import Heartbeat, TorchHooks, TorchImportWatcher, WarningRecorder

EXIT_INTERNAL_DEBUG = 70
# Address space held while the script runs and given back the moment it ends: a script that dies of exhausting its
# limit (`ulimit -v`, a Python MemoryError) leaves none for the user's traceback and the report otherwise. Never
# written, so it costs no resident memory.
MEMORY_RESERVE_BYTES = 64 * 1024**2


# Messages of errors that a NaN/Inf (or an overflow) causes downstream: an invalid distribution parameter, a
# probability outside [0, 1], multinomial's check, math.exp's overflow.
NONFINITE_CONSEQUENCE = re.compile(r"(?i)\bnan\b|\binf\b|infinite|non-?finite|invalid values|between 0 and 1"
                                   r"|probabilit|range error|overflow")

class Session:
    """Triage's state inside the child: heartbeat, crash files, hooks and the reporter."""

    def __init__(self, channel: Channel, config: dict[str, Any], stderr_file: StderrFile | None = None) -> None:
        self.channel = channel
        self.config = config
        self.pid = os.getpid()
        self._reporter = None
        self.heartbeat: Heartbeat | None = None
        self.warnings = WarningRecorder()
        self.debug = bool(os.environ.get("TRIAGE_DEBUG"))
        self._said: set[str] = set()
        self._files: list = []
        self.handled: str | None = None
        self.exit_code: int | None = None
        # At the script's normal end (ended_cleanly): a signal during the interpreter's shutdown is read by them.
        self.ended_cleanly = False
        self.process_group_alive = False
        # the log file stderr goes to (the supervisor's reading, from before the fork): read back at a CUDA error
        self.stderr_file = stderr_file

    def start(self) -> None:
        tracking.capture_owner = "runner"  # install() and watch() leave uncaught exceptions to us
        self.heartbeat = Heartbeat(self.channel)
        TRACKER.listeners.append(self.heartbeat.on_progress)
        # faulthandler writes from the signal handler to files opened now; forked workers inherit them.
        crash = open(self.channel.file(CRASH_DUMP), "a", encoding="utf-8")
        stacks = open(self.channel.file(STACK_DUMP), "a", encoding="utf-8")
        self._files += [crash, stacks]
        faulthandler.enable(file=crash, all_threads=True)
        faulthandler.register(DUMP_SIGNAL, file=stacks, all_threads=True, chain=False)
        if self.config.get("job_dir"):
            # torchrun's agent stops a rank with SIGTERM to its process group: dump where it was, then die of it
            # (faulthandler chains to the default action), so the rank's exit stays -15.
            faulthandler.register(signal.SIGTERM, file=stacks, all_threads=True, chain=True)
        self._install_thread_hook()
        self.warnings.install()
        TorchImportWatcher(self._torch_imported).install()

    @property
    def reporter(self):
        if self._reporter is None:  # imported on the first incident: a run that succeeds never pays for it
            from .pipeline import Reporter

            self._reporter = Reporter(self.config)
        return self._reporter

    def begin_user_code(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.start()

    def set_phase(self, phase: int) -> None:
        """Leaving user code: what follows (a report, the interpreter's exit) is not the run hanging."""
        if self.heartbeat is not None and os.getpid() == self.pid:
            try:
                self.heartbeat.set_phase(phase)
            except Exception:
                pass

    def _torch_imported(self) -> None:
        """Right after the script's `import torch`: replay, the wrapper's tracking and NaN checks, the runner's hooks."""
        replay = self.config.get("replay")
        if replay:
            self._start_replay(replay)
        feed_tracker = True
        try:
            from .. import loss_watch

            loss_watch.start()  # first: the NaN check and the health checks feed its loss trend
        except Exception as exc:
            self.internal_error(exc, "starting the loss trend")
        try:
            from .. import wrapper

            wrapper.incident_handler = self.report_incident  # NaN/Inf incidents get the runner's report folder
            wrapper.auto_track(TRACKER)  # batches and steps into the Tracker, gradients checked for NaN/Inf
            feed_tracker = False
        except Exception as exc:
            self.internal_error(exc, "starting the NaN/Inf checks")
        try:
            from .. import health

            health.start(TRACKER)  # loss, gradients and memory per backward(): judged when the run ends
        except Exception as exc:
            self.internal_error(exc, "starting the training-health checks")
        try:
            on_error = lambda exc: self.internal_error(exc, "tracking progress")  # noqa: E731
            TorchHooks(TRACKER, self.heartbeat, self.channel, on_error, feed_tracker=feed_tracker).install()
        except Exception as exc:
            self.internal_error(exc, "installing the progress hooks")

    def _start_replay(self, path: str) -> None:
        try:
            from ..replay import ReplayError, feed_first, load_replay

            try:
                replay = load_replay(path)
            except ReplayError as exc:
                sys.stderr.write(f"triage: cannot replay: {exc}\n")
                return
            feed_first(replay)
            where = f"batch {replay.batch_index}" if replay.batch_index is not None else "the saved batch"
            sys.stderr.write(f"triage: replaying {where} from {replay.path} as the first batch\n")
        except Exception as exc:
            self.internal_error(exc, "starting the replay")

    def _install_thread_hook(self) -> None:
        previous = threading.excepthook
        session = self

        def excepthook(args) -> None:
            previous(args)
            if args.exc_type is SystemExit or args.exc_value is None:
                return
            thread = args.thread.name if args.thread is not None else "unknown"
            session.report_exception(args.exc_value, args.exc_traceback, thread_name=thread, exit_code=None)

        threading.excepthook = excepthook

    def _kernel_assertions(self, exc: BaseException) -> list[str]:
        """After a CUDA error, the kernel assertions the run wrote to its stderr log (the check that failed)."""
        if self.stderr_file is None or "CUDA error" not in str(exc):
            return []
        return self.stderr_file.kernel_assertions()

    def report_exception(self, exc: BaseException, tb, *, thread_name: str | None = None, exit_code: int | None = 1) -> None:
        """Capture → diagnose → probes → report folder → summary. Never raises (outside TRIAGE_DEBUG)."""
        if os.getpid() != self.pid:
            return  # a forked copy of the script (os.fork) is not the run being triaged
        try:
            started = time.monotonic()
            from ..capture.live import capture_exception

            dead = self._dead_workers(patient=isinstance(exc, (ConnectionError, EOFError)))
            log_lines = self._kernel_assertions(exc) + list(self.warnings.lines) + self._worker_crash_lines()
            log_lines += [line for _, line in dead]
            log_lines += self._nonfinite_history(TRACKER, exc)
            live = capture_exception(exc, tb, tracker=TRACKER, thread_name=thread_name, exit_code=exit_code, log_lines=log_lines)
            if dead:
                live.incident.facts["dead_workers"] = [info for info, _ in dead]
            self._add_nonfinite_facts(live.incident.facts)
            timings = {"capture_s": time.monotonic() - started}
            self.reporter.handle(live.incident, live=live, exception=exc, tracker=TRACKER, timings=timings)
            self.handled = "exception"
            self.write_status()
        except KeyboardInterrupt:
            pass  # Ctrl-C during the report: the user wants out, with the script's own exit status
        except Exception as error:
            self.internal_error(error, "triaging the exception")

    def _nonfinite_history(self, tracker, exc: BaseException) -> list[str]:
        """What the loss trend and the NaN check saw before this exception, when its message is about NaN/Inf or an
        invalid value: a crash in an op that rejects them (binary_cross_entropy, Categorical, multinomial, math.exp)
        is often the consequence of a loss that diverged earlier, or of a NaN born steps before."""
        from .. import loss_watch

        self._nonfinite_facts = {}
        if not NONFINITE_CONSEQUENCE.search(str(exc)):
            return []
        try:
            model = tracker.model
            if model is None and tracker.optimizer is not None:
                from ..probes.runner import _model_from_optimizer

                model = _model_from_optimizer(tracker.optimizer)
            trend, lines = loss_watch.evidence(tracker.optimizer, model)
        except Exception as error:
            self.internal_error(error, "reading the loss trend")
            return []
        if trend:
            self._nonfinite_facts["loss_trend"] = trend
        origin = loss_watch.ORIGIN or self._origin_of(exc)
        if origin:
            self._nonfinite_facts["nan_origin"] = origin
            lines.append(f"triage: NaN/Inf origin {origin['found_at']}: {origin['line']}")
        return lines

    def _origin_of(self, exc: BaseException) -> dict | None:
        """No NaN check fired before this crash: replay the failing step's statements in an experiment's child to
        find the torch call that made the value the crash rejects (probes/nonfinite.py)."""
        try:
            from ..context import ProbeContext
            from ..incident import Incident
            from ..probes.nonfinite import find_origin
            from ..probes.source_step import user_frames

            ctx = ProbeContext(incident=Incident(kind="exception", source="run"), exception=exc, time_limit_s=20.0)
            origin, replayed = find_origin(user_frames(exc), include_failing=True, ctx=ctx)
        except Exception as error:
            self.internal_error(error, "replaying the failing step for the NaN/Inf origin")
            return None
        if origin is None:
            return None
        return {**origin.facts(), "found_at": "in the failing step", "replayed": replayed, "line": origin.line()}

    def _add_nonfinite_facts(self, facts: dict) -> None:
        facts.update(getattr(self, "_nonfinite_facts", {}))

    def report_incident(self, incident, tracker) -> None:
        """An incident with no exception (NaN/Inf from the wrapper's checks): report it, and training goes on."""
        if os.getpid() != self.pid:
            return
        self.set_phase(PHASE_TRIAGING)
        try:
            started = time.monotonic()
            from ..capture.environment import environment, launcher_rank

            incident.environment = incident.environment or environment()
            incident.rank = incident.rank if incident.rank is not None else launcher_rank()
            self.reporter.handle(incident, tracker=tracker, timings={"capture_s": time.monotonic() - started})
            self.write_status()
        except Exception as error:
            self.internal_error(error, "triaging the non-finite values")
        finally:
            self.set_phase(PHASE_RUNNING)

    def report_health(self) -> None:
        """The script finished: a run that did not learn, diverged or leaked gets a `silent` report (exit status kept)."""
        if os.getpid() != self.pid or "torch" not in sys.modules:
            return
        from .. import health

        if health.MONITOR is None or (self._reporter is not None and self._reporter.folders):
            return  # a run already reported (NaN/Inf) gets no second, consequential report
        try:
            main = sys.modules.get("__main__")
            incident = health.silent_incident(health.MONITOR, TRACKER.steps, getattr(main, "__dict__", None))
        except Exception as error:
            self.internal_error(error, "judging the training health")
            return
        if incident is not None:
            self.report_incident(incident, TRACKER)

    def _dead_workers(self, patient: bool = False) -> list[tuple[dict, str]]:
        """DataLoader workers that already died, and how (read without reaping them, as torch's own check does).

        A worker killed mid-batch often surfaces first as a ConnectionResetError
        in the main process, while the worker is still being torn down; torch's
        SIGCHLD check, which names the signal, may not have run yet. `patient`
        waits up to a fifth of a second for such a death. The line is torch's
        wording for the same event.
        """
        workers = self.channel.read_json(WORKERS) or {}
        for attempt in range(6 if patient and workers else 1):
            found = self._dead_workers_now(workers)
            if found:
                return found
            if attempt < 5:
                time.sleep(0.04)
        return []

    @staticmethod
    def _dead_workers_now(workers: dict) -> list[tuple[dict, str]]:
        found = []
        for pid_text, info in workers.items():
            try:
                status = os.waitid(os.P_PID, int(pid_text), os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except (ChildProcessError, OSError, ValueError):
                continue
            if status is None:
                continue
            worker = {"worker": info.get("worker"), "pid": int(pid_text)}
            if status.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
                try:
                    worker["signal"] = signal.Signals(status.si_status).name
                except ValueError:
                    worker["signal"] = str(status.si_status)
                line = f"DataLoader worker (pid {pid_text}) is killed by signal: {signal.strsignal(status.si_status)}. "
            elif status.si_status:
                worker["exit_code"] = status.si_status
                line = f"DataLoader worker (pid {pid_text}) exited unexpectedly with exit code {status.si_status}."
            else:
                continue
            found.append((worker, line))
        return found

    def _worker_crash_lines(self) -> list[str]:
        """faulthandler output from DataLoader workers that died of a fatal signal (they share the crash file)."""
        text = self.channel.read_text(CRASH_DUMP, limit=64 * 1024)
        return [line for line in text.splitlines() if line.strip()][:200]

    def promise_exit(self, code: int) -> None:
        """The script has ended with `code`: should triage's own work kill the process, the parent exits with it."""
        self.exit_code = code
        self.write_status()

    def write_status(self) -> None:
        try:
            reports = self._reporter.folders if self._reporter is not None else []
            self.channel.write_json(STATUS, {"handled": self.handled, "reports": reports, "exit_code": self.exit_code,
                                             "ended_cleanly": self.ended_cleanly,
                                             "process_group_alive": self.process_group_alive})
        except OSError:
            pass

    def script_ended(self) -> None:
        """The script ended without an error: note what its interpreter's shutdown will tear down (a process group
        never destroyed can abort the process there), then enter the exiting phase."""
        torch = sys.modules.get("torch")
        dist = getattr(torch, "distributed", None)
        try:
            self.process_group_alive = bool(dist is not None and dist.is_available() and dist.is_initialized())
        except Exception:  # a half-imported torch: nothing to note
            self.process_group_alive = False
        self.ended_cleanly = True
        self.write_status()
        self.set_phase(PHASE_EXITING)

    def internal_error(self, exc: BaseException, doing: str) -> None:
        """Triage failed: one line (or, under TRIAGE_DEBUG, the whole traceback and exit status 70)."""
        if self.debug:
            import traceback

            sys.stderr.write(f"triage: internal error while {doing} (TRIAGE_DEBUG is set):\n")
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
            sys.stderr.flush()
            os._exit(EXIT_INTERNAL_DEBUG)
        if doing in self._said:
            return
        self._said.add(doing)
        try:
            sys.stderr.write(
                f"triage: internal error while {doing}: {type(exc).__name__}: {exc} (TRIAGE_DEBUG=1 for details)\n"
            )
            sys.stderr.flush()
        except Exception:
            pass


def run_child(target: str, module: bool, args: list[str], channel: Channel, config: dict[str, Any],
              stderr_file: StderrFile | None = None) -> NoReturn:
    """Run the script in this (forked) process and end it the way plain python would."""
    session: Session | None = Session(channel, config, stderr_file)
    try:
        session.start()
    except Exception as exc:
        session.internal_error(exc, "starting")
        session = None
    _prepare_main(target, module, args)
    if session is not None:
        session.begin_user_code()
    reserve = _MemoryReserve(MEMORY_RESERVE_BYTES)
    try:
        try:
            if module:
                _run_module(target)
            else:
                _run_path(target)
        finally:  # before anything below runs, however the script ended
            reserve.release()
    except SystemExit as exit_:
        if session is not None:
            if exit_.code in (None, 0):
                session.report_health()
                session.script_ended()
            else:
                session.set_phase(PHASE_EXITING)
        raise
    except KeyboardInterrupt as exc:
        _defer_python_signal_handlers()
        if session is not None:
            session.set_phase(PHASE_EXITING)
        _die_interrupted(exc, session)
    except BaseException as exc:
        _defer_python_signal_handlers()
        if session is not None:
            session.set_phase(PHASE_TRIAGING)
        _exit_failed(exc, session)
    if session is not None:
        session.report_health()
        session.script_ended()
    raise SystemExit(0)


class _MemoryReserve:
    """Address space set aside before the script runs, to be given back when it ends, however it ends."""

    def __init__(self, size: int) -> None:
        try:  # an anonymous mapping never written: no page of it is ever resident (a bytearray is zero-filled)
            self._block: mmap.mmap | None = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except (OSError, ValueError):  # the limit is already that tight: run without one
            self._block = None

    def release(self) -> None:
        if self._block is not None:
            self._block.close()
            self._block = None


def _defer_python_signal_handlers() -> None:
    """Keep signals whose handlers are Python code pending while the exception is printed and triaged.

    Such a handler can raise at any bytecode: torch's SIGCHLD handler raises
    "DataLoader worker (pid N) is killed by signal" again when a second worker
    dies. The process is ending with the script's own exception, so they stay
    pending until it exits.
    """
    try:
        deferred = {
            number for number in signal.valid_signals()
            if number not in (signal.SIGINT, signal.SIGKILL, signal.SIGSTOP) and callable(signal.getsignal(number))
        }  # fmt: skip
        if deferred:
            signal.pthread_sigmask(signal.SIG_BLOCK, deferred)
    except (OSError, ValueError):
        pass


def _prepare_main(target: str, module: bool, args: list[str]) -> None:
    """sys.argv, sys.path[0] and sys.orig_argv as `python SCRIPT ARGS` / `python -m MODULE ARGS` set them."""
    interpreter = interpreter_argv()
    if module:
        sys.argv = ["-m", *args]  # runpy puts the module's file in argv[0], as `python -m` does
        path0 = os.getcwd()
        sys.orig_argv = [*interpreter, "-m", target, *args]
    else:
        sys.argv = [target, *args]
        if target == STDIN_SCRIPT:
            path0 = ""  # `python -` puts the working directory first, as an empty entry
        elif os.path.isdir(target) or _is_zip(target):
            path0 = os.path.realpath(target)
        else:
            path0 = os.path.dirname(os.path.realpath(target))
        sys.orig_argv = [*interpreter, target, *args]
    if not sys.flags.safe_path:
        if sys.path:
            sys.path[0] = path0
        else:
            sys.path.insert(0, path0)


def _is_zip(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError:
        return False
    if head == b"PK\x03\x04":
        return True
    if path.endswith((".zip", ".pyz")):
        import zipfile

        return zipfile.is_zipfile(path)
    return False


def _fresh_main() -> types.ModuleType:
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = sys.modules["builtins"]
    main.__dict__["__annotations__"] = {}
    sys.modules["__main__"] = main
    return main


def _give_python_headroom(counted_calls_between: int = 0) -> None:
    """Raise the recursion limit by the depth under the script that plain python does not have.

    Plain python runs a script's module code as the first frame; here the CLI, the supervisor
    and this module sit below it (about a dozen frames, and C calls that count too), which the
    script would otherwise lose from its recursion depth. The depth in use is measured, not
    guessed: how far a probe can recurse from here, against the limit. Called from the function
    that runs the script's code; `counted_calls_between` are the calls between that function
    and the script's first frame that count toward the limit (the builtin exec() is one).
    """
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + _depth_in_use(limit) + counted_calls_between - _PLAIN_PYTHON_DEPTH)


def _recursion_probe(depth: int) -> int:
    try:
        return _recursion_probe(depth + 1)
    except RecursionError:
        return depth


def _depth_in_use(limit: int) -> int:
    return limit - _recursion_probe(1)


# _depth_in_use() where plain python starts a script: measured in a script's module code, minus its frame.
_PLAIN_PYTHON_DEPTH = 2


def _run_module(name: str) -> None:
    import runpy

    _fresh_main()
    _give_python_headroom()  # runpy's own frames are under `python -m` too
    runpy._run_module_as_main(name, alter_argv=True)


def _run_stdin() -> None:
    """`python -`: the script is standard input, read to its end; its file is `<stdin>`."""
    source = sys.stdin.buffer.read() if sys.stdin is not None else b""
    main = _fresh_main()
    main.__dict__["__file__"] = "<stdin>"
    main.__dict__["__cached__"] = None
    main.__dict__["__loader__"] = sys.modules["builtins"].__loader__
    code = compile(source, "<stdin>", "exec", dont_inherit=True)
    _give_python_headroom(counted_calls_between=1)
    exec(code, main.__dict__)


def _run_path(target: str) -> None:
    if target == STDIN_SCRIPT:
        _run_stdin()
        return
    if os.path.isdir(target) or _is_zip(target):
        # `python DIR` and `python APP.zip` run DIR/__main__.py through runpy with DIR on sys.path.
        import runpy

        _fresh_main()
        _give_python_headroom()
        runpy._run_module_as_main("__main__", alter_argv=False)
        return
    path = os.path.abspath(target)
    try:
        with open(path, "rb") as handle:
            source = handle.read()
    except OSError as exc:
        sys.stderr.write(f"{sys.executable}: can't open file {path!r}: [Errno {exc.errno}] {exc.strerror}\n")
        raise SystemExit(2) from None
    main = _fresh_main()
    main.__dict__["__file__"] = path
    main.__dict__["__cached__"] = None
    from importlib.util import MAGIC_NUMBER

    if source[:4] == MAGIC_NUMBER:
        from importlib.machinery import SourcelessFileLoader

        main.__dict__["__loader__"] = SourcelessFileLoader("__main__", path)
        code = marshal.loads(source[16:])
    else:
        from importlib.machinery import SourceFileLoader

        main.__dict__["__loader__"] = SourceFileLoader("__main__", path)
        code = compile(source, path, "exec", dont_inherit=True)
    _give_python_headroom(counted_calls_between=1)
    exec(code, main.__dict__)


def _show_exception(exc: BaseException, tb) -> None:
    """Print the exception through sys.excepthook, as the interpreter does for an uncaught one."""
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    hook = sys.excepthook
    try:
        hook(type(exc), exc, tb)
    except BaseException as hook_error:
        sys.stderr.write("Error in sys.excepthook:\n")
        sys.__excepthook__(type(hook_error), hook_error, hook_error.__traceback__)
        sys.stderr.write("\nOriginal exception was:\n")
        sys.__excepthook__(type(exc), exc, tb)
    try:
        sys.stderr.flush()
    except Exception:
        pass


def _hide_runner_frames(exc: BaseException):
    """Drop runpy and triage frames from every traceback of the chain: the interpreter prints those.

    The exception is about to end the process, so nothing else will see the
    shortened tracebacks; CPython's excepthook prints the traceback stored on
    the exception, not the one it is passed.
    """
    from ..capture.frames import user_traceback
    from ..capture.live import exception_chain

    for member, _link in exception_chain(exc):
        member.__traceback__ = user_traceback(member.__traceback__)
    return exc.__traceback__


def _exit_failed(exc: BaseException, session: Session | None) -> NoReturn:
    if session is not None:
        session.promise_exit(1)
    try:
        tb = _hide_runner_frames(exc)
    except BaseException:
        tb = exc.__traceback__
    try:
        _show_exception(exc, tb)
    except BaseException:
        pass
    if session is not None:
        session.report_exception(exc, tb)
        session.set_phase(PHASE_EXITING)
    raise SystemExit(1)


def _die_interrupted(exc: KeyboardInterrupt, session: Session | None) -> NoReturn:
    """Like CPython after an uncaught KeyboardInterrupt: finalize, then die of SIGINT (the shell shows 130)."""
    try:
        _show_exception(exc, _hide_runner_frames(exc))
    except BaseException:
        pass
    if session is not None:
        session.handled = "interrupt"
        session.write_status()
    for step in (threading._shutdown, atexit._run_exitfuncs):  # what Py_FinalizeEx does first
        try:
            step()
        except BaseException:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    os._exit(130)
