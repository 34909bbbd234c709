"""The Incident: plain data describing one failure, produced by live capture or the log parser."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

KINDS = ("exception", "hard-crash", "hang", "nan", "silent")

# Where library code lives; anything else on a stack is the user's.
_LIBRARY_PATH = re.compile(
    r"""
      [\\/](?:site|dist)-packages[\\/]
    | [\\/]lib[\\/]python\d(?:\.\d+)?[\\/]        # CPython's standard library (posix)
    | [\\/]Lib[\\/](?!site-packages)              # CPython's standard library (windows)
    | (?i:\\(?:envs\\[^\\]+|anaconda\d*|miniconda\d*|python\d*)\\lib\\)(?!site-packages)   # conda/venv stdlib (windows)
    | [\\/](?:torch|torchvision|torchaudio|transformers|accelerate|lightning|pytorch_lightning|lightning_fabric
              |deepspeed|timm|peft|diffusers|datasets|torchmetrics|apex|fairscale|xformers|triton|numpy|tqdm)[\\/]
              (?!(?:.*[\\/])?(?:examples|scripts)[\\/])   # a clone's examples are someone's own scripts
    | ^<frozen\ | ^<string>$ | ^<__array_function__
    | [\\/]bin[\\/](?:torchrun|accelerate|deepspeed|lightning|python[\d.]*)$   # launchers
    """,
    re.VERBOSE,
)


def is_user_path(path: str) -> bool:
    """True when a frame's file is the user's own code rather than a library or the stdlib."""
    if not path:
        return False
    if path.startswith(("Cell In[", "<ipython-input-", "Input In [", "/tmp/ipykernel_")):
        return True
    return not _LIBRARY_PATH.search(path)


@dataclass
class Frame:
    """One stack frame: where it is, the source line, and whether it is user code."""

    file: str
    line: int | None
    function: str
    code: str | None = None
    user: bool = False
    locals: dict[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> str:
        line = f":{self.line}" if self.line is not None else ""
        return f"{self.file}{line} in {self.function}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "code": self.code,
            "user": self.user,
        }
        if self.locals:
            out["locals"] = self.locals
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Frame:
        return cls(
            file=data.get("file", ""),
            line=data.get("line"),
            function=data.get("function", ""),
            code=data.get("code"),
            user=bool(data.get("user", False)),
            locals=dict(data.get("locals") or {}),
        )


@dataclass
class ExceptionInfo:
    """One exception: its type, message and frames, innermost frame last.

    `type` is the name as printed (`RuntimeError`, `torch.OutOfMemoryError`);
    `link` says how it joins the exception printed before it in a chain
    (`cause`, `context` or None), `rank` and `worker` where the log or the
    capture said so, `wrapper` that the real failure was unwrapped from this
    one's message (a DataLoader worker's traceback), and `line_no` is its
    position in the log (for ordering).

    `side_frames` is a stack PyTorch prints beside the traceback, innermost
    last, and `side_label` says which: "forward call" (anomaly mode's trace of
    the forward operation whose backward failed) or "user code" (the code
    Dynamo was tracing when torch.compile failed). `frames` stays exactly the
    traceback Python printed.
    """

    type: str
    message: str
    frames: list[Frame] = field(default_factory=list)
    link: str | None = None
    rank: int | None = None
    worker: int | None = None
    wrapper: bool = False
    line_no: int | None = None
    side_frames: list[Frame] = field(default_factory=list)
    side_label: str = ""

    @property
    def short_type(self) -> str:
        return self.type.rsplit(".", 1)[-1]

    @property
    def headline(self) -> str:
        first = self.message.split("\n", 1)[0]
        return f"{self.type}: {first}" if first else self.type

    def user_frame(self) -> Frame | None:
        """The innermost frame in the user's own code."""
        for frame in reversed(self.frames):
            if frame.user:
                return frame
        return None

    def side_user_frame(self) -> Frame | None:
        """The innermost frame of the side stack in the user's own code."""
        for frame in reversed(self.side_frames):
            if frame.user:
                return frame
        return None

    @property
    def spawn_echo(self) -> bool:
        """A spawned child that died unpickling what its parent sent (`EOFError: Ran out of input` in
        multiprocessing's spawn bootstrap): the echo of the parent's own error, printed beside it on Windows."""
        if self.short_type != "EOFError":
            return False  # a child's own failure (`Can't get attribute 'X' on <module '__main__'>`) is the cause
        return any(frame.function in ("spawn_main", "_main")
                   and frame.file.replace("\\", "/").endswith("multiprocessing/spawn.py") for frame in self.frames[-3:])

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.type,
            "message": self.message,
            "frames": [f.to_dict() for f in self.frames],
        }
        for key in ("link", "rank", "worker"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.wrapper:
            out["wrapper"] = True
        if self.side_frames:
            out["side_frames"] = [f.to_dict() for f in self.side_frames]
            out["side_label"] = self.side_label
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExceptionInfo:
        return cls(
            type=data.get("type", ""),
            message=data.get("message", ""),
            frames=[Frame.from_dict(f) for f in data.get("frames") or []],
            link=data.get("link"),
            rank=data.get("rank"),
            worker=data.get("worker"),
            wrapper=bool(data.get("wrapper", False)),
            side_frames=[Frame.from_dict(f) for f in data.get("side_frames") or []],
            side_label=data.get("side_label") or "",
        )


@dataclass
class Incident:
    """Everything known about one failure, with no live objects in it.

    `exception` is the root cause; `exceptions` holds every exception seen, in
    the order printed (the root cause among them). `log_lines` are the cleaned
    lines around the failure that are not part of a traceback (CUDA assertion
    lines, NCCL messages, warnings, a dying worker's last words). `facts` holds
    summarised live state (tensors, modules, loaders) keyed by name.
    """

    kind: str = "exception"
    source: str = "log"
    exception: ExceptionInfo | None = None
    exceptions: list[ExceptionInfo] = field(default_factory=list)
    log_lines: list[str] = field(default_factory=list)
    exit_code: int | None = None
    signal: str | None = None
    rank: int | None = None
    worker: int | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown incident kind {self.kind!r}; expected one of {KINDS}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "exception": self.exception.to_dict() if self.exception else None,
            "exit_code": self.exit_code,
            "rank": self.rank,
            "worker": self.worker,
            "signal": self.signal,
            "exceptions": [e.to_dict() for e in self.exceptions],
            "log_lines": self.log_lines,
            "facts": self.facts,
            "notes": self.notes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "log") -> Incident:
        exceptions = [ExceptionInfo.from_dict(e) for e in data.get("exceptions") or []]
        root = ExceptionInfo.from_dict(data["exception"]) if data.get("exception") else None
        return cls(
            kind=data.get("kind", "exception"),
            source=source,
            exception=root,
            exceptions=exceptions or ([root] if root else []),
            log_lines=list(data.get("log_lines") or []),
            exit_code=data.get("exit_code"),
            signal=data.get("signal"),
            rank=data.get("rank"),
            worker=data.get("worker"),
            facts=dict(data.get("facts") or {}),
            notes=list(data.get("notes") or []),
        )
