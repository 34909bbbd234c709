"""workers0_rerun: fetch the failing batches in the main process, as num_workers=0 would.

In the main process a dataset bug raises with its own traceback and the index
that triggers it, and a blocking call shows up as a stack that does not move.
The fetch runs on a helper thread so that a fetch that blocks can be reported
(with where it blocks) instead of blocking triage too. The batch size measured
here gives the shared memory the workers need, for bus errors and killed workers.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from ..diagnosis import ProbeResult
from ._support import exception_line, innermost_user_frame, iter_tensors, no_batch_hint, result, where
from .context import ProbeContext

NAME = "workers0_rerun"
# A clean dataset is scanned for at most this long / this many batches; a bad sample is usually near the failing batch.
SCAN_S = 15.0
SCAN_BATCHES = 500
_CAUGHT = re.compile(r"Caught (?P<type>\w+) in DataLoader worker process (?P<worker>\d+)")
_TIMED_OUT = re.compile(r"DataLoader timed out after \d+ seconds")
_WORKER_DEATH = re.compile(r"DataLoader worker \(pid.*\) (?:is killed|exited unexpectedly)|bus error|shared memory"
                           r"|shm", re.IGNORECASE)


@dataclass
class Scan:
    """Progress of the main-process fetch, shared with the helper thread."""

    batches: int = 0
    samples: int = 0
    current: Any = None  # the index or indices being fetched now
    started: float = field(default_factory=time.monotonic)
    batch_bytes: int = 0
    error: BaseException | None = None
    failed_at: Any = None
    stage: str = ""
    stop: bool = False
    done: bool = False
    slowest: tuple[float, Any] = (0.0, None)  # (seconds, indices) of the slowest batch, its samples and collate
    slow_stack: list[traceback.FrameSummary] | None = None  # where a fetch was once it outlasted the timeout

    def timed(self, indices: Any, started: float) -> None:
        seconds = time.monotonic() - started
        if seconds > self.slowest[0]:
            self.slowest = (seconds, indices)


@dataclass
class Source:
    """What a DataLoader (or its live iterator) fetches from."""

    dataset: Any
    batch_sampler: Any
    sampler: Any
    collate_fn: Any
    num_workers: int
    prefetch_factor: int
    worker_init_fn: Any
    iterable: bool
    timeout: float = 0.0  # the DataLoader's own limit on waiting for a batch


def _source(loader: Any) -> Source | None:
    dataset = getattr(loader, "dataset", None) or getattr(loader, "_dataset", None)
    if dataset is None:
        return None
    batch_sampler = getattr(loader, "batch_sampler", None)
    if batch_sampler is None and getattr(loader, "_auto_collation", False):
        batch_sampler = getattr(loader, "_index_sampler", None)
    sampler = getattr(loader, "sampler", None) or getattr(loader, "_index_sampler", None)
    collate = getattr(loader, "collate_fn", None) or getattr(loader, "_collate_fn", None)
    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    return Source(dataset, batch_sampler, sampler, collate, int(getattr(loader, "num_workers", 0) or 0),
                  int(getattr(loader, "prefetch_factor", None) or 2), getattr(loader, "worker_init_fn", None), iterable,
                  float(getattr(loader, "timeout", 0) or 0))


# A worker killed by a signal may have been killed by what fetching its samples does (a native
# crash, memory blown up, a dataset that kills its process): fetching them again would most likely
# kill the experiment's process the same way, which says nothing the worker's death did not. A bus
# error from exhausted shared memory is not caused by the sample, so that case is still fetched
# (to size the batches in flight).
_KILLED_WORKER = re.compile(
    r"killed by signal|exited unexpectedly|Segmentation fault|SIGSEGV|SIGKILL|ConnectionResetError|Connection reset by peer"
)
_SHARED_MEMORY_DEATH = re.compile(r"bus error|shared memory|shm", re.IGNORECASE)


def workers0_rerun(ctx: ProbeContext) -> ProbeResult:
    source = _source(ctx.loader)
    if source is None:
        return result(NAME, "skipped", f"no live DataLoader: {no_batch_hint()}")
    killed = _refetch_unsafe(ctx)
    if killed:
        return result(NAME, "skipped", f"a worker died ({killed}); fetching its samples again would most likely end the same way")
    limit = max(min(ctx.time_limit_s - 0.5, SCAN_S), 0.5)
    block_s = min(10.0, max(limit / 3, 0.3))
    first_batch = (ctx.batch_index + 1) if ctx.batch_index is not None else 0
    scan = Scan()
    worker = threading.Thread(target=_fetch_all, args=(source, scan, first_batch), name="triage-workers0",
                              daemon=True)
    worker.start()
    deadline = time.monotonic() + limit
    blocked_stack = None
    while worker.is_alive():
        worker.join(0.02)
        now = time.monotonic()
        if source.timeout and scan.slow_stack is None and worker.is_alive() and now - scan.started > source.timeout:
            frame = sys._current_frames().get(worker.ident)  # where a fetch is once it outlasts the timeout
            scan.slow_stack = traceback.extract_stack(frame) if frame is not None else []
        if worker.is_alive() and now - scan.started > block_s:
            frame = sys._current_frames().get(worker.ident)
            blocked_stack = traceback.extract_stack(frame) if frame is not None else []
            scan.stop = True
            break
        if now > deadline:
            scan.stop = True
            worker.join(1.0)
            break
    return _verdict(ctx, source, scan, blocked_stack, block_s, first_batch)


def _refetch_unsafe(ctx: ProbeContext) -> str | None:
    incident = ctx.incident
    text = "\n".join([e.message for e in incident.exceptions] + [e.type for e in incident.exceptions] + incident.log_lines)
    if _SHARED_MEMORY_DEATH.search(text):
        return None
    killed = _KILLED_WORKER.search(text)
    return killed.group(0) if killed else None


def _fetch_all(source: Source, scan: Scan, first_batch: int) -> None:
    try:
        if source.iterable:
            _fetch_iterable(source, scan)
        else:
            _fetch_mapped(source, scan, first_batch)
    except BaseException as exc:  # noqa: BLE001 - sampler failures are findings too
        scan.error, scan.stage = exc, scan.stage or "sampler"
    finally:
        scan.done = True


def _fetch_mapped(source: Source, scan: Scan, first_batch: int) -> None:
    scan.stage = "sampler"
    if source.batch_sampler is not None:
        order = list(source.batch_sampler)
    else:
        order = [i for i in source.sampler]
    # Start at the batch the workers were producing, then go round from the beginning.
    order = order[first_batch:] + order[:first_batch]
    for indices in order:
        if scan.stop or scan.batches >= SCAN_BATCHES:
            return
        batched = isinstance(indices, (list, tuple))
        samples = []
        batch_started = time.monotonic()
        for index in (indices if batched else [indices]):
            scan.current, scan.started, scan.stage = index, time.monotonic(), "dataset"
            try:
                samples.append(source.dataset[index])
            except BaseException as exc:  # noqa: BLE001
                scan.error, scan.failed_at = exc, index
                return
            scan.samples += 1
        _collate(source, scan, samples if batched else samples[0], indices)
        if scan.error is not None:
            return
        scan.timed(indices, batch_started)


def _fetch_iterable(source: Source, scan: Scan) -> None:
    scan.stage = "dataset"
    iterator = iter(source.dataset)
    size = getattr(source.batch_sampler, "batch_size", None) or 1
    while not scan.stop and scan.batches < SCAN_BATCHES:
        samples = []
        batch_started = time.monotonic()
        for _ in range(size):
            scan.current, scan.started = scan.samples, time.monotonic()
            try:
                samples.append(next(iterator))
            except StopIteration:
                break
            except BaseException as exc:  # noqa: BLE001
                scan.error, scan.failed_at = exc, f"item {scan.samples}"
                return
            scan.samples += 1
        if not samples:
            return
        _collate(source, scan, samples, f"items {scan.samples - len(samples)}..{scan.samples - 1}")
        if scan.error is not None:
            return
        scan.timed(f"items {scan.samples - len(samples)}..{scan.samples - 1}", batch_started)


def _collate(source: Source, scan: Scan, samples: Any, indices: Any) -> None:
    scan.current, scan.started, scan.stage = indices, time.monotonic(), "collate"
    try:
        batch = source.collate_fn(samples) if source.collate_fn is not None else samples
    except BaseException as exc:  # noqa: BLE001
        scan.error, scan.failed_at = exc, indices
        return
    scan.batch_bytes = max(scan.batch_bytes, sum(t.numel() * t.element_size() for _, t in iter_tensors(batch)))
    scan.batches += 1
    scan.stage = "dataset"


def _original_type(ctx: ProbeContext) -> str | None:
    for exc in ctx.incident.exceptions or ([ctx.incident.exception] if ctx.incident.exception else []):
        found = _CAUGHT.search(exc.message)
        if found:
            return found["type"]
    root = ctx.incident.exception
    if root is not None and (root.worker is not None or ctx.incident.worker is not None):
        return root.short_type
    return None


def _mb(n: int) -> str:
    return f"{n / 1024**2:.1f} MB"


def _verdict(ctx: ProbeContext, source: Source, scan: Scan, blocked_stack, block_s: float,
             first_batch: int) -> ProbeResult:
    dataset = type(source.dataset).__name__
    init = " (worker_init_fn was not run)" if source.worker_init_fn is not None else ""
    facts: dict[str, Any] = {"dataset": dataset, "batches_fetched": scan.batches, "samples_fetched": scan.samples,
                             "num_workers": source.num_workers, "batch_bytes": scan.batch_bytes,
                             "first_batch": first_batch}
    original = _original_type(ctx)
    if scan.error is not None:
        frame = innermost_user_frame(traceback.extract_tb(scan.error.__traceback__))
        at = f" at {where(frame)}" if frame else ""
        what = "collating" if scan.stage == "collate" else "fetching"
        detail = (f"with num_workers=0, {what} {_index_text(scan.failed_at)} of {dataset} raises "
                  f"{exception_line(scan.error)}{at}{init}")
        facts.update(exception=type(scan.error).__name__, index=repr(scan.failed_at)[:200], location=where(frame))
        status = "confirmed" if original in (None, type(scan.error).__name__) else "inconclusive"
        return result(NAME, status, detail, **facts)
    if blocked_stack is not None:
        frame = innermost_user_frame(blocked_stack) or (blocked_stack[-1] if blocked_stack else None)
        detail = (f"with num_workers=0, {_index_text(scan.current)} of {dataset} has not returned after "
                  f"{block_s:.1f} s: it blocks at {where(frame) or 'an unknown place'}{init}")
        facts.update(blocked_at=where(frame), index=repr(scan.current)[:200])
        timed_out = _timed_out(ctx) and block_s > source.timeout
        status = "confirmed" if ctx.incident.kind == "hang" or timed_out else "inconclusive"
        return result(NAME, status, detail, **facts)
    seconds, slowest = scan.slowest
    facts.update(slowest_batch_s=round(seconds, 3), slowest_batch=repr(slowest)[:200])
    if source.timeout and _timed_out(ctx):
        return _timeout_verdict(source, scan, dataset, init, facts)
    clean = (f"with num_workers=0 the main process fetched {scan.batches} batches ({scan.samples} samples) of "
             f"{dataset} without error{init}")
    shm = _shm_check(ctx, source, scan)
    if shm is not None:
        status, text = shm
        return result(NAME, status, f"{clean}; {text}", **facts)
    if original is not None:
        return result(NAME, "refuted", f"{clean}: the worker's {original} does not come from the data itself "
                      "(look at worker-only state: worker_init_fn, per-worker files or connections)", **facts)
    return result(NAME, "inconclusive", clean, **facts)


def _timed_out(ctx: ProbeContext) -> bool:
    texts = [e.message for e in ctx.incident.exceptions] + ([ctx.incident.exception.message]
                                                             if ctx.incident.exception else [])
    return any(_TIMED_OUT.search(text) for text in texts)


def _timeout_verdict(source: Source, scan: Scan, dataset: str, init: str, facts: dict[str, Any]) -> ProbeResult:
    """For a DataLoader timeout: does one batch take longer than `timeout` to load, even in the main process?"""
    seconds, slowest = scan.slowest
    fetched = f"{scan.batches} batches ({scan.samples} samples) of {dataset}"
    if seconds <= source.timeout:
        return result(NAME, "refuted", f"with num_workers=0 the main process loaded {fetched}, the slowest in "
                      f"{seconds:.2f} s, under the DataLoader's timeout={source.timeout:g}: the wait is not in "
                      f"the data itself (look at the workers: CPU contention, worker_init_fn, locks){init}", **facts)
    frame = innermost_user_frame(scan.slow_stack) if scan.slow_stack else None
    at = f"; past the timeout it was at {where(frame)}" if frame else ""
    facts.update(slow_at=where(frame))
    return result(NAME, "confirmed", f"with num_workers=0, {_index_text(slowest)} of {dataset} takes {seconds:.2f} s "
                  f"to load, over the DataLoader's timeout={source.timeout:g}{at}{init}", **facts)


def _index_text(index: Any) -> str:
    if isinstance(index, (list, tuple)):
        shown = ", ".join(str(i) for i in list(index)[:8]) + (", ..." if len(index) > 8 else "")
        return f"the batch of indices [{shown}]"
    if isinstance(index, str):
        return index
    return f"index {index!r}"


def _shm_check(ctx: ProbeContext, source: Source, scan: Scan) -> tuple[str, str] | None:
    """For a dead worker: do the batches in flight fit in /dev/shm?"""
    texts = [e.message for e in ctx.incident.exceptions] + ctx.incident.log_lines
    if not any(_WORKER_DEATH.search(t) for t in texts) or not scan.batch_bytes:
        return None
    in_flight = scan.batch_bytes * max(source.num_workers, 1) * source.prefetch_factor
    try:
        stat = os.statvfs("/dev/shm")
        total, free = stat.f_blocks * stat.f_frsize, stat.f_bavail * stat.f_frsize
    except OSError:
        return "inconclusive", f"each batch is {_mb(scan.batch_bytes)}; /dev/shm could not be inspected"
    text = (f"each batch is {_mb(scan.batch_bytes)}; {max(source.num_workers, 1)} workers × prefetch_factor "
            f"{source.prefetch_factor} keep {_mb(in_flight)} in shared memory; /dev/shm has {_mb(total)} "
            f"({_mb(free)} free)")
    return ("confirmed" if in_flight > free else "inconclusive"), text
