"""Choose the root-cause rank of a multi-rank job from what each rank left behind (live records or a log).

When one rank of a DDP job fails, every other rank fails too, of the consequence:
its peer closed the connection, its collective timed out, the launcher sent it
SIGTERM. torchrun's own "first observed failure" is the rank whose exit it saw
first, often one that died of a consequence. Here the ranks' failures are put in
tiers and ordered by time within a tier:

1. a rank's own error (any exception that is not a known consequence), or a death
   by a signal other than the launcher's SIGTERM (SIGKILL: the OOM killer;
   SIGABRT with no Python traceback: a C++ abort such as gloo's size check);
2. a rank with no error while the others time out or lose their peers: it was
   stuck (or busy) and the others waited for it; one that left early (exit 0)
   while the others still ran collectives also belongs here;
3. every rank failed waiting, but one rank's collective differs from the
   others' (a broadcast among all_reduces): the odd one out;
4. consequences only: the earliest of them (by time live, by order in a log).

Standard library only: `triage explain` uses this without torch.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from .incident import ExceptionInfo, Frame

ROOT = "root"
SECONDARY = "secondary"

# Known consequences: what a rank prints when another rank failed first. Named, for the report.
CONSEQUENCES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("peer connection lost", re.compile(
        r"Connection closed by peer|Connection reset by peer|Broken pipe|remote process exited or there was a network "
        r"error|NCCL communicator was aborted|ncclRemoteError|Socket Timeout|recvBytes|sendBytes|closed the connection",
        re.I)),
    ("collective or store timeout", re.compile(
        r"Timed out waiting \d+ ?ms|Watchdog caught collective operation timeout|collective operation timeout|"
        r"timed out after \d+ (?:ms|milliseconds|seconds)|waiting for clients|Timed out initializing process group|"
        r"Wait timeout|DistStoreError: .*timed? ?out|Some NCCL operations have failed or timed out|"
        r"detected by watchdog|watchdog (?:got stuck|thread terminated)", re.I)),
    ("abort without an exception", re.compile(r"terminate called without an active exception")),
    ("launcher's failure summary", re.compile(r"ChildFailedError|elastic\.multiprocessing\.errors")),
)  # fmt: skip
# What a C++ abort prints before SIGABRT: the text belongs to the rank that died of SIGABRT.
# (without an active exception: a C++ thread destroyed while still running, e.g. a process group's at exit)
NATIVE_ABORT = re.compile(r"terminate called (?:after throwing an instance of '(?P<what>[^']+)'|without an active exception)")
SIGNAL_NUMBERS = {"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGILL": 4, "SIGTRAP": 5, "SIGABRT": 6, "SIGBUS": 7,
                  "SIGFPE": 8, "SIGKILL": 9, "SIGUSR1": 10, "SIGSEGV": 11, "SIGUSR2": 12, "SIGPIPE": 13,
                  "SIGALRM": 14, "SIGTERM": 15}  # fmt: skip


@dataclass
class RankOutcome:
    """How one rank ended: its exit, its first error, when it failed, and where it was if it was stopped."""

    rank: int
    exit_code: int | None = None  # torchrun's convention: -N for a death by signal N
    signal: str | None = None
    error: ExceptionInfo | None = None
    failed_at: float | None = None  # seconds since the epoch (live, or torchrun's summary)
    order: int | None = None  # position in a log, where no time is known
    stacks: list[Frame] = field(default_factory=list)  # where a stopped rank was (faulthandler)
    native_abort: str = ""  # C++ "terminate called after throwing ..." text
    oom: str = ""  # what the kernel's OOM killer evidence says about a SIGKILL
    exited_at: float | None = None  # when it exited (live): a rank that left early
    time_text: str = ""  # the failure time as a log printed it (torchrun's summary)
    role: str = SECONDARY
    why: str = ""
    consequence: str = ""  # the consequence its error reads as ("peer connection lost", ...)

    @property
    def failed(self) -> bool:
        return self.error is not None or self.signal is not None or bool(self.exit_code)

    @property
    def own_error(self) -> bool:
        """An error of its own: not a consequence of another rank's failure."""
        return self.error is not None and bool(self.error.type) and not self.consequence

    def first_error_text(self) -> str | None:
        if self.error is not None and self.error.type:
            return self.error.headline
        if self.native_abort:
            return self.native_abort.split("\n", 1)[0]
        if self.stacks and self.signal in (None, "SIGTERM"):
            return "no error: stopped" + (f" by {self.signal}" if self.signal else "") + " while in " + _where(self.stacks)
        if self.signal:
            return f"died of {self.signal}" + (f" ({self.oom})" if self.oom else "")
        return None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": self.rank,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "first_error": self.first_error_text(),
            "failed_at": _iso(self.failed_at) or self.time_text or None,
            "role": self.role,
        }
        if self.why:
            out["why"] = self.why
        if self.consequence:
            out["consequence_of"] = self.consequence
        return out


def consequence_of(text: str) -> str:
    """The name of the known consequence `text` reads as, or ''."""
    for name, pattern in CONSEQUENCES:
        if pattern.search(text):
            return name
    return ""


