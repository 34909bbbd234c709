"""Read a multi-rank job's log into per-rank outcomes: torchrun's failure summary, `[rankN]:` tracebacks, C++ aborts.

What each rank left in the log: its first traceback (by the rank prefix torch
puts on it, or the `-- Process N terminated` header of mp.spawn), its exit code
or signal from torchrun's whole Failures list (not only its Root Cause block,
whose choice is the first exit torchrun saw), the traceback an `@record` error
file put into that list, the lines torchrun's agent logs (`failed (exitcode: -6)
local_rank: 0`), a C++ abort (`terminate called after throwing ...`, printed
with no rank prefix) and plain prints that name a rank (`rank 1: 3 batches`),
which show that a rank ran even when it never failed. Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .incident import ExceptionInfo, Incident
from .logclean import LogLine, clean_lines
from .ranks import NATIVE_ABORT, SIGNAL_NUMBERS, RankOutcome, consequence_of

_ENTRY_HEAD = re.compile(r"^\s*\[(?P<index>\d+)\]:\s*$")
_ENTRY_FIELD = re.compile(r"^\s*(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s?(?P<value>.*)$")
_ENTRY_RANK = re.compile(r"(?P<rank>\d+)(?: \(local_rank: (?P<local>\d+)\))?")
_ENTRY_EXIT = re.compile(r"(?P<code>-?\d+)(?: \(pid: (?P<pid>\d+)\))?(?:\s+\((?P<signal>SIG[A-Z]+)\))?")
_AGENT_FAILED = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)")
_SUMMARY_END = re.compile(r"^\s*(?:={8,}|-{8,})\s*$")
_ROOT_CAUSE = "Root Cause (first observed failure)"
_FAILURES = "Failures:"
# A plain print naming its rank: "rank 1: 3 batches", "[step 0] rank 1 sum", "Rank 2 done".
_RANK_MENTION = re.compile(r"\b[Rr]ank[ =:]?(?P<rank>\d{1,4})\b")


@dataclass
class SummaryEntry:
    """One rank as torchrun's failure summary lists it."""

    rank: int
    exit_code: int | None = None
    signal: str | None = None
    time_text: str = ""
    error_file: str = ""
    traceback: list[str] = field(default_factory=list)
    line_no: int = 0
    lines: list[str] = field(default_factory=list)  # the entry as printed, for the rules that read it


@dataclass
class JobLog:
    """What a job's log says about each rank, and torchrun's own verdict."""

    outcomes: list[RankOutcome]
    torchrun_root: SummaryEntry | None = None
    summary: list[SummaryEntry] = field(default_factory=list)
    lines_by_rank: dict[int, list[str]] = field(default_factory=dict)

    @property
    def torchrun_verdict(self) -> dict | None:
        """torchrun's "Root Cause (first observed failure)": its rank and what it says of the error."""
        entry = self.torchrun_root
        if entry is None:
            return None
        said = next((line.strip() for line in reversed(entry.traceback) if line.strip()), "")
        return {"rank": entry.rank, "exit_code": entry.exit_code, "error": said}


def read_job(text: str, incident: Incident) -> JobLog | None:
    """The per-rank outcomes of the job in `text` (already parsed into `incident`); None when it is not a multi-rank job."""
    lines = clean_lines(text)
    summary, root_entry = _summary_entries(lines)
    prefixed = {line.rank for line in lines if line.rank is not None}
    exceptions = [e for e in incident.exceptions if e.type and not e.wrapper and e.short_type != "ChildFailedError"]
    ranked = [e for e in exceptions if e.rank is not None]
    if not summary and len({e.rank for e in ranked}) < 2 and len(prefixed) < 2:
        return None
    outcomes: dict[int, RankOutcome] = {}

    def outcome(rank: int) -> RankOutcome:
        return outcomes.setdefault(rank, RankOutcome(rank=rank))

    for exc in ranked:
        found = outcome(exc.rank)
        if found.error is None:
            found.error, found.order = exc, exc.line_no
    for entry in summary:
        found = outcome(entry.rank)
        found.exit_code = entry.exit_code
        found.signal = entry.signal or (_signal_name(-entry.exit_code) if entry.exit_code and entry.exit_code < 0 else None)
        if found.error is None and any(line.lstrip().startswith("Traceback") for line in entry.traceback[:2]):
            found.error, found.order = _record_error(entry), entry.line_no  # an @record error file's traceback
        found.time_text = entry.time_text
    _agent_exits(lines, outcome)
    _attach_native_aborts(lines, outcomes)
    _thread_errors(lines, exceptions, outcomes)
    _unranked_errors(exceptions, outcomes)
    _mentioned_ranks(lines, outcomes, summary)
    by_rank: dict[int, list[str]] = {}
    for line in lines:
        if line.rank is not None:
            by_rank.setdefault(line.rank, []).append(line.text)
    for entry in summary:
        by_rank.setdefault(entry.rank, []).extend(entry.lines)
    return JobLog(sorted(outcomes.values(), key=lambda o: o.rank), root_entry, summary, by_rank)


