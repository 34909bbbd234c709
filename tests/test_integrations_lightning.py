"""TriageCallback on a real failing Lightning `Trainer.fit()` (CPU, a tiny module built here)."""

import signal

import pytest

pytest.importorskip("lightning")

import torch  # noqa: E402
from torch import nn  # noqa: E402
import lightning.pytorch as pl  # noqa: E402

from triage import tracking  # noqa: E402
from triage.integrations.lightning import TriageCallback  # noqa: E402
from triage.tracking import TRACKER  # noqa: E402


class WrongInFeatures(pl.LightningModule):
    """The data has 8 features; the layer was built for 6."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(module, callback, tmp_path):
    generator = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(20, 8, generator=generator),
                                          torch.randint(0, 3, (20,), generator=generator))
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                         callbacks=[callback])
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    return trainer


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the report folder goes to ./triage-reports
    return tmp_path


def test_failing_fit_is_diagnosed_with_the_live_model_and_batch(in_tmp, capsys):
    callback = TriageCallback()
    fit(WrongInFeatures(), callback, in_tmp)
    report = callback.report
    assert report is not None
    leading = report.diagnoses[0]
    assert (leading.rule, leading.category) == ("shape.linear-in-features", "shape")
    assert (leading.values["got"], leading.values["want"]) == ("8", "6")
    probes = {p.name: p for p in leading.probes}
    # shape_trace ran the live LightningModule on the failing batch and found the layer by its name.
    assert probes["shape_trace"].status == "confirmed"
    assert "head receives [4, 8]" in probes["shape_trace"].detail
    assert probes["save_batch"].status == "confirmed"
    saved = torch.load(report.artifacts["batch"], weights_only=True)
    assert [tuple(t.shape) for t in saved["batch"]] == [(4, 8), (4,)]
    assert "shape.linear-in-features" in capsys.readouterr().err  # printed as it happened


def test_under_install_the_callback_hands_its_state_over_instead_of_reporting_twice(in_tmp, monkeypatch, capsys):
    monkeypatch.setattr(tracking, "capture_owner", "install")
    saved = {name: getattr(TRACKER, name) for name in ("model", "optimizer", "batch", "batch_index", "steps")}
    try:
        callback = TriageCallback()
        module = WrongInFeatures()
        trainer = fit(module, callback, in_tmp)
        assert callback.report is None
        assert "triage:" not in capsys.readouterr().err
        assert TRACKER.model is module
        assert TRACKER.optimizer is trainer.optimizers[0]
        assert TRACKER.batch_index == 0 and [tuple(t.shape) for t in TRACKER.batch] == [(4, 8), (4,)]
    finally:
        for name, value in saved.items():
            setattr(TRACKER, name, value)


def test_keyboard_interrupt_is_not_diagnosed(in_tmp):
    class Interrupted(WrongInFeatures):
        def training_step(self, batch, batch_idx):
            raise KeyboardInterrupt

    callback = TriageCallback()
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    data = torch.utils.data.TensorDataset(torch.randn(4, 8), torch.zeros(4, dtype=torch.long))
    sigint = signal.getsignal(signal.SIGINT)  # Lightning ignores Ctrl-C while it shuts down
    try:
        with pytest.raises(SystemExit):  # Lightning turns Ctrl-C into a graceful exit(1)
            trainer.fit(Interrupted(), torch.utils.data.DataLoader(data, batch_size=4))
    finally:
        signal.signal(signal.SIGINT, sigint)
    assert callback.report is None
