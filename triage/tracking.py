"""What a live run is doing right now: step, last batch, model, optimizer. Filled by hooks, read at a crash.

The runner's automatic hooks and the training-loop wrapper both feed one
Tracker; capture and probes read it. It holds references only (never copies
a tensor), so keeping the last batch costs nothing per step, and the CPU batch
a DataLoader yielded survives a poisoned CUDA context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


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

    def reset(self) -> None:
        listeners = self.listeners
        self.__init__()
        self.listeners = listeners


TRACKER = Tracker()
# Who diagnoses this process's uncaught exceptions: None, "install" (triage.install()) or "runner" (set as
# the runner's child starts, so that a script calling install() under `python -m triage` is diagnosed once),
# "ipython" (%load_ext triage) or "pytest" (pytest --triage, while a test runs): see triage/integrations/.
capture_owner: str | None = None
