"""Reading hostile input: endless streams, binary devices, and lines built to make regexes backtrack."""

import os
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import ROOT

from triage.kb import load_knowledge_base
from triage.explain import explain_log
from triage.logparse import parse_text
from triage.logread import LogReadError, read_log

LINE = 65 * 1000
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "train.py", line 9, in <module>\n'
    "    loss = criterion(out, y)\n"
    "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x57600 and 64x128)\n"
)


@pytest.fixture(scope="module")
def kb():
    return load_knowledge_base(env={}, cwd=ROOT)


def _explain_seconds(text: str, kb, tmp_path) -> float:
    """The whole explain path on a log file: read, parse, match, and the known-message fallback."""
    log = tmp_path / "hostile.log"
    log.write_text(text)
    started = time.perf_counter()
    explain_log(str(log), kb)
    return time.perf_counter() - started


@pytest.mark.parametrize("line", ["loss" + " " * LINE + "loss", " " * LINE, "loss" + " " * LINE + "x"])
def test_a_65kb_whitespace_line_is_explained_in_under_a_second(line, kb, tmp_path):
    assert _explain_seconds(line + "\n", kb, tmp_path) < 1.0


def test_ten_65kb_whitespace_lines_are_explained_in_under_two_seconds(kb, tmp_path):
    assert _explain_seconds(("loss" + " " * LINE + "loss\n") * 10, kb, tmp_path) < 2.0


def test_ten_65kb_lines_beside_a_python_error_are_explained_in_under_two_seconds(kb, tmp_path):
    # A Python error leads, so explain also searches every other line for a known PyTorch message.
    python_error = 'Traceback (most recent call last):\n  File "t.py", line 1, in <module>\n    d["x"]\nKeyError: \'x\'\n'
    assert _explain_seconds(("loss" + " " * LINE + "loss\n") * 10 + python_error, kb, tmp_path) < 2.0


# Each prefix puts a line on the path of one of the parser's patterns (frames, IPython, pdb, rich, loggers,
# ranks, exception lines); each body repeats what that pattern's quantifiers could match in more than one way.
_PREFIXES = ["", "> ", "│ ", 'File "a", line 1, in f', "Input In [1], in f", "RuntimeError: ", "loss", "2024-01-01 00:00:00 ",
             "[rank0]: ", "E1105 12:34:56.789 ", "~/a in f(", "Cell In[1], line 1, in ", "-> 1 ", "│ ❱ 1 ", "> /a.py(1)f",
             "╭─ Traceback (most recent call last) ", "0: ", "a.cu:1: ", "Exception has occurred: RuntimeError", "ERROR:root:",
             "RuntimeError :", "RuntimeError:", "failed: RuntimeError('", "ERROR - sacred - ", "A.A.A.Error :",
             "Traceback (most recent call first): ", "12 ", "[1743] ", "&lt;", "    Traceback (most recent call last):",
             "Good luck!/a.py:1: UserWarning: "]  # fmt: skip
_BODIES = [" ", "loss ", "a", "a.", ")", "(1)", ":1 in a", "─", "\t", "nan ", "Error: ", "1", "] ", "`", 'File "a", line 1, in f ',
           "./", "!/a.py:1: UserWarning: "]


