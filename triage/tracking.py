"""What a live run is doing right now: step, last batch, model, optimizer. Filled by hooks, read at a crash.

The runner's automatic hooks and the training-loop wrapper both feed one
Tracker; capture and probes read it. It holds references only (never copies
a tensor), so keeping the last batch costs nothing per step, and the CPU batch
a DataLoader yielded survives a poisoned CUDA context.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

# Outermost module calls kept, one per module (a model, its loss, a GAN's two networks, an eval model).
MAX_OUTER_CALLS = 6


@dataclass(slots=True)
class OuterCall:
    """One outermost nn.Module call (a call made from outside every module's forward): its arguments by reference.

    The module is held weakly, so that a model the script dropped (one per fold or trial) is freed, with the
    arguments of its call. `output` is a weak reference to the call's main output tensor once it returned (None
    before, or when the output holds no tensor): it tells which model produced the tensor a later failing call
    was given, without keeping that tensor or its graph alive.
    """

    module_ref: Any
    args: tuple
    kwargs: dict
    output: Any = None
    # The optimizer step count at the call, and how many calls of the module that step has seen (a siamese
    # encoder called on anchors, positives and negatives: its last call alone is not the step).
    step: int = 0
    repeats: int = 1

    @property
    def module(self) -> Any:
        return self.module_ref()


@dataclass
class Tracker:
    """References to the live training objects, and counters of progress."""

    model: Any = None
    optimizer: Any = None
    loss_fn: Any = None
    loader: Any = None
    batch: Any = None
    batch_index: int | None = None
    batches_seen: int = 0
    steps: int = 0
    iterators: int = 0
    last_loss: Any = None
    listeners: list[Callable[[str, int], None]] = field(default_factory=list)
    # The arguments of the model's and the loss function's latest calls, (args, kwargs), by reference.
    model_call: tuple[tuple, dict] | None = None
    loss_call: tuple[tuple, dict] | None = None
    # Every outermost module call, latest last, keyed by id(module), while the runner records them (calls_recorded).
    outer_calls: dict[int, OuterCall] = field(default_factory=dict)
    calls_recorded: bool = False
    # 1 while an outermost module call runs: the calls nested in it are not recorded.
    call_depth: int = 0
    # Non-zero while triage itself iterates a DataLoader or runs a model (probes): not the user's progress.
    suspended: int = 0
    # True inside `triage.watch(...)`, whose own hooks then count steps and check for NaN.
    watch_active: bool = False

    def on_batch(self, batch: Any, loader: Any = None) -> None:
        """A DataLoader yielded `batch`: its tensors are held by reference, in a container of our own, so that
        `batch[k] = batch[k].cuda()` in the loop leaves ours on the CPU (where a poisoned GPU cannot reach)."""
        if self.suspended:
            return
        kind = type(batch)
        self.batch = list(batch) if kind is list else dict(batch) if kind is dict else batch
        self.batch_index = self.batches_seen
        self.batches_seen += 1
        if loader is not None:
            self.loader = loader
        for listener in self.listeners:  # inline, not a helper: a call per batch costs right after a step
            listener("batch", self.batches_seen)

    def on_iter(self, loader: Any = None) -> None:
        """Iteration over a DataLoader began (an epoch, or a validation pass): batches are now expected."""
        if self.suspended:
            return
        self.iterators += 1
        if loader is not None:
            self.loader = loader
        for listener in self.listeners:
            listener("iter", self.iterators)

    def on_step(self, optimizer: Any = None) -> None:
        """An optimizer step (triage's hooks count it as it begins: one hook per step is cheaper than two)."""
        if self.suspended:
            return
        self.steps += 1
        if optimizer is not None and self.optimizer is None:
            self.optimizer = optimizer
        for listener in self.listeners:
            listener("step", self.steps)

    def new_outer_call(self, module: Any) -> OuterCall:
        """An entry for a module seen for the first time (the recorder fills it and files it under id(module)):
        the calls of modules the script dropped go, then the oldest one beyond MAX_OUTER_CALLS."""
        calls = self.outer_calls
        for stale in [k for k, c in calls.items() if c.module_ref() is None]:
            del calls[stale]
        while len(calls) >= MAX_OUTER_CALLS:
            del calls[next(iter(calls))]
        return OuterCall(weakref.ref(module), (), {}, step=-1, repeats=0)

    def latest_calls(self) -> list[OuterCall]:
        """The recorded outermost calls of modules still alive, latest last."""
        return [c for c in list(self.outer_calls.values()) if c.module_ref() is not None]

    def reset(self) -> None:
        listeners = self.listeners
        self.__init__()
        self.listeners = listeners


TRACKER = Tracker()
# Who diagnoses this process's uncaught exceptions: None, "install" (triage.install()) or "runner" (set as
# the runner's child starts, so that a script calling install() under `python -m triage` is diagnosed once),
# "ipython" (%load_ext triage) or "pytest" (pytest --triage, while a test runs): see triage/integrations/.
capture_owner: str | None = None
