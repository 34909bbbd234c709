"""Parse a pasted log into an Incident: tracebacks, chains, ranks, workers and the lines around them.

Handles plain Python 3 and 2 tracebacks, IPython/Jupyter tracebacks of every
IPython generation, VS Code's "Exception has occurred" view, chained exceptions,
tracebacks nested inside messages (DataLoader workers, `mp.spawn`), interleaved
ranks, torchrun's failure summary, and logs with an error line but no traceback.

Stacks PyTorch prints beside a traceback are attached to their exception as
side frames, never read as tracebacks of their own: anomaly mode's "Traceback
of forward call that caused the error" (a warning printed just before the
traceback of the error raised in backward) and Dynamo's "from user code:"
(printed after the exception's message).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .incident import ExceptionInfo, Frame, Incident, is_user_path
from .logclean import LogLine, clean_lines
from .logread import LogText

MAX_FRAMES_HEAD = 50
MAX_FRAMES_TAIL = 200
MAX_MESSAGE_LINES = 400
MAX_MESSAGE_CHARS = 128 * 1024
MAX_EXCEPTIONS = 200
MAX_NESTING = 3
LOG_LINES_TAIL = 200
LOG_LINES_NOTABLE = 200

# Python's header; sacred's "(most recent calls WITHOUT Sacred internals)"; a paste that says it runs innermost first.
_TRACEBACK_HEAD = re.compile(
    r"\s*(?:Original )?Traceback \(most recent (?:call last|calls WITHOUT Sacred internals|call first)\):?\s*$"
)
_INNERMOST_FIRST = "(most recent call first)"
_RICH_HEAD = re.compile(r"╭─+ Traceback \(most recent call last\) ─+╮")
# Numbers are at most 9 digits: a hostile 65 KB run of digits would otherwise reach int() and overflow its limit.
_RICH_FRAME = re.compile(r"(?P<file>[^\s│╭╰].*?):(?P<line>\d{1,9})(?: in ?(?P<func>[\w.<>]*))?$")
# How far into a box pasted without its header the first frame header may be.
RICH_HEADERLESS_LOOKAHEAD = 40
_RICH_ARROW = re.compile(r"❱\s*\d+\s*(?:│\s*)*(?P<code>.*)$")
_IPYTHON_HEAD = re.compile(r"(?P<type>[A-Za-z_][\w.]*)\s{2,}Traceback \(most recent call last\)")
_VSCODE_HEAD = re.compile(r"Exception has occurred: (?P<type>[A-Za-z_][\w.]*)\s*$")
# Side stacks: anomaly mode's forward trace comes before its exception, Dynamo's traced user code after.
FORWARD_CALL = "forward call"
USER_CODE = "user code"
_FORWARD_HEAD = "Traceback of forward call that caused the error"
_FORWARD_HEAD_ANY = "Traceback of forward call"  # also "...that induced the previous calculation" (double backward)
_USER_CODE_HEAD = "from user code:"
# How many lines may separate a side stack from the exception it belongs to.
SIDE_GAP_LINES = 60
_CAUSE = "The above exception was the direct cause of the following exception"
_CONTEXT = "During handling of the above exception, another exception occurred"

# Each pattern below is linear in the line's length: no two neighbouring quantifiers can match the same
# characters (a lazy `.+?` before `\s*$` re-scanned a run of spaces once per space: a 65 KB line took minutes).
_FRAME = re.compile(r'\s*File "(?P<file>[^"]*)", line (?P<line>\d{1,9})(?:, in (?P<func>.*\S))?\s*$')
_IPY_CELL = re.compile(r"\s*Cell In ?\[(?P<cell>\d{1,9})\], line (?P<line>\d{1,9})(?:, in (?P<func>[^(\s]+))?")
_IPY_INPUT = re.compile(r"\s*Input In ?\[(?P<cell>\d{1,9})\], in (?P<func>.*\S)\s*$")  # a trailing "()" is cut after
_IPY_FILE = re.compile(r"\s*File (?P<file>[^\"\s].*?):(?P<line>\d{1,9}), in (?P<func>[^(\s]+)")
_IPY_OLD = re.compile(r"(?P<file><ipython-input-[^>]+>|[~/.][^\s]*|[A-Za-z]:\\\S*) in (?P<func><cell line: \d{1,9}>|[\w.<>]+)(?:\(.*\))?\s*$")
_IPY_ARROW = re.compile(r"-*> ?(?P<line>\d{1,9})\s(?P<code>.*)$")
_IPY_CONTEXT_LINE = re.compile(r"\s+\d+\s")
_CARETS = re.compile(r"\s*[~^]+\s*$")
_REPEATED = re.compile(r"\s*\[Previous line repeated (?P<count>\d{1,9}) more times?\]")

# After a traceback's frames: `RuntimeError: msg`, `torch.OutOfMemoryError: msg`, `_queue.Empty`.
_EXCEPTION_LINE = re.compile(r"(?P<type>(?:[A-Za-z_]\w*\.)*_?[A-Z]\w*)(?::(?: (?P<msg>.*)|$)|$)")
# With no traceback around it, only names that read as errors count: ASCII names (`\w` would take the CJK prose a
# paste glues to the type, "...出现错误ValueError: ...", into it).
_BARE_ERROR_LINE = re.compile(
    r"(?P<type>(?:[A-Za-z_]\w*\.)*[A-Za-z0-9_]*(?:Error|Exception|Interrupt|Exit|Failure)|(?:[a-z_]\w*\.){2,}[A-Z]\w*)"
    r"(?::(?: (?P<msg>.*)|$)|$)"
)

# An exception line with something in front of it: prose ("error occur : RuntimeError: ..."), a quote mark,
# a word such as `actual error:`, code it was glued to. It starts an ASCII word (CJK prose may touch it) and
# needs ": " and a message.
_ERROR_IN_LINE = re.compile(
    r"(?<![A-Za-z0-9_.])(?P<type>(?:[A-Za-z_]\w*\.)*_?[A-Z]\w*(?:Error|Exception|Interrupt|Failure))"
    r": (?P<msg>\S.*)"
)
# An exception shown as its repr, as frameworks log a caught one: `RuntimeError('CUDA error: ...')`.
_ERROR_REPR = re.compile(
    r"(?<![A-Za-z0-9_.])(?P<type>(?:[A-Za-z_]\w*\.)*_?[A-Z]\w*(?:Error|Exception))\((?P<quote>['\"])(?P<msg>[^'\"\n]{1,4000})(?P=quote),?\)"
)
_CLOSING = {"`": "`", '"': '"', "'": "'", "“": "”", "(": ")"}


def _inside_quotes(text: str, start: int) -> str:
    """The error from `start` on; when a quote or backtick opened just before it, only up to its closing mark."""
    opened = text[start - 1] if start > 0 else ""
    closing = _CLOSING.get(opened)
    end = text.find(closing, start) if closing else -1
    return text[start:end] if end > 0 else text[start:]


# Colab folds library frames into a line "4 frames"; the traceback goes on after it.
_FOLDED_FRAMES = re.compile(r"\d+ frames?")
# A traceback cut off before its exception line, whose last frame raises a literal message.
_RAISE_LITERAL = re.compile(r"raise (?P<type>(?:[A-Za-z_]\w*\.)*[A-Z]\w*)\([fFrRbBuU]{0,2}(?P<quote>[\"'])(?P<msg>[^\"']+)(?P=quote)?")
# Lines a paster puts where frames were left out.
_ELISIONS = ("...", "…", "[...]", "(...)")

_WIDE_BLANKS = re.compile(r"[ \t]{64,}")

# Lines that never continue an exception message, though printed right after one.
# (PyCharm's console prints `python-BaseException` under each traceback it shows.)
_NOT_MESSAGE = re.compile(
    r"\S+\.(?:cu|cuh|cpp|h|c):\d+: .*Assertion `|\S+:\d+:\d+ \[\d+\] NCCL (?:INFO|WARN)|\[W\d{3,4} "
    r"|python-BaseException\s*$"
)
_WORKER = re.compile(r"in DataLoader worker process (?P<worker>\d{1,9})")
_SPAWNED_PROCESS = re.compile(r"-- Process (?P<rank>\d{1,9}) terminated with the following error")
_WRAPPER_TYPES = {"ChildFailedError", "ProcessRaisedException", "ProcessExitedException", "Empty"}

_TORCHRUN_RANK = re.compile(r"^\s*rank\s*:\s*(?P<rank>\d{1,9}) \(local_rank:")
_TORCHRUN_EXIT = re.compile(r"^\s*exitcode\s*:\s*(?P<code>-?\d{1,9})")
_SIGNAL_RECEIVED = re.compile(r"Signal (?P<num>\d{1,9}) \((?P<name>SIG[A-Z]+)\) received by PID")
# The shell's report of a signal death: alone on its line, after the job's pid (`line 9:  5120 Killed`) or job number
# (`[1]+  Killed`), or glued after a progress bar's closing bracket (tqdm writes its bar without a newline, so
# `... 3.06it/s]Killed`); the command follows in a padded column. zsh's is `zsh: killed     python train.py`.
# The word inside a sentence ("my run got Killed after 3 epochs") is the reporter's account, not the shell's report.
_SHELL_DEATH = re.compile(
    r"(?:^\s*|\]|(?<=\d)\s+|[+-]\s+)(?P<what>Killed|zsh: killed|Segmentation fault|Bus error|Aborted"
    r"|Floating point exception|Illegal instruction)"
    r"(?:\s*\(core dumped\))?(?:\s{2,}\S.*)?\s*$"
)
_FATAL_PYTHON = re.compile(r"Fatal Python error: (?P<what>Segmentation fault|Bus error|Aborted|Floating point exception)")
_SIGNALS = {
    "Killed": ("SIGKILL", 9),
    "zsh: killed": ("SIGKILL", 9),
    "Segmentation fault": ("SIGSEGV", 11),
    "Bus error": ("SIGBUS", 7),
    "Aborted": ("SIGABRT", 6),
    "Floating point exception": ("SIGFPE", 8),
    "Illegal instruction": ("SIGILL", 4),
}
_NAN_LINE = re.compile(
    r"(?i)(?:loss|grad(?:ient)?s?(?:[ _]norm)?)['\"\]]?\s*(?:[=:]\s*)?[-+]?(?:nan|inf)\b"
    r"|\bnan\b[^\n]{0,30}\b(?:loss|detected|encountered)\b"
    r"|non-finite (?:loss|gradients|model output) at step \d+"  # the wrapper's own report lines
)
# A progress line's step counter: `batch 0`, `Step: 20`, `iter[ 14/ 15]`, `[step]    89` (not an epoch's number).
_PROGRESS_INDEX = re.compile(r"(?i)(?<![\w.])(?:batch|step|iter|iteration)(?:\]|\b)[\s:=#\[]{0,8}(\d{1,9})\b")
# The training-health checks' findings (triage/health.py): a run that ended without learning.
_SILENT_LINE = re.compile(r"triage: silent: [a-z-]+: ")
# Words that make a line worth keeping from anywhere in a log; plain substring tests on the
# lower-cased line, which are far cheaper than a case-insensitive alternation.
_NOTABLE_WORDS = (
    "error", "assert", "nan", "inf", "killed", "signal", "nccl", "warn", "exception", "timeout",
    "timed out", "fail", "out of memory", "segmentation", "abort", "silent:",
)  # fmt: skip
_DEATH_WORDS = (
    "Signal ", "exitcode", "rank", "Killed", "zsh: killed", "fault", "Bus error", "Aborted", "exception", "instruction",
)  # fmt: skip


@dataclass
class _Stream:
    """The lines of one rank (or of unprefixed output), parsed on their own."""

    lines: list[LogLine]
    exceptions: list[ExceptionInfo] = field(default_factory=list)
    context: list[LogLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Anomaly forward traces no exception followed: a frameless error line may own them (printed before them).
    orphan_sides: list["_SideStack"] = field(default_factory=list)


@dataclass
class _SideStack:
    """A side stack read from the log, with its lines, kept until its exception is known."""

    label: str
    frames: list[Frame]
    lines: list[LogLine]

    @property
    def end_number(self) -> int:
        return self.lines[-1].number if self.lines else 0


def parse_log(log: LogText) -> Incident:
    """Parse everything kept from a log into one Incident."""
    streams: list[_Stream] = []
    number = 1
    for segment in log.segments:
        lines = clean_lines(segment, first_number=number)
        number += len(lines) + 1
        by_rank: dict[int | None, list[LogLine]] = {}
        for line in lines:
            by_rank.setdefault(line.rank, []).append(line)
        streams.extend(_Stream(stream_lines) for stream_lines in by_rank.values())
    for stream in streams:
        _TracebackScanner(stream).scan()
    incident = _assemble(streams)
    incident.notes[:0] = log.notes
    return incident


def parse_text(text: str) -> Incident:
    """Parse log text already in memory (rule examples, tests, the live runner's stderr)."""
    return parse_log(LogText(segments=[text], size=len(text), name="<text>"))


class _TracebackScanner:
    def __init__(self, stream: _Stream, depth: int = 0) -> None:
        self.stream = stream
        self.lines = stream.lines
        self.depth = depth
        self.pending_link: str | None = None
        # An anomaly-mode forward trace waiting for the exception printed after it.
        self.pending_side: _SideStack | None = None
        # The exception added last and the log line its message ended on (for Dynamo's "from user code:").
        self.last_added: ExceptionInfo | None = None
        self.last_end = 0
        # The rank an `mp.spawn` wrapper named for the child's traceback that follows it.
        self.pending_rank: int | None = None

    def scan(self) -> None:
        lines, i = self.lines, 0
        while i < len(lines):
            text = lines[i].text
            if _FORWARD_HEAD_ANY in text:
                self.stream.context.append(lines[i])  # the warning line stays a log line
                i = self._read_side_stack(i + 1, FORWARD_CALL if _FORWARD_HEAD in text else "")
                continue
            if _USER_CODE_HEAD in text and text.strip() == _USER_CODE_HEAD:
                self.stream.context.append(lines[i])
                i = self._read_side_stack(i + 1, USER_CODE)
                continue
            if "Traceback" in text and text.startswith("╭") and _RICH_HEAD.match(text):
                i = self._read_rich_traceback(i + 1)
                continue
            if text.startswith("│") and self._starts_rich_frames(i):
                # rich's box pasted from its middle: its header line and first frames were left out.
                i = self._read_rich_traceback(i)
                continue
            if "Traceback" in text and (_TRACEBACK_HEAD.match(text) or _IPYTHON_HEAD.match(text)):
                ipython = _IPYTHON_HEAD.match(text)
                added = len(self.stream.exceptions)
                # `^CTraceback`: the user pressed Ctrl-C; cut before its last line, it still was a KeyboardInterrupt.
                interrupted = i > 0 and lines[i - 1].number == lines[i].number and lines[i - 1].text.strip() == "^C"
                preset = ipython.group("type") if ipython else "KeyboardInterrupt" if interrupted else None
                i = self._read_traceback(i + 1, preset_type=preset, innermost_first=_INNERMOST_FIRST in text)
                if text.lstrip().startswith("Original") and len(self.stream.exceptions) > added:
                    self._name_worker_from_caught_line(self.stream.exceptions[added])
                continue
            if text.startswith("Exception has occurred"):
                vscode = _VSCODE_HEAD.match(text)
                if vscode:
                    i = self._read_vscode(i + 1, vscode.group("type"))
                    continue
            if 'File "' in text and _FRAME.match(text):
                # A traceback pasted without its header: its frames start here.
                i = self._read_traceback(i)
                continue
            if self._starts_ipython_frames(i):
                # An IPython traceback pasted without its header line.
                i = self._read_traceback(i)
                continue
            spawned = _SPAWNED_PROCESS.search(text) if text.startswith("-- Process") else None
            last = self.last_added
            if spawned and last is not None and not last.message and lines[i].number - self.last_end <= 2:
                # torch < 1.8's mp.spawn raised a bare `Exception` whose message (the child's traceback) follows a
                # blank line: that exception only wraps the child's, which comes next.
                last.wrapper = True
                self.pending_rank = int(spawned.group("rank"))
            if _CAUSE in text:
                self.pending_link = "cause"
            elif _CONTEXT in text:
                self.pending_link = "context"
            else:
                self.stream.context.append(lines[i])
            i += 1
        if self.pending_side is not None:
            self.stream.context.extend(self.pending_side.lines)
            self.stream.orphan_sides.append(self.pending_side)
            self.pending_side = None

    def _starts_rich_frames(self, i: int) -> bool:
        """A run of `│ ... │` box lines with a rich frame header (`│ path:line in func │`) among its first."""
        for j in range(i, min(i + RICH_HEADERLESS_LOOKAHEAD, len(self.lines))):
            if not self.lines[j].text.startswith("│"):
                return False
            if _rich_header(self.lines, j):
                return True
        return False

    def _starts_ipython_frames(self, i: int) -> bool:
        """An IPython frame header (`path in func(...)`, `File path:N, in func`) followed by its numbered code."""
        text = self.lines[i].text
        if not (text.startswith(("File ", "/", "~", "<ipython-input")) and i + 1 < len(self.lines)):
            return False
        if not (_IPY_FILE.match(text) or _IPY_OLD.match(text)):
            return False
        following = self.lines[i + 1].text
        return bool(_IPY_CONTEXT_LINE.match(following) or _IPY_ARROW.match(following.strip()))

    def _read_side_stack(self, i: int, label: str) -> int:
        """Read the frames after a side stack's header and give them to their exception."""
        frames, end = read_side_frames(self.lines, i)
        if not frames:
            return end
        side = _SideStack(label, frames, self.lines[i:end])
        if label == USER_CODE:
            # Dynamo prints it after the message of the exception it belongs to.
            target = self.last_added
            if target is not None and not target.side_frames and side.lines[0].number - self.last_end <= SIDE_GAP_LINES:
                target.side_frames, target.side_label = frames, label
            else:
                self.stream.context.extend(side.lines)
        elif label == FORWARD_CALL:
            # Anomaly mode warns before the traceback of the error raised in backward.
            if self.pending_side is not None:
                self.stream.context.extend(self.pending_side.lines)
            self.pending_side = side
        else:
            self.stream.context.extend(side.lines)  # an earlier calculation's trace (double backward): plain log lines
        return end

    def _read_vscode(self, i: int, exc_type: str) -> int:
        message: list[str] = []
        while i < len(self.lines) and not _FRAME.match(self.lines[i].text) and len(message) < MAX_MESSAGE_LINES:
            if self.lines[i].text.strip():
                message.append(self.lines[i].text)
            i += 1
        return self._read_traceback(i, preset_type=exc_type, preset_message="\n".join(message))

    def _name_worker_from_caught_line(self, exc: ExceptionInfo) -> None:
        """A worker's "Original Traceback" pasted after the outer error line but read on its own (the paste
        starts at `KeyError: Caught KeyError in DataLoader worker process 0.`): that line is the wrapper, as
        when the main process's traceback is pasted too, and the worker is the one it names."""
        for line in reversed(self.stream.context[-3:]):
            worker = _WORKER.search(line.text) if "DataLoader worker" in line.text else None
            caught = _BARE_ERROR_LINE.match(line.text.strip()) if worker else None
            if caught and exc.worker is None:
                exc.worker = int(worker.group("worker"))
                wrapper = ExceptionInfo(caught.group("type"), caught.group("msg") or "", [], rank=line.rank,
                                        line_no=line.number)
                wrapper.wrapper = True
                self.stream.context.remove(line)
                self.stream.exceptions.insert(self.stream.exceptions.index(exc), wrapper)
                return

    def _read_traceback(
        self, i: int, preset_type: str | None = None, preset_message: str = "", innermost_first: bool = False
    ) -> int:
        lines = self.lines
        head: list[Frame] = []
        tail: deque[Frame] = deque(maxlen=MAX_FRAMES_TAIL)
        omitted = 0
        frame: Frame | None = None
        start_number = lines[i - 1].number if i > 0 else (lines[0].number if lines else 0)
        # A whole traceback pasted indented (a quote block, a list item): its error line is as indented as its header.
        header = lines[i - 1].text if i > 0 and "Traceback" in lines[i - 1].text else ""
        base_indent = len(header) - len(header.lstrip()) if header else 0

        def push(new: Frame) -> Frame:
            nonlocal omitted
            if len(head) < MAX_FRAMES_HEAD:
                head.append(new)
            else:
                if len(tail) == tail.maxlen:
                    omitted += 1
                tail.append(new)
            return new

        while i < len(lines):
            text = lines[i].text
            stripped = text.strip()
            match = _FRAME.match(text)
            if match:
                frame = push(_frame(match.group("file"), match.group("line"), match.group("func") or "<module>"))
                i += 1
                continue
            if not stripped or _FOLDED_FRAMES.fullmatch(stripped) or stripped in _ELISIONS:
                i += 1  # blank, Colab's "4 frames", or frames the paster left out ("...")
                continue
            ipy_frame = _ipython_frame(text)
            if ipy_frame is not None:
                frame = push(ipy_frame)
                i += 1
                continue
            if frame is not None and text[0] in " \t-":
                if lines[i].record_start and frame.code is not None and _EXCEPTION_LINE.match(stripped):
                    break  # a logger's padding indents the exception line too
                if base_indent and len(text) - len(text.lstrip()) <= base_indent and _EXCEPTION_LINE.match(stripped):
                    break  # the error line of a traceback pasted indented as a whole
                arrow = _IPY_ARROW.match(stripped) if text[0] == "-" or stripped.startswith("-") else None
                if arrow:
                    frame.line = frame.line or int(arrow.group("line"))
                    frame.code = arrow.group("code").strip()
                elif _REPEATED.match(text):
                    omitted += int(_REPEATED.match(text).group("count"))
                elif frame.code is None and not _CARETS.match(text) and not _IPY_CONTEXT_LINE.match(text):
                    frame.code = stripped
                i += 1
                continue
            if text[0] in " \t" and (_CARETS.match(text) or _IPY_CONTEXT_LINE.match(text)):
                i += 1
                continue
            if frame is not None and frame.code is None and _FRAME.match(lines[i - 1].text) and _is_flat_code(text):
                # A paste that lost its indentation: the frame's code line sits flush under its `File` line.
                frame.code = stripped
                i += 1
                continue
            break

        frames = head + list(tail)
        if innermost_first or _pasted_innermost_first(frames):
            frames.reverse()
            self.stream.notes.append(f"the traceback at line {start_number} lists its frames innermost first;"
                                     " read in Python's order")
        return self._finish(i, frames, omitted, start_number, preset_type, preset_message)

    def _read_rich_traceback(self, i: int) -> int:
        """rich's boxed traceback (Lightning CLI, typer): `│ path:line in func │` frames, `❱ N │ code` lines."""
        lines = self.lines
        frames: list[Frame] = []
        start_number = lines[i - 1].number
        while i < len(lines):
            text = lines[i].text
            if text.startswith("╰"):
                i += 1
                break
            if not text.startswith("│"):
                break
            inner = text[1:].rstrip().removesuffix("│").strip()
            header = _rich_header(lines, i)
            if header:
                function = header.group("func")
                if not function and i + 1 < len(lines):
                    # A long header wraps: the function name (with or without its `in `) is alone on the next line.
                    i += 1
                    function = lines[i].text[1:].rstrip().removesuffix("│").strip().removeprefix("in ").strip()
                frames.append(_frame(header.group("file"), header.group("line"), function or "<unknown>"))
            elif inner.startswith("❱") and frames:
                arrow = _RICH_ARROW.match(inner)
                if arrow:
                    frames[-1].code = arrow.group("code").strip()
            i += 1
        frames = frames[:MAX_FRAMES_HEAD] + frames[MAX_FRAMES_HEAD:][-MAX_FRAMES_TAIL:]
        return self._finish(i, frames, 0, start_number, None, "")

    def _finish(
        self, i: int, frames: list[Frame], omitted: int, start_number: int, preset_type: str | None, preset_message: str
    ) -> int:
        """Read the exception line and its message after a traceback's frames."""
        lines = self.lines
        if i < len(lines) and (lines[i].record_start or (lines[i].text[:1] in " \t"
                                                          and _EXCEPTION_LINE.match(lines[i].text.lstrip()))):
            lines[i] = LogLine(lines[i].text.lstrip(), lines[i].number, lines[i].rank, lines[i].record_start)
        if i < len(lines) and not _EXCEPTION_LINE.match(lines[i].text):
            # The error line with a prefix in front (`actual error: `, a quote mark, the code it was glued to).
            inside = _ERROR_IN_LINE.search(lines[i].text)
            if inside:
                lines[i] = LogLine(_inside_quotes(lines[i].text, inside.start()), lines[i].number, lines[i].rank,
                                   lines[i].record_start)
        if i >= len(lines) or not _EXCEPTION_LINE.match(lines[i].text):
            end_number = lines[i - 1].number if i > 0 else start_number
            raised = _RAISE_LITERAL.search(frames[-1].code or "") if frames and not preset_type else None
            if raised:
                # Cut off before its exception line, but the last frame says what it raised.
                self._add(ExceptionInfo(raised.group("type"), raised.group("msg"), frames, line_no=start_number),
                          omitted, end_number)
                self.stream.notes.append(f"a traceback at line {start_number} is cut off; its last frame raises"
                                         f" {raised.group('type')}")
            elif preset_type:
                self._add(ExceptionInfo(preset_type, preset_message, frames, line_no=start_number), omitted, end_number)
            elif frames:
                # Cut off before the exception line: keep the frames, say so.
                self._add(ExceptionInfo("", "", frames, line_no=start_number), omitted, end_number)
                self.stream.notes.append(_cut_off_note(start_number))
            return i

        match = _EXCEPTION_LINE.match(lines[i].text)
        exc_type = match.group("type")
        # Where every line carries a timestamp, a new record does not end the message.
        every_line_stamped = lines[i].record_start
        message_lines = [match.group("msg") or ""]
        nested = "Traceback (most recent call last)" in message_lines[0]  # torch 0.x: the worker's traceback follows
        i += 1
        size = len(message_lines[0])
        while i < len(lines) and len(message_lines) < MAX_MESSAGE_LINES and size < MAX_MESSAGE_CHARS:
            line = lines[i]
            text = line.text
            if not text.strip() and len(message_lines) == 1:
                # A headline that ends on a colon goes on after a fence or blank line the paste put inside it.
                i = _message_resumes(lines, i, message_lines[0])
                if i < len(lines) and lines[i].text.strip():
                    continue
            if not text.strip() or (line.record_start and not every_line_stamped):
                break
            if "Traceback" in text and not text.lstrip().startswith("Original") and _TRACEBACK_HEAD.match(text):
                break
            if _CAUSE in text or _CONTEXT in text:
                break
            if _NOT_MESSAGE.match(text):
                break  # a CUDA kernel's assertion or an NCCL line printed right after the error
            if 'File "' in text and _FRAME.match(text) and not nested:
                break  # another traceback's frames interleaved with this one (a spawned child and its parent)
            # A nested traceback (a worker's, torch 0.x's) or Dynamo's "from user code:" block keeps its frames.
            nested = nested or "Traceback (most recent call last)" in text or _USER_CODE_HEAD in text
            message_lines.append(text)
            size += len(text)
            i += 1
        message = "\n".join(message_lines).strip("\n")
        if not message.strip() and preset_message:
            message = preset_message
        self._add(ExceptionInfo(exc_type, message.strip(), frames, line_no=start_number), omitted, lines[i - 1].number)
        return i

    def _add(self, exc: ExceptionInfo, omitted: int, end_number: int) -> None:
        if len(self.stream.exceptions) >= MAX_EXCEPTIONS:
            return
        exc.link, self.pending_link = self.pending_link, None
        side, self.pending_side = self.pending_side, None
        if side is not None:
            if (exc.line_no or 0) - side.end_number <= SIDE_GAP_LINES:
                exc.side_frames, exc.side_label = side.frames, side.label
            else:
                self.stream.context.extend(side.lines)
        if not exc.side_frames and _USER_CODE_HEAD in exc.message:
            # A live exception's message, or a pasted one whose blank lines were lost, holds Dynamo's block.
            exc.side_label, exc.side_frames = side_stack_in_text(exc.message)
        self.last_added, self.last_end = exc, end_number
        exc.rank = self.lines[0].rank if self.lines else None
        if self.pending_rank is not None and not exc.wrapper:
            exc.rank, self.pending_rank = self.pending_rank, None
        if omitted:
            self.stream.notes.append(f"{exc.type or 'a traceback'}: {omitted} frames not shown")
        self.stream.exceptions.append(exc)
        if self.depth < MAX_NESTING and "Traceback (most recent call last)" in exc.message:
            self._unwrap_nested(exc)

    def _unwrap_nested(self, outer: ExceptionInfo) -> None:
        """A traceback inside a message (DataLoader worker, mp.spawn child) is the real failure."""
        inner_lines = [
            LogLine(text, (outer.line_no or 0) + n, outer.rank)
            for n, text in enumerate(outer.message.split("\n"), start=1)
        ]
        inner = _Stream(inner_lines)
        _TracebackScanner(inner, depth=self.depth + 1).scan()
        if not inner.exceptions:
            return
        worker = _WORKER.search(outer.message)
        spawned = _SPAWNED_PROCESS.search(outer.message)
        for exc in inner.exceptions:
            exc.worker = int(worker.group("worker")) if worker else exc.worker
            exc.rank = int(spawned.group("rank")) if spawned else exc.rank
        outer.wrapper = True
        self.stream.exceptions.extend(inner.exceptions)
        self.stream.notes.extend(inner.notes)


def read_side_frames(lines: list[LogLine], i: int) -> tuple[list[Frame], int]:
    """The `File "...", line N, in f` frames of a side stack starting at `i`, each with its code line.

    Stricter than a traceback: a frame takes one code line, indented deeper than its `File` line, and
    carets; anything else ends the stack, so the warning's own lines after it (`(Triggered internally
    at ...)`, the source line of the warning) are not read as code. Returns the frames and the index
    after them.
    """
    head: list[Frame] = []
    tail: deque[Frame] = deque(maxlen=MAX_FRAMES_TAIL)
    frame: Frame | None = None
    indent = 0
    while i < len(lines):
        text = lines[i].text
        match = _FRAME.match(text)
        if match:
            frame = _frame(match.group("file"), match.group("line"), match.group("func") or "<module>")
            (head if len(head) < MAX_FRAMES_HEAD else tail).append(frame)
            indent = len(text) - len(text.lstrip())
            i += 1
            continue
        stripped = text.strip()
        if frame is None or not stripped or len(text) - len(text.lstrip()) <= indent:
            break
        if _CARETS.match(text):
            i += 1
            continue
        if frame.code is not None:
            break
        frame.code = stripped
        i += 1
    return head + list(tail), i


def side_stack_in_text(text: str) -> tuple[str, list[Frame]]:
    """The side stack inside one text, as (label, frames): a Dynamo message's "from user code:" block, or
    anomaly mode's warning with its forward trace. ("", []) when there is none."""
    for label, header in ((USER_CODE, _USER_CODE_HEAD), (FORWARD_CALL, _FORWARD_HEAD)):
        at = text.rfind(header)
        if at < 0:
            continue
        body = text[at:].split("\n")[1:]
        frames, _ = read_side_frames([LogLine(line.rstrip("\r"), number) for number, line in enumerate(body)], 0)
        if frames:
            return label, frames
    return "", []


def adopt_known_message(
    incident: Incident, recognise: Callable[[str], tuple[str, int] | None], beside: bool = False
) -> bool:
    """For a log that held no exception line: the first message `recognise` knows becomes its exception.

    Real pastes drop the exception type (`Expected all tensors to be on the same device...`), quote or
    indent the message, or put it mid-sentence. `recognise(text)` returns the exception type that message
    is raised as and where in `text` it starts (the knowledge base's message patterns know both), or None.
    The exception's message runs from the start of that line to the next blank line.

    With `beside`, the log has an exception, but a Python one no PyTorch rule explains: a known message
    on another line (or in another exception's message) becomes the root, the Python error stays listed.
    """
    if not beside and any(exc.type and exc.message for exc in incident.exceptions):
        return False
    root = incident.exception
    # A wrapper's message ("Caught KeyError in DataLoader worker process 0") only points at the root.
    # Nor does a spawned child's EOFError, the echo of its parent's error.
    others = [exc.message for exc in incident.exceptions if beside and exc is not root and exc.message
              and not exc.wrapper and exc.short_type not in _WRAPPER_TYPES and not exc.spawn_echo]
    # No message needs a run of 64 blanks; collapsing them keeps every pattern's search short on padded lines.
    lines = [_WIDE_BLANKS.sub(" ", line) for line in [*incident.log_lines, *"\n\n".join(others).split("\n")]]
    text = "\n".join(lines)
    found = recognise(text)
    if found is None:
        return False
    exc_type, start = found
    first = text.count("\n", 0, start)
    block = []
    for line in lines[first : first + MAX_MESSAGE_LINES]:
        if not line.strip() or (block and _mostly_non_ascii(line)):
            break  # a blank line, or the reporter's own words after the message (PyTorch's messages are ASCII)
        block.append(line)
    message = "\n".join(block)
    cut = start - (text.rfind("\n", 0, start) + 1)  # what came before the message on its line: a prompt, prose
    if root is not None and root.type and not root.message and exc_type in ("", root.short_type):
        # A traceback whose message was printed apart from it (a notebook's JSON, a cut paste): join them.
        root.message = message[cut:].strip()
        exc = root
    else:
        exc = ExceptionInfo(exc_type, message[cut:].strip(), [], line_no=None)
        incident.exceptions.append(exc)
        incident.exception = exc
    if beside:
        incident.notes.append(f"{root.type if root else 'the error'} is not a PyTorch error; the log's PyTorch message"
                              f" {message[cut:][:60]!r} is read as the failure")
    else:
        incident.notes.append(f"no exception line; read the known message {message[cut:][:60]!r}"
                              f" as a {exc.type or 'error'}")
    return True


def _mostly_non_ascii(line: str) -> bool:
    """A line whose letters are mostly not ASCII: prose in the reporter's language (Chinese, Russian...), not a
    continuation of a PyTorch message (paths may hold such names, so one word does not count)."""
    letters = [c for c in line if c.isalpha()]
    return len(letters) >= 4 and sum(not c.isascii() for c in letters) > len(letters) / 2


def _rich_header(lines: list[LogLine], i: int) -> re.Match[str] | None:
    """The frame header on box line `i`: `path:line in func`, or `path:line` with `in func` alone on the next line."""
    inner = lines[i].text[1:].rstrip().removesuffix("│").strip()
    if ":" not in inner:
        return None
    header = _RICH_FRAME.match(inner)
    if header is None or header.group("func") is not None:
        return header
    following = lines[i + 1].text[1:].strip() if i + 1 < len(lines) and lines[i + 1].text.startswith("│") else ""
    return header if following.startswith("in ") else None


def _is_flat_code(text: str) -> bool:
    """Whether a line flush against the margin inside a traceback is a frame's code, not what ends the frames."""
    stripped = text.strip()
    return not (_EXCEPTION_LINE.match(stripped) or _BARE_ERROR_LINE.match(stripped) or "Traceback" in stripped
                or _CAUSE in stripped or _CONTEXT in stripped or _ERROR_IN_LINE.search(stripped))


def _pasted_innermost_first(frames: list[Frame]) -> bool:
    """Frames pasted in reverse: the script's `<module>` frame, always the outermost, comes last.

    Only when nothing else explains a final `<module>` frame: it is the traceback's only `<module>` frame,
    the first frame is library code, the last is the user's, and its code is not an import (a module that
    fails while it is imported puts its `<module>` frame last in Python's own order).
    """
    if len(frames) < 2 or frames[-1].function != "<module>" or not frames[-1].user or frames[0].user:
        return False
    if (frames[-1].code or "").startswith(("import ", "from ")):
        return False  # an import that failed at module level: the `<module>` frame really is the innermost
    return sum(frame.function == "<module>" for frame in frames) == 1


# A path a terminal wrapped and the paste joined with the padding of the wrapped line (`.../dataload      er.py`).
_WRAP_GAP = re.compile(r" {8,}")


def _frame(file: str, line: str | None, function: str) -> Frame:
    if "        " in file:
        file = _WRAP_GAP.sub("", file)
    return Frame(file=file, line=int(line) if line else None, function=function.strip(), user=is_user_path(file))


def _ipython_frame(text: str) -> Frame | None:
    match = _IPY_CELL.match(text)
    if match:
        function = match.group("func") or "<cell>"
        return Frame(f"Cell In[{match.group('cell')}]", int(match.group("line")), function, user=True)
    match = _IPY_INPUT.match(text)
    if match:
        return Frame(f"Input In [{match.group('cell')}]", None, match.group("func").removesuffix("()").rstrip(), user=True)
    if text.startswith("File ") or text.startswith(" File "):
        match = _IPY_FILE.match(text)
        if match:
            return _frame(match.group("file"), match.group("line"), match.group("func"))
    if text[0] not in " \t-":
        match = _IPY_OLD.match(text)
        if match:
            return _frame(match.group("file"), None, match.group("func"))
    return None


def _assemble(streams: list[_Stream]) -> Incident:
    exceptions = sorted((e for s in streams for e in s.exceptions), key=lambda e: e.line_no or 0)
    context = sorted((line for s in streams for line in s.context), key=lambda line: line.number)
    notes = [note for s in streams for note in s.notes]
    if not any(e.type for e in exceptions):
        # No exception line read after a traceback (none, or only tracebacks cut off by a wrapped paste):
        # an error line elsewhere in the log is the failure.
        exceptions = sorted(exceptions + _bare_errors(context), key=lambda e: e.line_no or 0)
    exceptions, joined, whole = _join_split_errors(exceptions)
    # A traceback joined with its error line was not cut off after all.
    notes = [note for note in notes if not any(note == _cut_off_note(start) for start in whole)] + joined
    _adopt_orphan_forward_traces(exceptions, [side for s in streams for side in s.orphan_sides])
    exceptions, headless = _adopt_headless_forward_traces(exceptions)
    notes = [note for note in notes if not any(note == _cut_off_note(start) for start in headless)]
    candidates = [e for e in exceptions if not e.wrapper and e.short_type not in _WRAPPER_TYPES and e.type]
    if any(not e.spawn_echo for e in candidates):
        candidates = [e for e in candidates if not e.spawn_echo]
    root = candidates[0] if candidates else (exceptions[0] if exceptions else None)

    # torchrun's failure summary is the launcher's log output, though printed as an exception message.
    context += [LogLine(text, (e.line_no or 0) + offset, e.rank) for e in exceptions if e.short_type == "ChildFailedError"
                for offset, text in enumerate(e.message.split("\n"), start=1)]
    incident = Incident(source="log", exception=root, exceptions=exceptions, notes=notes)
    incident.log_lines = _log_excerpt(context)
    if root is not None:
        incident.rank, incident.worker = root.rank, root.worker
    _read_deaths(incident, context, exceptions)
    if root is None and incident.signal is None and any(_SILENT_LINE.search(line.text) for line in context):
        incident.kind = "silent"
    elif root is None and incident.signal is None and (any(_says_nan(line.text) for line in context)
                                                        or _table_says_nan([line.text for line in context])):
        incident.kind = "nan"
    return incident


def _adopt_orphan_forward_traces(exceptions: list[ExceptionInfo], sides: list[_SideStack]) -> None:
    """An anomaly-mode forward trace printed just after an error line with no traceback (a notebook flushes
    stderr out of order) belongs to that error; so does one printed just before an error line whose traceback
    the paste left out (the order anomaly mode prints them in)."""
    for side in sides:
        start = side.lines[0].number if side.lines else 0
        owners = [e for e in exceptions if e.type and not e.side_frames and e.line_no is not None
                  and 0 <= start - e.line_no <= SIDE_GAP_LINES]
        if owners:
            owner = max(owners, key=lambda e: e.line_no or 0)
            owner.side_frames, owner.side_label = side.frames, side.label
            continue
        end = side.lines[-1].number if side.lines else 0
        followers = [e for e in exceptions if e.type and not e.frames and not e.side_frames and e.line_no is not None
                     and 0 < e.line_no - end <= SIDE_GAP_LINES]
        if followers and side.label == FORWARD_CALL:
            owner = min(followers, key=lambda e: e.line_no or 0)
            owner.side_frames, owner.side_label = side.frames, side.label


# Anomaly mode's NaN check: the one error whose traceback it always precedes with the forward call's trace.
_ANOMALY_NAN = re.compile(r"Function '\w+' returned nan values in its \d+")


def _adopt_headless_forward_traces(exceptions: list[ExceptionInfo]) -> tuple[list[ExceptionInfo], list[int]]:
    """Frames with no error line just before anomaly mode's NaN error are its forward trace, pasted without the
    warning that heads it ("Error detected in ... Traceback of forward call"). Returns the exceptions left and the
    lines where the adopted frames start."""
    adopted: list[int] = []
    for frames_only in [e for e in exceptions if not e.type and e.frames and e.line_no is not None]:
        end = (frames_only.line_no or 0) + 2 * len(frames_only.frames)
        after = [e for e in exceptions if e.type and not e.side_frames and e.line_no is not None
                 and 0 < e.line_no - end <= SIDE_GAP_LINES and _ANOMALY_NAN.search(e.message)]
        if after:
            owner = min(after, key=lambda e: e.line_no or 0)
            owner.side_frames, owner.side_label = frames_only.frames, FORWARD_CALL
            exceptions = [e for e in exceptions if e is not frames_only]
            adopted.append(frames_only.line_no or 0)
    return exceptions, adopted


# How far apart an error line and the frames it belongs to may be printed (a fence, a logger line, prose between).
SPLIT_GAP_LINES = 6


def _join_split_errors(exceptions: list[ExceptionInfo]) -> tuple[list[ExceptionInfo], list[str], list[int]]:
    """An error line with no frames, and frames with no error line, printed close together: one exception.

    Pastes put the error before the traceback (copied from an issue title, or a log that prints the
    message first), or cut the traceback and repeat the error below it. Returns the exceptions, notes, and
    the lines where the tracebacks that found their error line start.
    """
    notes: list[str] = []
    whole: list[int] = []
    untyped = [e for e in exceptions if not e.type and e.frames]
    for frames_only in untyped:
        start = frames_only.line_no or 0
        end = start + 2 * len(frames_only.frames) + SPLIT_GAP_LINES
        near = [e for e in exceptions if e.type and not e.frames and e.line_no is not None
                and start - SPLIT_GAP_LINES <= e.line_no <= end]
        if not near:
            continue
        error = min(near, key=lambda e: abs((e.line_no or 0) - start))
        error.frames = frames_only.frames
        exceptions = [e for e in exceptions if e is not frames_only]
        notes.append(f"the {error.type} at line {error.line_no} and the traceback at line {start} were printed apart;"
                     " read as one")
        whole.append(start)
    return exceptions, notes, whole


def _message_resumes(lines: list[LogLine], i: int, headline: str, max_blank: int = 2) -> int:
    """Where an error headline cut by blank lines goes on: past the blanks when it ends on a colon and the next
    line is neither a new record nor traceback text; else `i` itself (the blank line that ends the message)."""
    if not headline.rstrip().endswith(":"):
        return i
    j = i
    while j < len(lines) and j - i < max_blank and not lines[j].text.strip():
        j += 1
    if j >= len(lines) or not lines[j].text.strip() or lines[j].record_start:
        return i
    text = lines[j].text
    if _TRACEBACK_HEAD.match(text) or _FRAME.match(text) or _EXCEPTION_LINE.match(text.lstrip()):
        return i
    return j


def _bare_message_resumes(context: list[LogLine], index: int, headline: str, max_gap: int = 3) -> int | None:
    """The index in `context` where a bare error's headline cut by blank lines goes on, or None (see _message_resumes)."""
    if not headline.rstrip().endswith(":"):
        return None
    number = context[index].number
    for j in range(index + 1, min(len(context), index + 1 + max_gap)):
        follow = context[j]
        if follow.number - number > max_gap:
            return None
        if not follow.text.strip():
            continue
        if follow.number == number + 1 or follow.record_start:
            return None  # no break between them: the ordinary continuation reads it
        text = follow.text
        if _TRACEBACK_HEAD.match(text) or _FRAME.match(text) or _EXCEPTION_LINE.match(text.lstrip()):
            return None
        return j
    return None


def _cut_off_note(start: int) -> str:
    return f"a traceback at line {start} is cut off before its exception line"


def progress_indices(lines: list[str]) -> list[int]:
    """The step, batch or iteration numbers the log's progress lines show, in order (`Epoch 0 batch 0's loss` -> 0)."""
    found: list[int] = []
    for line in lines:
        if "atch" in line or "tep" in line or "ter" in line or "ATCH" in line or "TEP" in line or "TER" in line:
            found.extend(int(number) for number in _PROGRESS_INDEX.findall(line[:MAX_PROGRESS_LINE_CHARS]))
    return found


MAX_PROGRESS_LINE_CHARS = 2_000


def _table_says_nan(lines: list[str]) -> bool:
    """A metrics table (fastai's, a trainer's epoch summary) whose header names a loss column and whose row under
    it holds NaN/Inf: `epoch train_loss valid_loss` / `0 nan nan 0.99`."""
    for header, row in zip(lines, lines[1:]):
        if "loss" in header.lower() and _TABLE_NAN_ROW.match(row) and not any(word.isdigit() for word in header.split()):
            return True
    return False


# A table row: the epoch's number, then the first column's value non-finite.
_TABLE_NAN_ROW = re.compile(r"(?i)\s*\d{1,6}\s+[-+]?(?:nan|inf)\b")


def _says_nan(text: str) -> bool:
    """A loss or gradient reported as NaN/Inf; the substring test spares the regex most lines."""
    lower = text.lower()
    return ("nan" in lower or "inf" in lower or "non-finite" in lower) and _NAN_LINE.search(text) is not None


def _bare_errors(context: list[LogLine]) -> list[ExceptionInfo]:
    """Error lines with no traceback (`RuntimeError: CUDA out of memory...` alone in a log)."""
    found: list[ExceptionInfo] = []
    for index, line in enumerate(context):
        text = line.text
        if _CPP_WHAT in text:
            found.append(_cpp_exception(context, index))
            continue
        if not ("Error" in text or "Exception" in text or "Interrupt" in text or "Exit" in text or "Failure" in text
                or text.startswith("torch.")):
            continue
        match = _BARE_ERROR_LINE.match(text.lstrip())
        if not match:
            inside = _ERROR_IN_LINE.search(text)
            if not inside:
                shown = _ERROR_REPR.search(text) if "(" in text else None
                if shown:  # `failed because of the following error: RuntimeError('CUDA error: ...')`
                    found.append(ExceptionInfo(shown.group("type"), shown.group("msg"), [], rank=line.rank,
                                               line_no=line.number))
                continue
            match = _BARE_ERROR_LINE.match(_inside_quotes(text, inside.start()))  # prose or a quote around it
        message = [match.group("msg") or ""]
        last = line.number
        resumed = _bare_message_resumes(context, index, message[0])
        if resumed is not None:  # a headline ending on a colon, cut by a fence or blank line the paste put inside it
            message.append(context[resumed].text)
            last = context[resumed].number
        for follow in context[(resumed if resumed is not None else index) + 1 : index + 40]:
            if not follow.text.strip() or follow.record_start or follow.number != last + 1:
                break
            message.append(follow.text)
            last = follow.number
        prompt = _statement_before(context, index)
        found.append(ExceptionInfo(match.group("type"), "\n".join(message).strip(), [prompt] if prompt else [],
                                   rank=line.rank, line_no=line.number))
        if len(found) >= MAX_EXCEPTIONS:
            break
    return found


# std::terminate's report of an uncaught C++ exception: `terminate called after throwing an instance of 'T'` and
# `  what():  <message>` (several threads dying at once print `what():` several times on one line).
_CPP_WHAT = "what():"
_CPP_THROWN = re.compile(r"terminate called after throwing an instance of '(?P<type>[^']+)'")


def _cpp_exception(context: list[LogLine], index: int) -> ExceptionInfo:
    """The C++ exception whose `what():` text is on `context[index]`: its type from the `terminate called` line
    above it when the paste has one (else `std::exception`, whose method `what()` is), its message the text after
    the last `what():` and the lines that continue it."""
    line = context[index]
    message = [line.text.rsplit(_CPP_WHAT, 1)[1].strip()]
    for follow in context[index + 1 : index + 40]:
        if not follow.text.strip() or follow.record_start or follow.number != line.number + len(message):
            break
        if follow.text.startswith(("Exception raised from ", "frame #")):
            break  # c10's own backtrace, printed after the message
        message.append(follow.text)
    thrown = None
    for above in reversed(context[max(0, index - 3) : index + 1]):
        thrown = _CPP_THROWN.search(above.text)
        if thrown:
            break
    return ExceptionInfo(thrown.group("type") if thrown else "std::exception", "\n".join(message).strip(), [], rank=line.rank,
                         line_no=line.number)


# The statement that raised, typed at a debugger's or IPython's prompt or shown by IPython's arrow, on the line
# right above an error that has no traceback: `ipdb> x += 1`, `In [3]: loss.backward()`, `----> 6     E[:, 0::2] = ...`.
# (Python's `>>> ` reads as a markdown quote and is gone by now.)
_PROMPT = re.compile(r"(?:ipdb> |\(Pdb\) |In \[(?P<cell>\d{1,9})\]: )(?P<code>\S.*)")


def _statement_before(context: list[LogLine], index: int) -> Frame | None:
    """The frame of the prompt or arrow line right above the error at `context[index]`, if it is one."""
    if index == 0 or context[index - 1].number != context[index].number - 1:
        return None
    text = context[index - 1].text.strip()
    prompt = _PROMPT.match(text)
    if prompt:
        cell = prompt.group("cell")
        where = f"In [{cell}]" if cell else "<ipdb prompt>" if text.startswith("ipdb") else "<pdb prompt>"
        return Frame(where, None, "<module>", code=prompt.group("code").strip(), user=True)
    arrow = _IPY_ARROW.match(text) if text.startswith("-") else None
    if arrow:
        return Frame("<cell>", int(arrow.group("line")), "<module>", code=arrow.group("code").strip(), user=True)
    return None


def _log_excerpt(context: list[LogLine]) -> list[str]:
    """The lines worth matching against: notable ones from anywhere, and the tail."""
    notable = [line for line in context if _is_notable(line.text)]
    if len(notable) > LOG_LINES_NOTABLE:
        half = LOG_LINES_NOTABLE // 2
        notable = notable[:half] + notable[-half:]
    keep = {line.number: line for line in notable}
    keep.update((line.number, line) for line in context[-LOG_LINES_TAIL:])
    return [keep[number].text for number in sorted(keep) if keep[number].text.strip()]


def _root_cause_block(texts: list[str]) -> list[str]:
    for index, text in enumerate(texts):
        if text.startswith("Root Cause"):
            block = []
            for line in texts[index + 1 :]:
                if line.startswith("==="):
                    break
                block.append(line)
            return block
    return []


def _is_notable(text: str) -> bool:
    lower = text.lower()
    return any(word in lower for word in _NOTABLE_WORDS)


def _read_deaths(incident: Incident, context: list[LogLine], exceptions: list[ExceptionInfo]) -> None:
    """Signal deaths and exit codes from torchrun summaries, shells and faulthandler."""
    summary = [text for e in exceptions if e.short_type == "ChildFailedError" for text in e.message.split("\n")]
    summary += [line.text for line in context if "Root Cause" in line.text or line.text.startswith("  ")]
    root_block = _root_cause_block(summary)
    # torchrun's root cause names the rank that failed first; ranks it killed afterwards say SIGTERM.
    texts = root_block or [line.text for line in context] + summary
    for text in texts:
        if not any(word in text for word in _DEATH_WORDS):
            continue
        received = _SIGNAL_RECEIVED.search(text)
        if received:
            incident.signal = received.group("name")
            incident.exit_code = -int(received.group("num"))
        rank = _TORCHRUN_RANK.match(text)
        if rank and incident.rank is None:
            incident.rank = int(rank.group("rank"))
        exit_code = _TORCHRUN_EXIT.match(text)
        if exit_code and incident.exit_code is None:
            incident.exit_code = int(exit_code.group("code"))
        # "DataLoader worker (pid 7) is killed by signal: Segmentation fault" is a worker's death, which the main
        # process reported with an exception: it did not die of that signal itself.
        if incident.signal is None and "killed by signal" not in text:
            death = _FATAL_PYTHON.search(text) or (_SHELL_DEATH.search(text) if len(text) < 300 else None)
            if death:
                name, number = _SIGNALS[death.group("what")]
                incident.signal = name
                incident.exit_code = incident.exit_code if incident.exit_code is not None else 128 + number
    root = incident.exception
    if incident.signal and (root is None or root.short_type == "ChildFailedError"):
        incident.kind = "hard-crash"
