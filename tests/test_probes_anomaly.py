"""anomaly_rerun on real NaN and in-place failures, replayed from the live context without touching the user's model."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from _probe_fixtures import StateGuard, diagnosis, isolated, live_context, raised
from triage.incident import Incident
from triage.probes.anomaly_rerun import anomaly_rerun
from triage.probes.context import ProbeContext
from triage.tracking import Tracker


class LogModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        h = self.fc(x)  # below: log(0) is -inf, log of a negative is nan
        h = torch.log(h - h.max())
        return self.out(h)


class InplaceModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        y = torch.sigmoid(self.fc(x))  # sigmoid keeps its output for backward
        y += 1
        return self.out(y)


def test_anomaly_rerun_names_the_op_and_line_where_nan_starts():
    torch.manual_seed(0)
    model, loss_fn = LogModel(), nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters())
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    sum(p.sum() for p in model.parameters()).backward()
    optimizer.step()  # a finite step: Adam holds state (and .grad is set) that the probe must not touch
    tracker = Tracker(model=model, optimizer=optimizer, loss_fn=loss_fn, batch=(x, y), batch_index=1, steps=1)
    ctx = ProbeContext(incident=Incident(kind="nan", source="run"), model=model, batch=(x, y), loss_fn=loss_fn,
                       optimizer=optimizer, diagnosis=diagnosis("nan"))
    guard = StateGuard(model, optimizer=optimizer)
    outcome = isolated(anomaly_rerun, ctx)
    guard.assert_unchanged()
    assert tracker.steps == 1
    assert outcome.status == "confirmed"
    assert "first non-finite value in the forward pass: log at " in outcome.detail
    assert "`h = torch.log(h - h.max())` produced nan from finite inputs" in outcome.detail
    assert "in backward, MseLossBackward0 returned nan" in outcome.detail


def test_anomaly_rerun_names_the_inplace_write_and_the_op_that_needed_the_value():
    model, loss_fn = InplaceModel(), nn.MSELoss()
    x, y = torch.randn(2, 4), torch.randn(2, 1)
    exc = raised(lambda: loss_fn(model(x), y).backward())
    assert "modified by an inplace operation" in str(exc)
    ctx = dataclasses.replace(live_context(exc, model=model, loss_fn=loss_fn, batch=(x, y)),
                              diagnosis=diagnosis("inplace"))
    guard = StateGuard(model)
    outcome = isolated(anomaly_rerun, ctx)
    guard.assert_unchanged()
    assert outcome.status == "confirmed"
    assert "the in-place add_ at " in outcome.detail
    assert "`y += 1` modified the output of Sigmoid" in outcome.detail
    assert "made by sigmoid at " in outcome.detail and "`y = torch.sigmoid(self.fc(x))" in outcome.detail
    assert "in forward: `y = torch.sigmoid(self.fc(x))" in outcome.facts["forward_line"]


def test_anomaly_rerun_refutes_nan_when_the_step_is_finite():
    model, loss_fn = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1)), nn.MSELoss()
    x, y = torch.randn(3, 4), torch.randn(3, 1)
    ctx = ProbeContext(incident=Incident(kind="nan", source="run"), model=model, loss_fn=loss_fn, batch=(x, y),
                       diagnosis=diagnosis("nan"))
    outcome = isolated(anomaly_rerun, ctx)
    assert outcome.status == "refuted"
    assert "all gradients finite" in outcome.detail
    assert model[0].weight.grad is None  # the backward ran in the experiment's child


def test_anomaly_rerun_reports_parameters_that_are_already_nan():
    model, loss_fn = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1)), nn.MSELoss()
    with torch.no_grad():
        model[1].weight[0, 0] = float("nan")
    ctx = ProbeContext(incident=Incident(kind="nan", source="run"), model=model, loss_fn=loss_fn,
                       batch=(torch.randn(2, 4), torch.randn(2, 1)))
    outcome = isolated(anomaly_rerun, ctx)
    assert outcome.status == "confirmed"
    assert "parameters already non-finite before the step: 1.weight" in outcome.detail


def test_anomaly_rerun_without_a_loss_backpropagates_the_output_sum():
    model = InplaceModel()
    x = torch.randn(2, 4)
    ctx = ProbeContext(incident=Incident(kind="exception", source="run"), model=model, batch=x,
                       diagnosis=diagnosis("inplace"))
    outcome = isolated(anomaly_rerun, ctx)
    assert outcome.status == "confirmed"
    assert "`y += 1` modified the output of Sigmoid" in outcome.detail
