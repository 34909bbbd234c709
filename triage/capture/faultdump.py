"""Read faulthandler's output (fatal-signal dumps and on-demand stack dumps) into thread stacks.

faulthandler writes from a signal handler with no allocation: thread headers
(`Current thread 0x7f... (most recent call first):`), frames as
`File "x.py", line 3 in f`, innermost first, and for a fatal signal a
`Fatal Python error: Segmentation fault` line first. Standard library only:
the supervising parent uses this.
"""

from __future__ import annotations

import linecache
import re
from dataclasses import dataclass, field

from ..incident import Frame, is_user_path
from .frames import is_hidden_file

_FATAL = re.compile(r"^Fatal Python error: (?P<what>.+?)\s*$")
_THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<ident>0x[0-9a-fA-F]+)(?: \[(?P<name>[^\]]*)\])? \(most recent call first\):")
_STACK = re.compile(r"^(?:Current thread's C stack|Stack) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+|\?\?\?) in (?P<function>.+?)\s*$')

SIGNAL_OF_FATAL = {
    "Segmentation fault": "SIGSEGV",
    "Bus error": "SIGBUS",
    "Aborted": "SIGABRT",
    "Floating point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}


@dataclass
class ThreadStack:
    """One thread's Python frames, innermost last (as in a traceback)."""

    ident: int | None
    current: bool
    frames: list[Frame] = field(default_factory=list)
    truncated: bool = False
    name: str | None = None


@dataclass
class Dump:
    """One faulthandler dump: the fatal error it reports (if any) and every thread's stack."""

    fatal: str | None
    threads: list[ThreadStack] = field(default_factory=list)
    text: str = ""

    @property
    def signal(self) -> str | None:
        return SIGNAL_OF_FATAL.get(self.fatal or "")

    def thread(self, ident: int | None) -> ThreadStack | None:
        for stack in self.threads:
            if ident is not None and stack.ident == ident:
                return stack
        return None

    def main_thread(self, ident: int | None = None) -> ThreadStack | None:
        """The thread with `ident`, else the oldest (faulthandler lists the newest thread first)."""
        return self.thread(ident) or (self.threads[-1] if self.threads else None)

    def crashed_thread(self) -> ThreadStack | None:
        for stack in self.threads:
            if stack.current:
                return stack
        return self.threads[-1] if self.threads else None


def parse_dumps(text: str, with_code: bool = True) -> list[Dump]:
    """Every dump in `text`, in order. A dump starts at a fatal-error line or at a first thread header."""
    dumps: list[Dump] = []
    current: Dump | None = None
    stack: ThreadStack | None = None
    start = 0
    offset = 0
    for line in text.splitlines(keepends=True):
        stripped = line.rstrip("\n")
        fatal = _FATAL.match(stripped)
        thread = _THREAD.match(stripped)
        if fatal or ((thread or _STACK.match(stripped)) and (current is None or current.fatal is None and _seen_ident(current, thread))):
            if current is not None:
                current.text = text[start:offset]
            current = Dump(fatal.group("what") if fatal else None)
            dumps.append(current)
            start = offset
            stack = None
        if current is not None and (thread or _STACK.match(stripped)):
            stack = ThreadStack(
                ident=int(thread.group("ident"), 16) if thread else None,
                current=bool(thread and thread.group("current") == "Current thread") or not thread,
                name=thread.group("name") if thread else None,
            )
            current.threads.append(stack)
        elif stack is not None:
            frame = _FRAME.match(line)
            if frame and not is_hidden_file(frame.group("file")):
                stack.frames.insert(0, _frame(frame, with_code))
            elif stripped.strip() == "...":
                stack.truncated = True
        offset += len(line)
    if current is not None:
        current.text = text[start:offset]
    return dumps


def _seen_ident(dump: Dump, thread: re.Match | None) -> bool:
    """An on-demand dump has no header line: a thread already listed means a new dump began."""
    if thread is None:
        return bool(dump.threads)
    ident = int(thread.group("ident"), 16)
    return any(stack.ident == ident for stack in dump.threads)


def _frame(match: re.Match, with_code: bool) -> Frame:
    file = match.group("file")
    line = int(match.group("line")) if match.group("line").isdigit() else None
    code = linecache.getline(file, line).strip() or None if with_code and line else None
    return Frame(file=file, line=line, function=match.group("function"), code=code, user=is_user_path(file))


def without_hidden_frames(text: str) -> str:
    """A dump as the user would see it under plain python: the runner's own frames taken out."""
    kept = []
    for line in text.splitlines(keepends=True):
        frame = _FRAME.match(line)
        if frame and is_hidden_file(frame.group("file")):
            continue
        kept.append(line)
    return "".join(kept)


def format_stack(frames: list[Frame], indent: str = "  ") -> str:
    """Frames in traceback form, innermost last, with their source lines."""
    lines = []
    for frame in frames:
        lines.append(f'{indent}File "{frame.file}", line {frame.line if frame.line is not None else "?"}, in {frame.function}')
        if frame.code:
            lines.append(f"{indent}  {frame.code}")
    return "\n".join(lines)
