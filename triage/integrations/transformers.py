"""Hugging Face: `Trainer(callbacks=[TriageCallback()])` gives triage the live model, optimizer and failing
batch of `trainer.train()`.

The Trainer has no exception event, and the exception leaves `train()` with the state intact (it has no
teardown on failure), so the callback does not catch anything itself: from `on_train_begin` it tells the
shared Tracker the model, the optimizer and the DataLoader, records each batch by reference as the model
is called (a forward pre-hook), and makes sure something diagnoses the uncaught exception: `triage.install()`
(the excepthook, or IPython's handler in a notebook) unless the runner, `%load_ext triage` or
`pytest --triage` already does. A run that ends normally puts all of it back.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from .. import tracking, wrapper
from ..tracking import TRACKER

_TRACKED = ("model", "optimizer", "loader", "batch", "batch_index", "steps", "model_call")


class TriageCallback(TrainerCallback):
    """Feeds triage the Trainer's live objects during `train()`; the exception that ends it is diagnosed."""

    def __init__(self) -> None:
        self._hook: Any = None
        self._saved: dict[str, Any] = {}
        self._installed_here = False

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: Any = None, optimizer: Any = None, train_dataloader: Any = None, **kwargs: Any) -> None:
        self._saved = {name: getattr(TRACKER, name) for name in _TRACKED}
        TRACKER.model = model
        # accelerate wraps the optimizer; the probes want the torch optimizer that holds the parameter groups.
        TRACKER.optimizer = getattr(optimizer, "optimizer", optimizer)
        TRACKER.loader = train_dataloader
        TRACKER.steps = state.global_step
        if model is not None and hasattr(model, "register_forward_pre_hook"):
            self._hook = model.register_forward_pre_hook(_record_inputs, with_kwargs=True)
        if tracking.capture_owner is None and not wrapper.installed():
            wrapper.install()
            self._installed_here = True

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        TRACKER.steps = state.global_step

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        for name, value in self._saved.items():
            setattr(TRACKER, name, value)
        if self._installed_here:
            wrapper.uninstall()
            self._installed_here = False


def _record_inputs(module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
    """The Trainer calls `model(**inputs)`: those inputs are the batch, held by reference (a dict of our own).

    Its index is unknown here: the DataLoader's count (under the runner) runs ahead, as accelerate fetches a
    batch early to know when an epoch ends."""
    TRACKER.model_call = (args, kwargs)
    TRACKER.batch = dict(kwargs) if kwargs else args
    TRACKER.batch_index = None
