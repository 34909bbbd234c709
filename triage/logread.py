"""Read a pasted log (file or stream) into text, with bounded memory and time.

Small logs are read whole. A large log is scanned in chunks with `bytes.find`
(C speed) for anchors such as `Traceback`; only windows around the first and
last anchors and the tail of the log are kept, so a 1 GB training log costs
a few megabytes of memory and one pass at memchr speed.

A stream (a pipe, standard input, a device) may never end, and cannot be read
twice: its head is kept in memory, the rest goes through a fixed-size ring on
disk that holds its latest bytes, and reading stops after a fixed number of
bytes. Binary input (`/dev/zero`) is refused from its first chunk.
"""

from __future__ import annotations

import codecs
import os
import stat
from collections import deque
from dataclasses import dataclass, field
from typing import BinaryIO

SMALL_LOG_BYTES = 8 * 1024 * 1024
CHUNK_BYTES = 8 * 1024 * 1024
WINDOW_BEFORE = 64 * 1024
WINDOW_AFTER = 256 * 1024
TAIL_BYTES = 256 * 1024  # end-of-log summaries and bare error lines; tracebacks have their own windows
HITS_PER_ANCHOR = 8  # the first and the last this many, per anchor
# A stream's budget: the most bytes read from it, and the disk ring that keeps its latest bytes.
# Memory stays at the head (SMALL_LOG_BYTES) plus one chunk; disk at STREAM_TAIL_BYTES.
STREAM_READ_BYTES = 512 * 1024 * 1024
STREAM_TAIL_BYTES = 64 * 1024 * 1024

# What a failure looks like from far away; windows are kept around these. Each anchor costs
# one pass, and its cost depends on how far `bytes.find` can skip: a long needle with rare
# characters scans near memcpy speed, while one ending in a space ("Error: ") was 7x slower.
# CUDA assertion lines, NCCL lines and torchrun summaries sit just before a traceback or in
# the tail, which are kept anyway.
ANCHORS = (b"Traceback (most recent call last)",)


class LogReadError(Exception):
    """Raised when the input cannot be read as a log; the message is one line for the user."""


@dataclass
class LogText:
    """The text kept from a log: one segment when read whole, several when windowed."""

    segments: list[str]
    size: int
    name: str
    encoding: str = "utf-8"
    windowed: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.segments)


def read_log(path: str | None) -> LogText:
    """Read a log from `path`, or from standard input when `path` is None or '-'."""
    if path in (None, "-"):
        return _read_stream(_stdin_binary(), "<stdin>")
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            if stat.S_ISREG(info.st_mode):
                return _read_seekable(handle, info.st_size, path)
            return _read_stream(handle, path)  # a pipe or a device
    except OSError as exc:
        raise LogReadError(_unreadable(path, exc)) from None


def _unreadable(path: str, exc: OSError) -> str:
    """The one line that says why a log could not be read."""
    if isinstance(exc, FileNotFoundError):
        return f"{path}: no such file"
    if isinstance(exc, IsADirectoryError):
        return f"{path}: is a directory; give a log file, or '-' for standard input"
    if isinstance(exc, PermissionError):
        return f"{path}: permission denied"
    return f"{path}: cannot read ({exc.strerror or exc})"


def _stdin_binary() -> BinaryIO:
    import sys

    if sys.stdin is None:
        raise LogReadError("no standard input to read; give a log file")
    return getattr(sys.stdin, "buffer", sys.stdin)