@pytest.mark.parametrize("prefix", _PREFIXES)
def test_no_parser_pattern_backtracks_on_a_long_line(prefix):
    slowest = max(
        (_parse_seconds(prefix + body * (LINE // len(body)) + "x"), body) for body in _BODIES
    )
    # A pattern that rescans the line once per character takes minutes on these; linear ones take milliseconds.
    assert slowest[0] < 1.0, f"{prefix!r} + {slowest[1]!r}: {slowest[0]:.2f}s"


def _parse_seconds(line: str) -> float:
    started = time.perf_counter()
    parse_text(line + "\n")
    return time.perf_counter() - started


def test_a_run_of_digits_where_a_line_number_goes_is_not_a_frame():
    incident = parse_text('  File "train.py", line ' + "9" * LINE + ", in main\nRuntimeError: boom\n")
    assert incident.exception.type == "RuntimeError"


def test_dev_zero_is_refused_from_its_first_chunk():
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "triage", "explain", "/dev/zero"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == "triage: /dev/zero: looks like binary data, not a text log"
    assert time.perf_counter() - started < 30


# Runs in a child with small budgets: feeds an endless text stream through a pipe, and reports the peak
# memory and the largest temporary file (sampled from /proc) it reached while reading.
_ENDLESS = textwrap.dedent("""
    import os, resource, sys, threading, time
    import triage.logread as logread
    logread.SMALL_LOG_BYTES = 1 << 20
    logread.CHUNK_BYTES = 1 << 20
    logread.STREAM_TAIL_BYTES = 4 << 20
    logread.STREAM_READ_BYTES = int(sys.argv[1]) << 20
    read_end, write_end = os.pipe()
    line = b"epoch 3 step 100 loss 0.512\\n" * 4096

    def produce():
        try:
            while True:
                os.write(write_end, line)
        except OSError:
            pass

    threading.Thread(target=produce, daemon=True).start()
    peak_disk = 0
    done = threading.Event()

    def sample():
        global peak_disk
        while not done.is_set():
            for fd in os.listdir("/proc/self/fd"):
                try:
                    target = os.readlink(f"/proc/self/fd/{fd}")
                    if "(deleted)" in target or target.startswith(("/tmp", os.environ.get("TMPDIR", "/tmp"))):
                        peak_disk = max(peak_disk, os.stat(f"/proc/self/fd/{fd}").st_size)
                except OSError:
                    pass
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    log = logread._read_stream(os.fdopen(read_end, "rb"), "<pipe>")
    done.set()
    sampler.join()
    kept = sum(len(s) for s in log.segments)
    print(log.size, kept, peak_disk, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, log.notes[0])
""")


def test_an_endless_pipe_is_read_within_a_fixed_memory_and_disk_budget(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    runs = {}
    for read_mb in (8, 96):
        done = subprocess.run([sys.executable, "-c", _ENDLESS, str(read_mb)], capture_output=True, text=True,
                              timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        runs[read_mb] = done.stdout.split(" ", 4)
    size, kept, peak_disk, peak_rss, note = runs[96]
    assert int(size) == 96 << 20  # reading stopped at the read budget
    assert 0 < int(peak_disk) <= 4 << 20  # the ring never grew past its budget (measured, not assumed)
    assert int(kept) <= (1 << 20) + (4 << 20)  # the head and the ring's windows, nothing more
    # Twelve times the input costs no more memory: nothing read accumulates.
    assert int(peak_rss) - int(runs[8][3]) < 8 << 20
    assert note.startswith("<pipe> had not ended after 96 MB")


def test_a_long_stream_that_ends_keeps_its_head_and_the_failure_at_its_end(monkeypatch):
    import triage.logread as logread

    monkeypatch.setattr(logread, "SMALL_LOG_BYTES", 1 << 16)
    monkeypatch.setattr(logread, "CHUNK_BYTES", 1 << 14)
    monkeypatch.setattr(logread, "STREAM_TAIL_BYTES", 1 << 18)
    filler = "".join(f"step {n} loss 0.5\n" for n in range(200_000)).encode()  # about 3.7 MB, wraps the ring many times
    stream = _Chunked(b"run starts\n" + filler + TRACEBACK.encode())
    log = logread._read_stream(stream, "<pipe>")
    assert log.segments[0].startswith("run starts")
    assert log.text.rstrip().endswith("(4x57600 and 64x128)")
    assert parse_text(log.text).exception.message == "mat1 and mat2 shapes cannot be multiplied (4x57600 and 64x128)"
    assert log.notes[0] == "<pipe> gave 4 MB; read around its failure markers in its first 64 KB and in its last 256 KB"


class _Chunked:
    """A non-seekable stream that hands out at most a few KB per read, like a pipe."""

    def __init__(self, data: bytes) -> None:
        self.data, self.position = data, 0

    def read(self, count: int) -> bytes:
        part = self.data[self.position : self.position + min(count, 4096)]
        self.position += len(part)
        return part


def test_the_ring_keeps_exactly_the_latest_bytes(tmp_path):
    from triage.logread import _Ring, _RingReader

    with open(tmp_path / "ring", "w+b") as handle:
        ring = _Ring(handle, 10)
        for piece in (b"abc", b"defghij", b"klmnopqrstu", b"vw", b"xyz"):
            ring.write(piece)
        reader = _RingReader(ring)
        assert reader.read() == b"qrstuvwxyz"
        reader.seek(3)
        buffer = bytearray(4)
        assert reader.readinto(buffer) == 4 and bytes(buffer) == b"tuvw"
        assert os.path.getsize(tmp_path / "ring") == 10


def test_a_missing_file_is_one_line():
    with pytest.raises(LogReadError, match=r"^nope\.log: no such file$"):
        read_log("nope.log")