def choose_root(outcomes: list[RankOutcome]) -> RankOutcome | None:
    """Mark every outcome's role and return the root-cause rank (None when no rank failed)."""
    for outcome in outcomes:
        outcome.role = SECONDARY
        outcome.why = ""
        text = _error_text(outcome)
        outcome.consequence = consequence_of(text) if text else ""
        if not outcome.consequence and outcome.signal == "SIGTERM" and outcome.error is None:
            outcome.consequence = "stopped by the launcher (SIGTERM)"
    failing = [o for o in outcomes if o.failed]
    if not failing:
        return None
    tiers = (_own_failures(outcomes), _stuck_or_left(outcomes), _odd_call_site(outcomes), failing)
    for tier, candidates in enumerate(tiers):
        if candidates:
            root = min(candidates, key=_when)
            root.role = ROOT
            root.why = _why(root, tier, outcomes)
            return root
    return None


def _own_failures(outcomes: list[RankOutcome]) -> list[RankOutcome]:
    own = [o for o in outcomes if o.own_error]
    own += [o for o in outcomes if o not in own and o.signal not in (None, "SIGTERM", "SIGINT") and not o.consequence
            and (o.error is None or not o.error.frames or o.native_abort or o.error.type == "Fatal Python error")]
    return own


def _stuck_or_left(outcomes: list[RankOutcome]) -> list[RankOutcome]:
    """Ranks with no error of their own while the others failed waiting for them."""
    waiting = [o for o in outcomes if o.consequence and o.error is not None]
    if not waiting:
        return []
    found = []
    for outcome in outcomes:
        if outcome.error is not None:
            continue
        if outcome.signal == "SIGTERM" or (outcome.stacks and outcome.signal is None):
            found.append(outcome)  # stopped while the others had already given up on it
        elif outcome.exit_code == 0 and (outcome.exited_at is not None or outcome.order is not None):
            # It finished while the others still waited for it: its sockets closing is what they saw. (Its
            # exit is recorded once its interpreter is gone, after they saw the sockets close.)
            found.append(outcome)
    return found


def _odd_call_site(outcomes: list[RankOutcome]) -> list[RankOutcome]:
    """Among ranks that all failed waiting, the one whose collective differs from the others' (broadcast vs all_reduce)."""
    calls = {o.rank: _collective(o) for o in outcomes if o.consequence and o.error is not None}
    named = {rank: call for rank, call in calls.items() if call}
    if len(named) < 3 or len(set(named.values())) != 2:
        return []
    counts: dict[str, int] = {}
    for call in named.values():
        counts[call] = counts.get(call, 0) + 1
    odd = min(counts, key=lambda call: counts[call])
    if counts[odd] * 2 >= len(named):
        return []
    return [o for o in outcomes if named.get(o.rank) == odd]


def _collective(outcome: RankOutcome) -> str:
    """The torch.distributed call a rank failed in (the frame below the c10d logger's wrapper)."""
    frames = outcome.error.frames if outcome.error is not None else []
    for frame in reversed(frames):
        if frame.file.replace("\\", "/").endswith("distributed/distributed_c10d.py"):
            return frame.function
    return ""


def _when(outcome: RankOutcome) -> tuple[float, float, int]:
    at = outcome.failed_at if outcome.failed_at is not None else outcome.exited_at
    return (at if at is not None else float("inf"), outcome.order if outcome.order is not None else float("inf"), outcome.rank)


def _why(root: RankOutcome, tier: int, outcomes: list[RankOutcome]) -> str:
    others = [o for o in outcomes if o is not root and o.failed]
    said = "; ".join(f"rank {o.rank}: {o.consequence}" for o in others if o.consequence)
    tail = f" The others failed of consequences ({said})." if said else ""
    if tier == 0:
        if root.own_error:
            lead = f"rank {root.rank} failed first with an error of its own"
        elif root.native_abort:
            lead = f"rank {root.rank} aborted in C++ ({root.signal}, no Python traceback)"
        else:
            lead = f"rank {root.rank} died of {root.signal}" + (f": {root.oom}" if root.oom else "")
        return lead + "." + tail
    if tier == 2:
        return (f"every rank failed waiting in a collective, and rank {root.rank} called {_collective(root)} while the "
                f"others called {', '.join(sorted({_collective(o) for o in outcomes if o.error is not None and o is not root and _collective(o)}))}: "
                "the ranks' collectives did not pair." + tail)
    if tier == 1:
        if root.exit_code == 0:
            return f"rank {root.rank} left the job (exit 0) while the other ranks still waited for it in a collective." + tail
        where = f" in {_where(root.stacks)}" if root.stacks else ""
        return f"rank {root.rank} had no error but never joined the collective the others waited in: it was stuck or busy{where}." + tail
    return f"every rank failed of a known consequence; rank {root.rank}'s was the first." + tail


def _error_text(outcome: RankOutcome) -> str:
    if outcome.error is not None and outcome.error.type:
        return f"{outcome.error.type}: {outcome.error.message}"
    return ""


def _where(frames: list[Frame]) -> str:
    user = [f for f in frames if f.user]
    frame = (user or frames)[-1]
    return f"{frame.function} ({frame.file.rsplit('/', 1)[-1]}:{frame.line})"


def _iso(at: float | None) -> str | None:
    if at is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(at)) + f".{int((at % 1) * 1000):03d}"
