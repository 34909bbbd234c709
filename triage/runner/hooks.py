"""Automatic hooks in the child: DataLoader iteration and optimizer steps feed the Tracker and the heartbeat; the
outermost module calls are recorded for the probes.

Nothing imports torch here: a watcher on `sys.meta_path` installs the torch
hooks right after the script's own `import torch` finishes, so a script that
never imports torch pays nothing. Per batch the cost is one wrapper call, a
weak-dictionary lookup and a struct write into a shared memory map; memory is
sampled at most once a second. Per call of the model or the loss (after the
first optimizer step, of nothing else) it is one Python frame and a few
dictionary operations.
"""

from __future__ import annotations

import functools
import mmap
import os
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from typing import Any, Callable

from .channel import DUMP_SIGNAL, ENVIRONMENT, HEARTBEAT, HEARTBEAT_SIZE, PHASE_RUNNING, STACK_DUMP, WORKERS, Beat, Channel, dump_ready_marker

SAMPLE_SECONDS = 0.25
MAX_WARNINGS = 20
MAX_WARNING_CHARS = 1000
# Anomaly mode's warning carries the forward call's whole stack, innermost (the line that matters) last.
MAX_STACK_WARNING_CHARS = 8000
MAX_WORKER_ENTRIES = 256


class Heartbeat:
    """The child's side of the heartbeat: counters in a shared memory map the parent reads."""

    def __init__(self, channel: Channel) -> None:
        fd = os.open(channel.file(HEARTBEAT), os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, HEARTBEAT_SIZE)
        finally:
            os.close(fd)
        self.beat = Beat(main_thread=threading.main_thread().ident or 0)
        self._next_sample = 0.0
        self._active = True
        self._statm = _open_statm()
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        # Forked DataLoader workers inherit the tracker and this object; only the child itself writes.
        os.register_at_fork(after_in_child=self._silence)

    def _silence(self) -> None:
        self._active = False

    def start(self) -> None:
        """User code is about to run."""
        self.beat.started_pid = os.getpid()
        self.beat.phase = PHASE_RUNNING
        self._sample(time.time())
        self.write()

    def set_phase(self, phase: int) -> None:
        """A change of phase counts as a change: the parent's no-progress clock restarts."""
        self.beat.phase = phase
        self.beat.seq += 1
        self.write()

    def on_progress(self, what: str, count: int) -> None:
        """Tracker listener: a batch, a step or a new iterator."""
        if not self._active:
            return
        beat = self.beat
        beat.seq += 1
        if what == "batch":
            beat.batches = count
        elif what == "step":
            beat.steps = count
        elif what == "iter":
            beat.iterators = count
        now = time.time()
        beat.progress_time = now
        if now >= self._next_sample:
            self._sample(now)
        beat.pack_into(self._map)

    def write(self) -> None:
        if self._active:
            self.beat.pack_into(self._map)

    def _sample(self, now: float) -> None:
        self._next_sample = now + SAMPLE_SECONDS
        beat = self.beat
        beat.sample_time = now
        if self._statm is not None:
            try:
                resident = int(os.pread(self._statm, 64, 0).split()[1]) * self._page
                beat.rss = resident
                beat.peak_rss = max(beat.peak_rss, resident)
            except (OSError, ValueError, IndexError):
                pass
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and _attempt(cuda.is_initialized, False):
            # Allocator statistics are host-side counters: no sync, no kernel.
            beat.gpu_allocated = _attempt(cuda.memory_allocated, 0) or 0
            beat.gpu_reserved = _attempt(cuda.memory_reserved, 0) or 0


def _open_statm() -> int | None:
    try:
        return os.open("/proc/self/statm", os.O_RDONLY)
    except OSError:
        return None


