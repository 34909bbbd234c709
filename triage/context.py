"""The live context of a failure: the Incident plus the live objects around it, which capture fills and probes read."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .incident import Incident


@dataclass
class ProbeContext:
    """The incident plus live references (all optional: a pasted log has none).

    `module` is the innermost nn.Module whose forward was running when the
    exception was raised, with the arguments it was called with; `batch` is the
    last batch the DataLoader yielded (CPU). `model_args`/`model_kwargs` are the
    arguments of the model's last call and `loss_args`/`loss_kwargs` those of the
    loss function's (recorded by the wrapper, or read from the traceback).
    `frames` are the user's live frames at the failure with their lines, innermost
    last (source_step.py replays the failing loop's statements from them).
    `model_args` come from the traceback or from the runner's record of the
    model's call (`calls_recorded`), never from a guess when that record exists.
    `diagnosis` is the hypothesis being tested (set by the probe runner for each
    probe). A probe that runs user code gets these in a forked child, where they
    are its own; the probes that run in the user's process (runner.IN_PROCESS)
    must not mutate any of them.
    """

    incident: Incident
    report_dir: Path | None = None
    exception: BaseException | None = None
    model: Any = None
    module: Any = None
    module_name: str | None = None
    module_args: tuple = ()
    module_kwargs: dict[str, Any] = field(default_factory=dict)
    batch: Any = None
    batch_index: int | None = None
    step: int | None = None
    loader: Any = None
    optimizer: Any = None
    loss_fn: Any = None
    script: str | None = None
    script_args: list[str] = field(default_factory=list)
    time_limit_s: float = 60.0
    model_args: tuple | None = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    loss_args: tuple | None = None
    loss_kwargs: dict[str, Any] = field(default_factory=dict)
    diagnosis: Any = None
    total_time_s: float = 120.0
    frames: list[tuple[Any, int]] = field(default_factory=list)
    # True when the runner recorded every outermost module call: the model's inputs are then never guessed.
    calls_recorded: bool = False
    # Why the recorded calls hold no call of the model to replay (a step that chains several modules), or ''.
    model_call_note: str = ""

    @property
    def live(self) -> bool:
        return self.exception is not None or self.model is not None or self.batch is not None
