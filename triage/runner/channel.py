"""The files the supervising parent and the child share: options, heartbeat, crash and stack dumps, status.

Standard library only: the parent imports this at start. Everything lives in
one private temporary folder chosen by the parent before the child starts, so
a dying child never has to decide where to write.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import time
from dataclasses import dataclass

HEARTBEAT = "heartbeat"
CRASH_DUMP = "crash.txt"  # faulthandler output on SIGSEGV/SIGBUS/SIGABRT/SIGFPE/SIGILL
STACK_DUMP = "stacks.txt"  # faulthandler output when the parent asks for stacks (hangs)
WORKERS = "workers.json"  # DataLoader worker pid -> worker id, written by the child's hooks
STATUS = "status.json"  # what the child already reported
ENVIRONMENT = "environment.json"  # cheap environment facts the child learned after importing torch

# A real-time signal asks for a stack dump: SIGUSR1/SIGUSR2 are taken by SLURM
# preemption notices and Lightning's auto-requeue, so sending one could trigger
# the user's handler instead of faulthandler.
DUMP_SIGNAL = signal.SIGRTMIN + 4 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR1

_MAGIC = b"TRIAGEHB"
# magic, started pid, phase, sequence, batches, steps, loader iterators, batches of the current iterator,
# worker that owns the awaited batch, main thread ident, rss, peak rss, gpu allocated, gpu reserved,
# wall time of the last progress, wall time of the last memory sample
_LAYOUT = struct.Struct("<8sQQQQQQQqQQQQQdd")

# What the child is doing: only a run in user code can hang; a report or an exit in progress cannot.
PHASE_STARTING, PHASE_RUNNING, PHASE_TRIAGING, PHASE_EXITING = range(4)
HEARTBEAT_SIZE = 4096


@dataclass
class Beat:
    """One reading of the child's heartbeat."""

    started_pid: int = 0
    phase: int = PHASE_STARTING
    seq: int = 0
    batches: int = 0
    steps: int = 0
    iterators: int = 0
    epoch_batches: int = 0
    awaited_worker: int = -1
    main_thread: int = 0
    rss: int = 0
    peak_rss: int = 0
    gpu_allocated: int = 0
    gpu_reserved: int = 0
    progress_time: float = 0.0
    sample_time: float = 0.0

    @property
    def armed(self) -> bool:
        """Progress has been seen, so a lack of it can mean a hang."""
        return self.phase == PHASE_RUNNING and bool(self.batches or self.steps or self.iterators)

    def pack_into(self, buffer, offset: int = 0) -> None:
        _LAYOUT.pack_into(
            buffer, offset, _MAGIC, self.started_pid, self.phase, self.seq, self.batches, self.steps, self.iterators,
            self.epoch_batches, self.awaited_worker, self.main_thread, self.rss, self.peak_rss,
            self.gpu_allocated, self.gpu_reserved, self.progress_time, self.sample_time,
        )  # fmt: skip

    @classmethod
    def unpack(cls, data: bytes) -> Beat:
        if len(data) < _LAYOUT.size:
            return cls()
        fields = _LAYOUT.unpack_from(data)
        if fields[0] != _MAGIC:
            return cls()
        return cls(*fields[1:])

    def last_state(self) -> dict:
        """The last known state, for a report about a process that can no longer speak."""
        state: dict = {"batches": self.batches, "optimizer_steps": self.steps}
        if self.iterators:
            state["dataloader_iterators"] = self.iterators
            state["batches_this_iterator"] = self.epoch_batches
        if self.rss:
            state["rss_bytes"] = self.rss
            state["peak_rss_bytes"] = self.peak_rss
        if self.gpu_allocated or self.gpu_reserved:
            state["gpu_allocated_bytes"] = self.gpu_allocated
            state["gpu_reserved_bytes"] = self.gpu_reserved
        if self.progress_time:
            state["seconds_since_progress"] = round(max(0.0, time.time() - self.progress_time), 1)
        if self.sample_time:
            state["seconds_since_memory_sample"] = round(max(0.0, time.time() - self.sample_time), 1)
        return state


def dump_ready_marker(pid: int) -> str:
    """A file whose presence says process `pid` registered the stack-dump handler (spawned workers)."""
    return f"dump-ready-{pid}"


def _private_folder() -> str:
    """A new folder only this user can read, in the temporary directory (tempfile's rules, without its imports)."""
    base = next((os.environ[name] for name in ("TMPDIR", "TEMP", "TMP") if os.environ.get(name)), "/tmp")
    for attempt in range(100):
        path = os.path.join(base, f"triage-run-{os.getpid()}-{time.monotonic_ns() % 10**9}-{attempt}")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free folder name in {base}")


class Channel:
    """The shared folder. The parent creates it; the child opens it by path."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def create(cls) -> Channel:
        channel = cls(_private_folder())
        with open(channel.file(HEARTBEAT), "wb") as handle:
            handle.write(b"\0" * HEARTBEAT_SIZE)
        for name in (CRASH_DUMP, STACK_DUMP):
            open(channel.file(name), "wb").close()
        return channel

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def read_json(self, name: str) -> dict | None:
        try:
            with open(self.file(name), encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def write_json(self, name: str, data: dict) -> None:
        """Replace a file atomically, so the other side never reads half of it."""
        temporary = self.file(f".{name}.{os.getpid()}.tmp")
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(data, handle, default=str)
        os.replace(temporary, self.file(name))

    def read_beat(self) -> Beat:
        try:
            with open(self.file(HEARTBEAT), "rb") as handle:
                return Beat.unpack(handle.read(_LAYOUT.size))
        except OSError:
            return Beat()

    def read_text(self, name: str, start: int = 0, limit: int = 4 * 1024 * 1024) -> str:
        try:
            with open(self.file(name), "rb") as handle:
                handle.seek(start)
                return handle.read(limit).decode("utf-8", "replace")
        except OSError:
            return ""

    def size(self, name: str) -> int:
        try:
            return os.path.getsize(self.file(name))
        except OSError:
            return 0

    def remove(self) -> None:
        for name in os.listdir(self.path) if os.path.isdir(self.path) else []:
            try:
                os.unlink(self.file(name))
            except OSError:
                pass
        try:
            os.rmdir(self.path)
        except OSError:
            pass