class TorchImportWatcher:
    """A meta-path finder that runs `callback` once, right after `import torch` completes."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback = callback

    def install(self) -> None:
        if "torch" in sys.modules:
            self._callback()
        else:
            sys.meta_path.insert(0, self)

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != "torch":
            return None
        self.remove()
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        original = getattr(loader, "exec_module", None)
        if original is None:
            return spec
        callback = self._callback

        def exec_module(module):
            try:
                original(module)
            finally:
                try:
                    del loader.exec_module  # the loader is torch's own again
                except AttributeError:
                    pass
            callback()

        loader.exec_module = exec_module
        return spec


class TorchHooks:
    """DataLoader and optimizer hooks feeding `tracker`, the heartbeat and the worker map."""

    def __init__(self, tracker, heartbeat: Heartbeat | None, channel: Channel | None, on_error: Callable[[BaseException], None],
                 feed_tracker: bool = True) -> None:
        self.tracker = tracker
        # False when triage.wrapper.auto_track() already reports batches and steps (with its NaN/Inf checks).
        self.feed_tracker = feed_tracker
        self.heartbeat = heartbeat
        self.channel = channel
        self.on_error = on_error
        self._loaders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._workers: dict[str, dict[str, int]] = {}
        self.installed = False

    def install(self) -> None:
        import torch
        import torch.utils.data.dataloader as dataloader
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._wrap_iteration(dataloader)
        record_outer_calls(self.tracker)
        tracker = self.tracker
        if self.feed_tracker:

            def step_finished(optimizer, args, kwargs) -> None:
                tracker.on_step(optimizer)

            self._step_handle = register_optimizer_step_post_hook(step_finished)
        self.installed = True
        if self.channel is not None:
            from ..capture.environment import torch_versions

            self.channel.write_json(ENVIRONMENT, torch_versions(torch))

    def _wrap_iteration(self, dataloader) -> None:
        base = dataloader._BaseDataLoaderIter
        loader_class = dataloader.DataLoader
        original_next = base.__next__
        original_iter = loader_class.__iter__
        loaders = self._loaders
        tracker = self.tracker
        heartbeat = self.heartbeat
        on_error = self.on_error
        hooks = self
        feed = self.feed_tracker

        @functools.wraps(original_next)
        def __next__(self):
            batch = original_next(self)
            try:
                if heartbeat is not None:
                    beat = heartbeat.beat
                    beat.epoch_batches = self._num_yielded
                    beat.awaited_worker = _awaited_worker(self)
                    if not feed:
                        heartbeat.write()
                if feed:
                    tracker.on_batch(batch, loaders.get(self))
            except Exception as exc:
                on_error(exc)
            return batch

        @functools.wraps(original_iter)
        def __iter__(self):
            swapped = hooks._lend_worker_init(self)
            try:
                iterator = original_iter(self)
            finally:
                if swapped is not _UNCHANGED:
                    self.worker_init_fn = swapped
            try:
                loaders[iterator] = self
                if heartbeat is not None:
                    heartbeat.beat.epoch_batches = getattr(iterator, "_num_yielded", 0)
                    heartbeat.beat.awaited_worker = _awaited_worker(iterator)
                hooks._record_workers(iterator)
                tracker.on_iter(self)
            except Exception as exc:
                on_error(exc)
            return iterator

        base.__next__ = __next__
        loader_class.__iter__ = __iter__

    def _lend_worker_init(self, loader):
        """For spawn/forkserver workers, which inherit nothing: install the stack-dump handler through worker_init_fn.

        The loader's worker_init_fn is swapped only while the iterator starts
        its workers (it reads the attribute once), then put back.
        """
        try:
            if self.channel is None or not getattr(loader, "num_workers", 0) or _start_method(loader) == "fork":
                return _UNCHANGED
            if not _importable_from_workers():
                return _UNCHANGED  # unpickling our wrapper in the worker would fail: better no stacks than no worker
            original = loader.worker_init_fn
            loader.worker_init_fn = functools.partial(worker_started, original, self.channel.path)
            return original
        except Exception as exc:
            self.on_error(exc)
            return _UNCHANGED

    def _record_workers(self, iterator) -> None:
        """Worker pid -> worker id, so the parent can name the worker whose stack it reads."""
        workers = getattr(iterator, "_workers", None)
        if not workers or self.channel is None:
            return
        changed = False
        for worker_id, process in enumerate(workers):
            pid = getattr(process, "pid", None)
            if pid is not None and str(pid) not in self._workers:
                self._workers[str(pid)] = {"worker": worker_id, "iterator": self.tracker.iterators + 1}
                changed = True
        if changed:
            while len(self._workers) > MAX_WORKER_ENTRIES:
                self._workers.pop(next(iter(self._workers)))
            self.channel.write_json(WORKERS, self._workers)


_UNCHANGED = object()
_kept_files: list = []


def record_outer_calls(tracker) -> Callable[[], None]:
    """Keep every outermost nn.Module call in `tracker` (module, args, kwargs by reference); returns the undo.

    The probes replay the call the script really made (a model's forward may take text and offsets, or
    keyword arguments; a GAN has two networks) instead of guessing it from the batch. A global forward hook
    would send every layer's call down torch's slow path (about 2 µs each); instead `nn.Module.__call__` is
    wrapped until the first optimizer step, which is enough to see the class of every module called from
    outside a forward (the model, the loss, a GAN's two networks); from then on only those classes carry the
    wrapper, so the layers inside a model cost nothing. A call made while another is running is nested and
    passes straight through; so does everything while dynamo traces (its guards then never depend on
    triage's state) or while a probe replays the step.
    """
    import torch
    from torch import nn

    original = nn.Module.__call__
    compiling = torch.compiler.is_compiling
    tensor_type = torch.Tensor
    ref = weakref.ref
    wrapped: list[type] = []

    def __call__(self, *args, **kwargs):
        if tracker.call_depth or tracker.suspended or compiling():
            return original(self, *args, **kwargs)
        if nn.Module.__call__ is __call__:  # still discovering the classes called from outside every forward
            if tracker.steps:
                nn.Module.__call__ = original
            else:
                cls = type(self)
                if cls not in wrapped and getattr(cls, "__call__", None) is __call__:  # no __call__ of its own
                    cls.__call__ = __call__
                    wrapped.append(cls)
        # The module's latest call, filed last (inline: once or twice a step, each frame costs microseconds).
        calls, key = tracker.outer_calls, id(self)
        entry = calls.pop(key, None)
        if entry is None or entry.module_ref() is not self:
            entry = tracker.new_outer_call(self)
        steps = tracker.steps
        entry.args, entry.kwargs, entry.output = args, kwargs, None
        entry.repeats = entry.repeats + 1 if entry.step == steps else 1
        entry.step = steps
        calls[key] = entry
        tracker.call_depth = 1
        try:
            output = original(self, *args, **kwargs)
        finally:
            tracker.call_depth = 0
        main = output if isinstance(output, tensor_type) else (
            output[0] if type(output) is tuple and output and isinstance(output[0], tensor_type) else None)
        if main is not None:
            entry.output = ref(main)
        return output

    nn.Module.__call__ = __call__
    tracker.calls_recorded = True

    def undo() -> None:
        if nn.Module.__call__ is __call__:
            nn.Module.__call__ = original
        for cls in wrapped:
            if cls.__dict__.get("__call__") is __call__:
                del cls.__call__
        wrapped.clear()
        tracker.calls_recorded = False

    return undo


def worker_started(user_init, channel_path: str, worker_id: int) -> None:
    """worker_init_fn of a spawn/forkserver DataLoader worker: register the stack dump, then the user's own init."""
    try:
        import faulthandler

        handle = open(os.path.join(channel_path, STACK_DUMP), "a", encoding="utf-8")
        _kept_files.append(handle)
        faulthandler.register(DUMP_SIGNAL, file=handle, all_threads=True, chain=False)
        open(os.path.join(channel_path, dump_ready_marker(os.getpid())), "w").close()
    except Exception:
        pass  # no stack for this worker on a hang; the worker itself runs as it would have
    if user_init is not None:
        user_init(worker_id)


def _start_method(loader) -> str:
    context = getattr(loader, "multiprocessing_context", None)
    if context is not None:
        return context.get_start_method() if hasattr(context, "get_start_method") else str(context)
    import multiprocessing

    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]


@functools.lru_cache(maxsize=1)
def _importable_from_workers() -> bool:
    """A spawned worker gets this process's sys.path: can it import this very triage package from there?"""
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec("triage", sys.path)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return bool(spec and spec.origin) and os.path.dirname(os.path.abspath(spec.origin)) == here


def _awaited_worker(iterator) -> int:
    """The worker that owns the next batch the main process will wait for (-1 when unknown)."""
    task_info = getattr(iterator, "_task_info", None)
    if not task_info:
        return -1
    info = task_info.get(getattr(iterator, "_rcvd_idx", -1))
    return info[0] if info else -1


class WarningRecorder:
    """Keeps the last warnings shown (they often name the real problem) and shows them as before."""

    def __init__(self) -> None:
        self.lines: deque[str] = deque(maxlen=MAX_WARNINGS)
        self._original = None

    def install(self) -> None:
        self._original = warnings.showwarning
        original = self._original
        lines = self.lines

        @functools.wraps(original)
        def showwarning(message, category, filename, lineno, file=None, line=None):
            try:
                lines.append(_clip_warning(f"{filename}:{lineno}: {getattr(category, '__name__', category)}: {message}"))
            except Exception:
                pass
            return original(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning


def _clip_warning(text: str) -> str:
    """A warning kept for the report; one carrying a stack keeps its first line and its innermost frames."""
    if len(text) <= MAX_WARNING_CHARS:
        return text
    if '  File "' not in text:
        return text[:MAX_WARNING_CHARS]
    lines = text.split("\n")
    head, tail, size = lines[0][:MAX_WARNING_CHARS], [], 0
    for line in reversed(lines[1:]):
        size += len(line) + 1
        if size > MAX_STACK_WARNING_CHARS - len(head):
            break
        tail.append(line)
    tail.reverse()
    while tail and not tail[0].lstrip().startswith('File "'):
        tail.pop(0)  # start at a frame, so the stack left reads as one
    return "\n".join([head, *tail])


def _attempt(call, default: Any = None) -> Any:
    try:
        return call()
    except Exception:
        return default
