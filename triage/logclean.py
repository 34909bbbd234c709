"""Turn raw log text into clean lines: no colour codes, progress redraws or per-line prefixes.

Each line keeps the rank its prefix named (`[rank3]:`, `[default3]:`, `3: `,
`[1,3]<stderr>:`), so the parser can pull interleaved ranks apart, and a flag
saying whether the line began a new log record (a timestamp or logger prefix),
which ends a multi-line exception message.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

MAX_LINE_CHARS = 64 * 1024

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][A-Za-z0-9]|\x1b[=>]")

_RANK_PREFIXES = (
    re.compile(r"\[(?:rank|default|RANK)(?P<rank>\d{1,9})\]:\s?"),  # torch's own, torchrun --tee
    re.compile(r"\[\d+,(?P<rank>\d{1,9})\]<std(?:out|err)>:\s?"),  # Open MPI --tag-output
    re.compile(r"(?:rank|RANK)\s?(?P<rank>\d{1,9}):\s"),
    re.compile(r"(?P<rank>\d{1,4}): (?=\S|\s+File |\s{2,}\S)"),  # srun --label
)

_RECORD_PREFIXES = (
    # 2024-03-01 12:34:56,789 / [2024-03-01T12:34:56.789Z], then up to four tokens such as
    # [INFO], [trainer.py:88], "- root - INFO -", "| INFO |" or "torch._dynamo.convert_frame: [WARNING]"
    re.compile(
        r"\[?\d{4}-\d\d-\d\d[ T_]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?"
        r"(?:\s*(?:\[[^\]\n]{1,80}\]|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b|[|-]\s*[\w.<>]+(?=\s*[|:-])"
        r"|[a-z_][\w.]*:(?=\s+\[))){0,4}"
        r"(?:\s*[|:-])?\s?"
    ),
    # glog style, as torchelastic and c10 print: E1105 12:34:56.789000 1234 path/file.py:123] or [W1105 ... file.cpp:1168]
    re.compile(r"\[?[IWEF]\d{3,4} \d\d:\d\d:\d\d\.\d+(?: +\d+)? +[^\]\s]+\] ?"),
    # python logging's default format: ERROR:root: / WARNING:torch.distributed.run:
    re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.<>]+:\s?"),
    # sacred's console format: ERROR - my_experiment - Failed after 0:00:12!
    re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) - [\w.<>]+ - "),
    # vLLM and friends: ERROR 04-01 23:46:56 [engine.py:160]
    re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]\n]{1,80}\] ?"),
    # [12:34:56] / 12:34:56 timestamps with a level
    re.compile(r"\[?\d\d:\d\d:\d\d(?:[.,]\d+)?\]?\s+(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s*[|:-]?\s?"),
)

_TRACEBACK = "Traceback (most recent call last)"
# The warnings module's header, `/path/file.py:175: UserWarning: `, glued after other text on a line: found by
# its fixed tail, then its path walked back to where it starts (a regex from the path's start rescans long lines).
_WARNING_TAIL = re.compile(r"\.py:\d{1,9}: [A-Z]\w{0,80}Warning: ")
_GLUE_BEFORE_PATH = "!.)]'\""
# An exception line run onto a code line that ends with `)`, directly or after the padding a wide paste left.
_GLUED_ERROR = re.compile(r"(?<=\))[ \t]*(?P<error>(?:[a-z_]\w*\.)*[A-Z]\w*Error: )")
# Where "Traceback" legitimately follows text on a line: IPython's header, a worker's
# "Original Traceback", rich's box, and torch 0.x re-raising a worker's error with its traceback as the
# message (`TypeError: Traceback (most recent call last):`).
_KEEPS_TRACEBACK_ON_LINE = re.compile(
    r"\s*(?:[A-Za-z_][\w.]*\s{2,}|Original |╭|(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception): $)"
)
# pdb's `> /path/file.py(12)func()`; `[^()]*` keeps it linear (`.*` then `\S*` backtracked per parenthesis).
# Prefixes a debugger or test runner puts before an error it shows: pytest's `E   `, ipdb/pdb's `*** `.
_TOOL_PREFIX = re.compile(r"E(?: {2,}|\t)\s*(?=\S)|\*\*\* (?=[A-Za-z_])")
# Markdown wrapped around a pasted error: a heading mark, bold or italic runs (`_**### RuntimeError ...**_`).
_MARKDOWN_OPEN = re.compile(r"(?:_?\*\*|_(?=[\"“`*#]))(?:#{1,6} )?|#{1,6} (?=[A-Z_`\"“])")
_MARKDOWN_CLOSE = re.compile(r"(?:\*\*_?|_)$")
# An error line typed by hand or reflowed: a space before its colon, none after it, or runs of spaces in it
# (`RuntimeError :  Function  'SqrtBackward'  returned nan`, `RuntimeError:CUDA out of memory`).
_ERROR_NAME_COLON = re.compile(r"(?:[A-Za-z_]\w*\.)*_?[A-Z]\w*(?:Error|Exception) ?:")
_SPACE_RUN = re.compile(r"(?<=\S) {2,}(?=\S)")
_PDB_LOCATION = re.compile(r"> \S[^()]*\(\d+\)[^()\s]*\(\)")
_QUOTE = re.compile(r"(?:> ?)+")


@dataclass(frozen=True)
class LogLine:
    """One cleaned line: its text, its 1-based number in the input, and what its prefix said."""

    text: str
    number: int
    rank: int | None = None
    record_start: bool = False


def clean_lines(text: str, first_number: int = 1) -> list[LogLine]:
    """Split `text` into cleaned lines; see the module docstring for what is removed."""
    out: list[LogLine] = []
    for number, raw in _unwrap_hard_wrapped(_strip_line_gutter(text.split("\n")), first_number):
        line = _clean_one(raw)
        if line.lstrip().startswith("```"):
            rest = line.strip().strip("`").strip()
            if not rest or re.fullmatch(r"\w+", rest):
                # A fence, with or without a language tag: a break, like a blank line.
                out.append(LogLine("", number))
                continue
            line = rest
        rank, record_start, line = _strip_prefixes(line)
        glued_at = _glued_warning_start(line) if "Warning: " in line else 0
        if glued_at > 0:
            # A warning printed onto the end of the line before it (stderr unflushed): its own line.
            out.append(LogLine(line[:glued_at], number, rank, record_start))
            line = line[glued_at:]
        glued = _GLUED_ERROR.search(line) if "rror: " in line else None
        if glued and glued.start() > 0:
            # A damaged paste: an exception line run onto the code line before it.
            out.append(LogLine(line[: glued.start()], number, rank, record_start))
            line = line[glued.start("error") :]
        before, head, after = line.partition(_TRACEBACK)
        if head and before.strip() and not _KEEPS_TRACEBACK_ON_LINE.match(before):
            # An exception interrupting a progress bar prints its traceback on the bar's line.
            out.append(LogLine(before, number, rank, record_start))
            line = head + after
        out.append(LogLine(line, number, rank, record_start))
    return out


# A line-number gutter a viewer adds (`12 Traceback ...`, `[1743] {'loss': ...}`): a number at the margin, then
# a space, tab or bar.
_GUTTER = re.compile(r"(?:\[(?P<bracketed>\d{1,9})\]|(?P<plain>\d{1,9}))(?: |\t|\|)")
GUTTER_MIN_LINES = 5
GUTTER_MIN_SHARE = 0.8


def _strip_line_gutter(raw_lines: list[str]) -> list[str]:
    """The lines without a line-number gutter, when the paste has one: most lines start with a number one more
    than the line before's, and a traceback is among them (a table of epochs also starts lines with counting
    numbers, but holds no traceback)."""
    numbers: list[int | None] = []
    for line in raw_lines:
        gutter = _GUTTER.match(line) if line[:1].isdigit() or line[:1] == "[" else None
        numbers.append(int(gutter.group("bracketed") or gutter.group("plain")) if gutter else None)
    filled = [n for n in numbers if n is not None]
    non_blank = sum(1 for line in raw_lines if line.strip())
    if len(filled) < GUTTER_MIN_LINES or len(filled) < GUTTER_MIN_SHARE * non_blank:
        return raw_lines
    counting = sum(1 for a, b in zip(filled, filled[1:]) if b == a + 1)
    if counting < GUTTER_MIN_SHARE * (len(filled) - 1):
        return raw_lines
    stripped = [_GUTTER.sub("", line, count=1) if n is not None else line for line, n in zip(raw_lines, numbers)]
    if not any("Traceback (most recent" in line or line.lstrip().startswith('File "') for line in stripped):
        return raw_lines
    return stripped


_HTML_ENTITY = re.compile(r"&(?:lt|gt|quot|amp|apos|#39|#x27|#34);")
# A terminal wrapped the paste at a fixed width: at least this many lines end exactly there (80 columns is a
# classic terminal's). Narrower widths are PyTorch's and loggers' own line breaks (a driver message broken at 65
# columns), never rejoined.
WRAP_MIN_WIDTH = 80
WRAP_MIN_LINES = 3
WRAP_MIN_EVIDENCE = 2  # lines of that length cut inside a word


def _unwrap_hard_wrapped(raw_lines: list[str], first_number: int) -> list[tuple[int, str]]:
    """(number, line) pairs, with the lines a fixed-width wrap cut joined again.

    A wrapped paste has several lines of exactly the longest length and none longer, and some of them were
    cut inside a word or a path (`...ran f` / `or 1800010 ms`). Only then is every line of that length joined
    with the next (a cut can also fall on a space): repeated lines that merely share a length (CUDA
    assertions, a rich box) are never cut mid-word, and stay apart.
    """
    numbered = list(enumerate(raw_lines, start=first_number))
    lengths = [len(line.rstrip("\r")) for line in raw_lines]
    width = max(lengths, default=0)
    if width < WRAP_MIN_WIDTH or width > MAX_LINE_CHARS or lengths.count(width) < WRAP_MIN_LINES:
        return numbered
    cut = [index for index, length in enumerate(lengths[:-1]) if length == width and raw_lines[index + 1].strip()]
    # Evidence: a line cut inside a word whose rest is shorter than the width (the tail of the wrapped line).
    if sum(_cut_mid_word(raw_lines[index].rstrip("\r"), raw_lines[index + 1]) and lengths[index + 1] < width
           for index in cut) < WRAP_MIN_EVIDENCE:
        return numbered
    joined = set(cut)
    out: list[tuple[int, str]] = []
    for index, (number, line) in enumerate(numbered):
        if index - 1 in joined and out:
            out[-1] = (out[-1][0], out[-1][1] + line)
        else:
            out.append((number, line.rstrip("\r") if index in joined else line))
    return out


def _cut_mid_word(line: str, following: str) -> bool:
    # The rest of a cut word or path: lower case, a digit, `/` or `_` (a capital more likely starts a new line), or
    # a file's extension (`.../torch/serialization` / `.py", line 135`).
    return bool(line) and bool(following) and (line[-1].isalnum() or line[-1] in "/_") and (
        following[0].islower() or following[0].isdigit() or following[0] in "/_"
        or (following[0] == "." and following[1:3].isalpha()))


def _glued_warning_start(line: str) -> int:
    """Where a warning header glued onto the end of other text starts (`...Good luck!/usr/lib/x.py:175: UserWarning:`),
    or 0 when the line has none or starts with it."""
    tail = _WARNING_TAIL.search(line)
    if tail is None:
        return 0
    word_start = max(line.rfind(" ", 0, tail.start()), line.rfind("\t", 0, tail.start())) + 1
    for at in range(word_start + 1, tail.start()):
        drive = line[at].isalpha() and line[at + 1 : at + 3] == ":\\"
        if (line[at] == "/" or drive) and line[at - 1] in _GLUE_BEFORE_PATH:
            return at
    return 0


def _clean_one(raw: str) -> str:
    line = raw
    if "&" in line and _HTML_ENTITY.search(line):
        # Copied from a rendered page or an e-mail: `in &lt;module&gt;`, `KeyError: &#39;x&#39;`.
        line = html.unescape(line)
    if len(line) > MAX_LINE_CHARS:
        line = f"{line[:MAX_LINE_CHARS]} [... {len(line) - MAX_LINE_CHARS} characters cut]"
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    if "\r" in line:
        # A progress bar redraws with carriage returns; what shows is the last redraw.
        parts = [part for part in line.rstrip("\r").split("\r") if part.strip()]
        line = parts[-1] if parts else ""
    return line.rstrip()


# VS Code and Colab link a frame's cell or file: `[line 13](vscode-notebook-cell:...)`, `[/usr/.../f.py](https://localhost:8080/#)`.
_NOTEBOOK_LINK = re.compile(r"\[([^\]\n]{1,300})\]\((?:vscode-notebook-cell|file|https?):[^)\s]*\)")


def _strip_prefixes(line: str) -> tuple[int | None, bool, str]:
    rank: int | None = None
    record_start = False
    for _ in range(4):
        changed = False
        if line.startswith(">") and not _PDB_LOCATION.match(line):
            line = _QUOTE.sub("", line, count=1)
            changed = True
        for pattern in _RANK_PREFIXES:
            match = pattern.match(line)
            if match:
                rank = int(match.group("rank")) if rank is None else rank
                line = line[match.end():]
                changed = True
                break
        for pattern in _RECORD_PREFIXES:
            match = pattern.match(line)
            if match and match.end() > 0:
                record_start = True
                line = line[match.end():]
                changed = True
                break
        if not changed:
            break
    tool = _TOOL_PREFIX.match(line)
    if tool:
        line = line[tool.end():]
    if len(line) > 2 and line[0] == "`" and line[-1] == "`" and line.count("`") == 2:
        line = line[1:-1]
    elif line.count("`") % 2 and not line.lstrip().startswith("```"):
        # A backtick opened on one line and closed on another: the paste's, not the log's.
        line = line[1:] if line.startswith("`") else line[:-1] if line.endswith("`") else line
    opened = _MARKDOWN_OPEN.match(line) if line[:1] in "_*#" else None
    if opened and opened.end():
        # markdown bold, italics or a heading left around a pasted error (never a `_module.Error` name)
        line = _MARKDOWN_CLOSE.sub("", line[opened.end():])
    if ":" in line and line[:1].isalpha() and _ERROR_NAME_COLON.match(line):
        line = _tidy_error_line(line)
    if "](" in line:
        # VS Code notebooks print `Cell In[11], [line 13](vscode-notebook-cell:...)`.
        line = _NOTEBOOK_LINK.sub(r"\1", line)
    return rank, record_start, line


def _tidy_error_line(line: str) -> str:
    """`Type : msg`, `Type:msg` and `Type:  msg   with   runs` read as `Type: msg with runs`.

    Only a line that starts with an error's name is touched, and only when it is loose: a well-formed
    `Type: msg` keeps every character (its message may align columns with spaces on purpose).
    """
    name = _ERROR_NAME_COLON.match(line)
    head, rest = line[: name.end()], line[name.end():]
    if not rest.strip() or (not head.endswith(" :") and rest.startswith(" ") and not rest.startswith("  ")):
        return line
    return head.removesuffix(":").rstrip() + ": " + _SPACE_RUN.sub(" ", rest.strip())
