"""Native lines a run wrote to its stderr, read back from the log file stderr goes to.

A GPU kernel's failed assertion (`Loss.cu:245: ...: block: [0,0,0], thread: [1,0,0]
Assertion `t >= 0 && t < n_classes` failed.`) is written to the process's stderr by
the CUDA runtime, not raised: the Python exception that follows says only "device-side
assert triggered", and the line that names the check never reaches a traceback. Where
stderr is a regular file (`python -m triage train.py > train.log 2>&1`, a batch job's
log), the lines the run wrote there can be read back at the failure: only what it wrote
since it started (an appended log's earlier runs are not this run), the last
READ_BYTES of it, and only the kinds of line rules read. The same holds for a native
crash: `terminate called after throwing an instance of 'c10::Error'` and its `what():`,
or NCCL's watchdog error line, are written to stderr just before the abort. On a
terminal or a pipe there is nothing to read back. Standard library only (the supervising
parent reads it too); Linux (the path of fd 2 from /proc).
"""

from __future__ import annotations

import os
import re
import stat

READ_BYTES = 256 * 1024  # of the file's end: a kernel assertion prints one line per failing GPU thread
MAX_LINES = 8
# A CUDA kernel's assertion: `/pytorch/aten/src/ATen/native/cuda/Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d:
# block: [0,0,0], thread: [1,0,0] Assertion `t >= 0 && t < n_classes` failed.`
KERNEL_ASSERTION = re.compile(r"^\S+\.(?:cu|cuh):\d+: .*Assertion `.+` failed\.?\s*$")
_BLOCK_THREAD = re.compile(r"block: \[[\d,]+\], thread: \[[\d,]+\] ")
# What a native failure writes before the process aborts: C++'s terminate handler with the c10::Error's what(),
# and glog-style error lines (`[E816 01:45:40.183009389 ProcessGroupNCCL.cpp:607] [Rank 7] Watchdog caught ...`,
# under torchrun prefixed `[rank7]:`).
NATIVE_FAILURE = re.compile(r"^(?:terminate called after throwing an instance of |\s*what\(\):\s|"
                            r"(?:\[rank\d+\]:)?\[[EF]\d{4} )")


class StderrFile:
    """The regular file fd 2 wrote to when the run started, and its size then."""

    __slots__ = ("path", "start")

    def __init__(self, path: str, start: int) -> None:
        self.path, self.start = path, start

    @classmethod
    def at_start(cls) -> StderrFile | None:
        """Where stderr goes now, if it is a regular file that can be read back; None otherwise."""
        try:
            if not stat.S_ISREG(os.fstat(2).st_mode):
                return None
            path = os.readlink("/proc/self/fd/2")
            return cls(path, os.stat(path).st_size) if os.access(path, os.R_OK) else None
        except (OSError, ValueError):
            return None

    def kernel_assertions(self) -> list[str]:
        """The distinct kernel assertions written since the run started (one line each, block and thread numbers
        aside), oldest first; empty when the file cannot be read."""
        return _kernel_assertions(self._lines())

    def native_failure(self) -> list[str]:
        """The lines a native failure wrote before the process died: the kernel assertions, then the last
        MAX_LINES of C++ terminate / glog error lines, oldest first."""
        lines = self._lines()
        return _kernel_assertions(lines) + [line for line in lines if NATIVE_FAILURE.match(line)][-MAX_LINES:]

    def _lines(self) -> list[str]:
        """The lines written since the run started, at most the last READ_BYTES of them."""
        try:
            with open(self.path, "rb") as handle:
                end = handle.seek(0, os.SEEK_END)
                begin = max(self.start, end - READ_BYTES)
                if end <= begin:
                    return []
                handle.seek(begin)
                text = handle.read(end - begin).decode("utf-8", "replace")
        except OSError:
            return []
        lines = text.splitlines()[1 if begin > self.start else 0:]  # a window's first line may be cut
        return [line.rstrip() for line in lines]


def _kernel_assertions(lines: list[str]) -> list[str]:
    found: dict[str, str] = {}
    for line in lines:
        if KERNEL_ASSERTION.match(line):
            found.setdefault(_BLOCK_THREAD.sub("", line), line)
    return list(found.values())[:MAX_LINES]