def _summary_entries(lines: list[LogLine]) -> tuple[list[SummaryEntry], SummaryEntry | None]:
    """Every entry of torchrun's Failures list and its Root Cause block (the last summary in the log wins)."""
    entries: list[SummaryEntry] = []
    root: SummaryEntry | None = None
    in_root = False
    current: SummaryEntry | None = None
    in_traceback = False
    for line in lines:
        text = line.text
        if _FAILURES in text and text.strip() == _FAILURES:
            in_root, current, in_traceback = False, None, False
            entries = [e for e in entries if e is not root]
            continue
        if _ROOT_CAUSE in text:
            in_root, current, in_traceback = True, None, False
            continue
        head = _ENTRY_HEAD.match(text)
        if head:
            current = SummaryEntry(rank=-1, line_no=line.number)
            in_traceback = False
            continue
        if current is None:
            continue
        current.lines.append(text)
        if _SUMMARY_END.match(text):
            current, in_traceback = None, False
            continue
        field_match = _ENTRY_FIELD.match(text)
        if field_match and not (in_traceback and text.startswith("      ")):
            key, value = field_match.group("key"), field_match.group("value").strip()
            in_traceback = key == "traceback"
            if key == "rank":
                rank = _ENTRY_RANK.match(value)
                if rank:
                    current.rank = int(rank.group("rank"))
                    entries = [e for e in entries if e.rank != current.rank]
                    entries.append(current)
                    if in_root:
                        root = current
            elif key == "exitcode":
                code = _ENTRY_EXIT.match(value)
                if code:
                    current.exit_code = int(code.group("code"))
                    current.signal = code.group("signal")
            elif key == "time":
                current.time_text = value
            elif key == "error_file":
                current.error_file = value
            elif key == "traceback":
                current.traceback = [value]
            continue
        if in_traceback:
            current.traceback.append(text)
    return [e for e in entries if e.rank >= 0], root


def _record_error(entry: SummaryEntry) -> ExceptionInfo | None:
    """The exception of an @record traceback in the summary (the error file's), parsed like any traceback."""
    from .logparse import parse_text

    parsed = parse_text("\n".join(line.strip() if not line.startswith("    ") else line[2:] for line in entry.traceback))
    found = next((e for e in parsed.exceptions if e.type and not e.wrapper), None)
    if found is not None:
        found.rank = entry.rank
    return found


def _agent_exits(lines: list[LogLine], outcome) -> None:
    """`failed (exitcode: -6) local_rank: 0 (pid: N)`: the agent's own line, for logs cut before the summary."""
    for line in lines:
        if "exitcode" not in line.text:
            continue
        found = _AGENT_FAILED.search(line.text)
        if found:
            target = outcome(int(found.group("local")))
            if target.exit_code is None:
                target.exit_code = int(found.group("code"))
                if target.exit_code < 0:
                    target.signal = _signal_name(-target.exit_code)