def _read_stream(stream: BinaryIO, name: str) -> LogText:
    """Read a non-seekable stream within the stream budget: its head, then its latest bytes through a disk ring."""
    head = bytearray()
    while len(head) <= SMALL_LOG_BYTES:
        chunk = stream.read(CHUNK_BYTES)
        if not chunk:
            return _decode_whole(bytes(head), name)
        head += chunk
    encoding = _sniff_encoding(bytes(head[: 64 * 1024]), name)  # binary input stops here, before any spooling
    if encoding != "utf-8":
        raise LogReadError(f"{name}: {encoding} log larger than {SMALL_LOG_BYTES >> 20} MB; convert it to UTF-8 first")
    import tempfile  # only for a long stream

    with tempfile.TemporaryFile() as spool:
        ring = _Ring(spool, STREAM_TAIL_BYTES)
        ring.write(head[SMALL_LOG_BYTES:])
        del head[SMALL_LOG_BYTES:]
        total = SMALL_LOG_BYTES + ring.written
        ended = False
        while total < STREAM_READ_BYTES:
            chunk = stream.read(min(CHUNK_BYTES, STREAM_READ_BYTES - total))
            if not chunk:
                ended = True
                break
            ring.write(chunk)
            total += len(chunk)
        import io

        # The head and the ring are windowed like a large file: around failure markers, and their tails.
        segments, _kept = _window_segments(io.BytesIO(head), len(head))
        del head
        tail = _RingReader(ring)
        tail_segments, _kept = _window_segments(tail, tail.size) if tail.size else ([], 0)
        if tail_segments:
            # The ring starts mid-line (where the head stopped, or where it wrapped): drop that partial line.
            tail_segments[0] = tail_segments[0][tail_segments[0].find("\n") + 1:]
        segments += tail_segments
    skipped = total - SMALL_LOG_BYTES - tail.size
    if ended:
        note = (f"{name} gave {_size(total)}; read around its failure markers in its first {_size(SMALL_LOG_BYTES)}"
                + (f" and in its last {_size(tail.size)}" if skipped else " and in the rest"))
    else:
        note = (f"{name} had not ended after {_size(total)}, so reading stopped there; read around its failure"
                f" markers in its first {_size(SMALL_LOG_BYTES)} and in the last {_size(tail.size)} read"
                " (give a file's path to read all of it)")
    return LogText(segments=segments, size=total, name=name, windowed=True, notes=[note])


def _size(count: int) -> str:
    return f"{count / 2**20:.0f} MB" if count >= 2**20 else f"{count >> 10} KB"


class _Ring:
    """The latest `capacity` bytes written, kept in a file that never grows past `capacity`."""

    def __init__(self, handle: BinaryIO, capacity: int) -> None:
        self.handle, self.capacity, self.written = handle, capacity, 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        if len(view) > self.capacity:
            self.written += len(view) - self.capacity
            view = view[-self.capacity:]
        while view:
            at = self.written % self.capacity
            part = view[: self.capacity - at]
            self.handle.seek(at)
            self.handle.write(part)
            self.written += len(part)
            view = view[len(part):]

    @property
    def size(self) -> int:
        return min(self.written, self.capacity)


class _RingReader:
    """The ring's bytes, oldest first, as a read-only seekable file for the windowing code."""

    def __init__(self, ring: _Ring) -> None:
        self.ring, self.size, self.position = ring, ring.size, 0
        self.start = ring.written - self.size  # the stream offset of the oldest byte kept

    def seek(self, position: int) -> None:
        self.position = max(0, min(position, self.size))

    def read(self, count: int = -1) -> bytes:
        end = self.size if count < 0 else min(self.size, self.position + count)
        parts = []
        while self.position < end:
            at = (self.start + self.position) % self.ring.capacity
            length = min(end - self.position, self.ring.capacity - at)
            self.ring.handle.seek(at)
            parts.append(self.ring.handle.read(length))
            self.position += length
        return b"".join(parts)

    def readinto(self, buffer: bytearray | memoryview) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _read_seekable(handle: BinaryIO, size: int, name: str) -> LogText:
    if size <= SMALL_LOG_BYTES:
        return _decode_whole(handle.read(), name)
    sample = handle.read(64 * 1024)
    encoding = _sniff_encoding(sample, name)
    if encoding != "utf-8":
        # Windowing works on bytes; a wide encoding this large is rare enough to refuse plainly.
        raise LogReadError(f"{name}: {encoding} log larger than {SMALL_LOG_BYTES >> 20} MB; convert it to UTF-8 first")
    segments, kept = _window_segments(handle, size)
    note = f"log is {size / 2**20:.0f} MB; read {kept / 2**20:.1f} MB around {len(segments)} failure marker(s) and its tail"
    return LogText(segments=segments, size=size, name=name, windowed=True, notes=[note])


def _window_segments(handle: BinaryIO, size: int) -> tuple[list[str], int]:
    """The text of the windows worth parsing in a large UTF-8 log (see `_anchor_windows`), and the bytes they span."""
    windows = _anchor_windows(handle, size)
    segments = []
    for start, end in windows:
        handle.seek(start)
        segments.append(_decode(handle.read(end - start), "utf-8", trim_start=start > 0))
    return segments, sum(end - start for start, end in windows)


