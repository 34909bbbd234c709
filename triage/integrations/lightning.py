"""Lightning: `Trainer(callbacks=[TriageCallback()])` diagnoses an exception raised in fit, validate, test or
predict with the live LightningModule, its optimizer and the failing batch.

Lightning calls `on_exception` before its teardown moves the model and optimizer to the CPU, so that is where
the diagnosis runs, on the state as it was at the failure. Under `python -m triage` or `triage.install()`,
which diagnose every uncaught exception themselves, the callback hands them its live state instead (the
shared Tracker), so that there is one report.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from .. import tracking
from ..tracking import TRACKER, Tracker
from . import reporting

# Catchers that diagnose the exception after it leaves fit() and cannot see the callback's report.
_DIAGNOSE_LATER = ("runner", "install")


class TriageCallback(Callback):
    """Records each batch by reference as a step begins, and diagnoses the exception that ends the run.

    `report` is the Report of the last failure (None until one is diagnosed here).
    """

    def __init__(self) -> None:
        self.batch: Any = None
        self.batch_index: int | None = None
        self.report: Any = None

    def _record(self, batch: Any, batch_idx: int) -> None:
        self.batch, self.batch_index = batch, batch_idx

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._record(batch, batch_idx)

    def on_validation_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        self._record(batch, batch_idx)

    def on_test_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        self._record(batch, batch_idx)

    def on_predict_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int,
                               dataloader_idx: int = 0) -> None:
        self._record(batch, batch_idx)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, Exception):
            return  # Ctrl-C and SystemExit are not failures to diagnose
        later = tracking.capture_owner in _DIAGNOSE_LATER
        tracker = TRACKER if later else Tracker()
        tracker.model = pl_module
        optimizers = getattr(trainer, "optimizers", None) or []
        tracker.optimizer = optimizers[0] if optimizers else tracker.optimizer
        tracker.batch, tracker.batch_index = self.batch, self.batch_index
        tracker.steps = trainer.global_step
        if not later:
            # Under pytest --triage the plugin attaches the report to the test; printing it too would repeat it.
            self.report = reporting.diagnose_exception(exception, tracker, quiet=tracking.capture_owner == "pytest")