def _attach_native_aborts(lines: list[LogLine], outcomes: dict[int, RankOutcome]) -> None:
    """A C++ abort's text belongs to the rank that printed it, or to the one that died of SIGABRT with no traceback.

    An exception thrown in C++ and never caught is that rank's error. "terminate called without an active exception"
    (a C++ thread still running when torn down, as a process group's at exit) is weaker: it is placed after the thrown
    ones, on a SIGABRT rank nothing else explains, as its text only (no error, no place in the order of failures)."""
    matches = [(index, line, found) for index, line in enumerate(lines) if (found := NATIVE_ABORT.search(line.text))]
    for thrown in (True, False):
        for index, line, found in matches:
            if bool(found.group("what")) != thrown:
                continue
            text = line.text.strip()
            if index + 1 < len(lines) and "what()" in lines[index + 1].text:
                text += "\n" + lines[index + 1].text.strip()
            if line.rank is not None and line.rank in outcomes:
                target = outcomes[line.rank]
            else:
                aborted = [o for o in outcomes.values() if o.signal == "SIGABRT" and o.error is None and not o.native_abort]
                target = aborted[0] if aborted else None
            if target is None or target.native_abort:
                continue
            target.native_abort = text
            if thrown:
                target.order = target.order if target.order is not None else line.number
                what = lines[index + 1].text.split("what():", 1)[-1].strip() if "\n" in text else ""
                target.error = ExceptionInfo(found.group("what"), what, [], rank=target.rank, line_no=line.number)


def _thread_errors(lines: list[LogLine], exceptions: list[ExceptionInfo], outcomes: dict[int, RankOutcome]) -> None:
    """A background thread's exception (printed with no rank prefix) goes to the one rank that then failed of its own.

    Python prints "Exception in thread NAME:" and the thread's traceback through
    threading.excepthook, which torch does not prefix; the rank's main thread
    fails afterwards (an empty queue, a missing batch), of the thread's death.
    """
    headers = {line.number for line in lines if line.rank is None and line.text.startswith("Exception in thread ")}
    if not headers:
        return
    threads = [e for e in exceptions if e.rank is None and e.line_no is not None
               and ({e.line_no - 1, e.line_no} & headers) and not consequence_of(f"{e.type}: {e.message}")]
    if not threads:
        return
    own = [o for o in outcomes.values() if o.error is not None and o.error.rank is not None
           and not consequence_of(f"{o.error.type}: {o.error.message}")]
    if len(own) == 1 and (own[0].order or 0) > (threads[0].line_no or 0):
        threads[0].rank = own[0].rank
        own[0].error, own[0].order = threads[0], threads[0].line_no


def _unranked_errors(exceptions: list[ExceptionInfo], outcomes: dict[int, RankOutcome]) -> None:
    """Tracebacks with no rank prefix (printed before init_process_group installs it): one to each failed rank with none.

    Ranks that exited with an error status take them first, in log order, then
    ranks the launcher stopped, which may have printed the same error first.
    """
    loose = sorted((e for e in exceptions if e.rank is None), key=lambda e: e.line_no or 0)
    if not loose:
        return
    exited = [o for o in outcomes.values() if o.error is None and o.exit_code not in (None, 0) and o.signal is None]
    stopped = [o for o in outcomes.values() if o.error is None and o.signal == "SIGTERM"]
    targets = exited + (stopped if len(loose) > len(exited) else [])
    for outcome, error in zip(targets, loose):
        outcome.error, outcome.order = error, error.line_no


def _mentioned_ranks(lines: list[LogLine], outcomes: dict[int, RankOutcome], summary: list[SummaryEntry]) -> None:
    """Ranks a plain print names ran; with a summary present, one it does not list ended with exit 0."""
    if not summary:
        return
    biggest = max(outcomes) if outcomes else 0
    for line in lines:
        named = [int(found.group("rank")) for found in _RANK_MENTION.finditer(line.text)] if "ank" in line.text else []
        for rank in named if line.rank is None else [line.rank]:
            if rank > biggest + 8:  # not a rank of this job
                continue
            if rank not in outcomes:
                outcomes[rank] = RankOutcome(rank=rank, exit_code=0)
            if outcomes[rank].exit_code == 0:
                outcomes[rank].order = line.number  # its last sign of life


def _signal_name(number: int) -> str | None:
    for name, value in SIGNAL_NUMBERS.items():
        if value == number:
            return name
    return None