def _anchor_windows(handle: BinaryIO, size: int) -> list[tuple[int, int]]:
    """Offsets of the byte ranges worth parsing: around the first/last anchors, plus the tail."""
    overlap = max(len(a) for a in ANCHORS) - 1
    first: dict[bytes, list[int]] = {a: [] for a in ANCHORS}
    last: dict[bytes, deque[int]] = {a: deque(maxlen=HITS_PER_ANCHOR) for a in ANCHORS}
    # One buffer for the whole scan: the previous chunk's last bytes, then the next chunk read in place.
    buffer = bytearray(overlap + CHUNK_BYTES)
    view = memoryview(buffer)
    kept = 0
    offset = 0
    while True:
        read = handle.readinto(view[kept:])
        if not read:
            break
        filled = kept + read
        data = view[:filled]
        for anchor in ANCHORS:
            _collect_hits(buffer, filled, offset - kept, anchor, first[anchor], last[anchor])
        offset += read
        kept = min(overlap, filled)
        buffer[:kept] = data[filled - kept : filled]
        del data
    ranges = [(max(0, size - TAIL_BYTES), size)]
    for anchor in ANCHORS:
        for hit in {*first[anchor], *last[anchor]}:
            ranges.append((max(0, hit - WINDOW_BEFORE), min(size, hit + WINDOW_AFTER)))
    ranges.sort()
    merged: list[tuple[int, int]] = []
    for start, end in ranges:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _collect_hits(buf: bytearray, end: int, base: int, anchor: bytes, first: list[int], last: deque[int]) -> None:
    """Record the first hits overall and the last hits of buf[:end]: one pass over the buffer per anchor."""
    found_here: list[int] = []
    position = 0
    while len(first) < HITS_PER_ANCHOR:
        found = buf.find(anchor, position, end)
        if found < 0:
            # The forward search saw every hit in this buffer; no need to search backwards.
            _extend_last(last, found_here)
            return
        if base + found not in first:
            first.append(base + found)
        found_here.append(base + found)
        position = found + 1
    tail_hits = []
    while len(tail_hits) < HITS_PER_ANCHOR:
        found = buf.rfind(anchor, position, end)
        if found < 0:
            break
        tail_hits.append(base + found)
        end = found + len(anchor) - 1
    _extend_last(last, found_here + tail_hits[::-1])


def _extend_last(last: deque[int], hits: list[int]) -> None:
    for hit in hits:
        if not last or hit > last[-1]:
            last.append(hit)


def _sniff_encoding(sample: bytes, name: str) -> str:
    if sample.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    if sample.startswith(codecs.BOM_UTF8):
        return "utf-8-sig"
    if len(sample) >= 16:
        odd_nuls = sample[1::2].count(0)
        even_nuls = sample[0::2].count(0)
        half = len(sample) // 2
        if odd_nuls > 0.4 * half and even_nuls < 0.05 * half:
            return "utf-16-le"
        if even_nuls > 0.4 * half and odd_nuls < 0.05 * half:
            return "utf-16-be"
    if _looks_binary(sample):
        raise LogReadError(f"{name}: looks like binary data, not a text log")
    return "utf-8"


def _looks_binary(sample: bytes) -> bool:
    """Mostly control bytes (NULs aside, which crashed writers leave in real logs)."""
    body = sample.replace(b"\x00", b"")
    if not body:
        return bool(sample)
    control = sum(1 for byte in body[:8192] if byte < 9 or 13 < byte < 32 and byte != 27)
    return control > 0.1 * min(len(body), 8192)


def _decode_whole(data: bytes, name: str) -> LogText:
    encoding = _sniff_encoding(data[:64 * 1024], name)
    return LogText(segments=[_decode(data, encoding)], size=len(data), name=name, encoding=encoding)


def _decode(data: bytes, encoding: str, trim_start: bool = False) -> str:
    text = data.decode(encoding, errors="replace")
    if "\x00" in text:
        text = text.replace("\x00", "")
    if trim_start:
        # A window starts mid-line; drop the partial first line.
        newline = text.find("\n")
        text = text[newline + 1:] if newline >= 0 else text
    return text
