"""Training-health checks: real small training loops, in-process, each checked for the finding its bug produces."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from triage import health  # noqa: E402
from triage.tracking import Tracker  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


class Swish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad_output * s * (1 + x * (1 - s))


class FlippedSwish(Swish):
    @staticmethod
    def backward(ctx, grad_output):
        return -Swish.backward(ctx, grad_output)


@pytest.fixture
def monitored():
    """A HealthMonitor hooked into torch.autograd.backward for the test, with a Tracker counting optimizer steps."""
    tracker = Tracker()
    monitor = health.HealthMonitor(tracker)
    undo = monitor.install()
    try:
        yield monitor, tracker
    finally:
        undo()


def _counted(optimizer, tracker: Tracker):
    optimizer.register_step_post_hook(lambda opt, args, kwargs: tracker.on_step(opt))
    return optimizer


def _classification(n: int = 480, features: int = 12, classes: int = 4, related: bool = True):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=generator)
    y = x[:, :classes].argmax(1) if related else torch.randint(0, classes, (n,), generator=generator)
    return x, y


def _train(model, optimizer, x, y, steps: int, batch: int = 32, step: bool = True, zero: bool = True, loss_fn=None):
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    for index in range(steps):
        start = (index * batch) % len(x)
        if zero:
            optimizer.zero_grad()
        loss = loss_fn(model(x[start:start + batch]), y[start:start + batch])
        loss.backward()
        if step:
            optimizer.step()


def _checks(findings) -> dict[str, health.Finding]:
    return {finding.check: finding for finding in findings}


def test_backward_without_step_counts_the_calls_and_names_the_optimizer(monitored):
    monitor, tracker = monitored
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = _counted(torch.optim.Adam(model.parameters(), lr=1e-3), tracker)
    x, y = _classification()
    _train(model, optimizer, x, y, steps=30, step=False)
    found = _checks(monitor.findings(tracker.steps, {"model": model, "optimizer": optimizer}))
    line = found["backward-without-step"].line
    assert "30 backward() calls and 0 optimizer steps" in line
    assert "threshold: 10 backward calls" in line and "Adam over 4 tensors" in line


def test_head_replaced_after_the_optimizer_is_named(monitored):
    monitor, tracker = monitored
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 10))
    optimizer = _counted(torch.optim.SGD(model.parameters(), lr=0.05), tracker)
    model[2] = nn.Linear(16, 4)
    x, y = _classification()
    _train(model, optimizer, x, y, steps=30)
    found = _checks(monitor.findings(tracker.steps, {"model": model}))
    assert "model.2.weight, model.2.bias" in found["params-not-in-optimizer"].line
    # the replaced layer's parameters are still in the optimizer, and no gradient reaches them any more
    assert "no module holds any more" in found["no-gradient"].line


def test_detached_encoder_never_gets_gradients(monitored):
    monitor, tracker = monitored
    torch.manual_seed(0)
    encoder, head = nn.Linear(12, 8), nn.Linear(8, 4)
    optimizer = _counted(torch.optim.Adam([*encoder.parameters(), *head.parameters()], lr=1e-2), tracker)
    x, y = _classification()
    _train(lambda inputs: head(encoder(inputs).detach()), optimizer, x, y, steps=30)
    line = _checks(monitor.findings(tracker.steps, {"encoder": encoder, "head": head}))["no-gradient"].line
    assert "2 of 4 optimized parameters" in line and "encoder.weight, encoder.bias" in line


def test_a_healthy_run_and_a_deliberately_frozen_backbone_are_silent(monitored):
    monitor, tracker = monitored
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(12, 32), nn.ReLU())
    model = nn.Sequential(backbone, nn.Linear(32, 4))
    backbone.requires_grad_(False)
    optimizer = _counted(torch.optim.Adam(model.parameters(), lr=1e-2), tracker)
    x, y = _classification()
    _train(model, optimizer, x, y, steps=120)
    assert monitor.findings(tracker.steps, {"model": model}) == []


def test_labels_unrelated_to_inputs_sit_at_log_c(monitored):
    monitor, tracker = monitored
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = _counted(torch.optim.SGD(model.parameters(), lr=0.01), tracker)
    x, y = _classification(n=3200, related=False)
    _train(model, optimizer, x, y, steps=100)
    finding = _checks(monitor.findings(tracker.steps, {"model": model}))["loss-at-chance"]
    assert f"log(4) = {math.log(4):.4f} for 4 classes" in finding.line and "over 100 steps" in finding.line


def test_gradients_never_cleared(monitored):
    monitor, tracker = monitored
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 4))
    optimizer = _counted(torch.optim.SGD(model.parameters(), lr=1e-3), tracker)
    x, y = _classification()
    _train(model, optimizer, x, y, steps=60, zero=False)
    assert "gradients-not-cleared" in _checks(monitor.findings(tracker.steps, {"model": model}))


def test_gradient_accumulation_is_not_mistaken_for_missing_zero_grad(monitored):
    monitor, tracker = monitored
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = _counted(torch.optim.Adam(model.parameters(), lr=3e-3), tracker)
    x, y = _classification()
    criterion = nn.CrossEntropyLoss()
    for index in range(120):
        start = (index * 16) % len(x)
        criterion(model(x[start:start + 16]), y[start:start + 16]).div(4).backward()
        if (index + 1) % 4 == 0:
            optimizer.step()
            optimizer.zero_grad()
    assert monitor.findings(tracker.steps, {"model": model}) == []


def test_softmax_before_cross_entropy_is_read_from_the_graph(monitored):
    monitor, tracker = monitored
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 4), nn.Softmax(dim=1))
    optimizer = _counted(torch.optim.Adam(model.parameters(), lr=1e-3), tracker)
    x, y = _classification()
    _train(model, optimizer, x, y, steps=25)
    line = _checks(monitor.findings(tracker.steps, {"model": model}))["softmax-before-cross-entropy"].line
    assert "(shape [32, 4], 4 classes)" in line


def test_dead_relus_give_exactly_zero_gradients(monitored):
    monitor, tracker = monitored
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))
    nn.init.constant_(model[0].bias, -50.0)
    optimizer = _counted(torch.optim.SGD(model.parameters(), lr=0.01), tracker)
    x, y = _classification()
    _train(model, optimizer, x, y, steps=80)
    line = _checks(monitor.findings(tracker.steps, {"model": model}))["zero-gradient"].line
    assert "model.0.weight" in line and "100% zeros" in line


def test_most_backward_calls_skip_the_checks_and_every_due_one_runs_them(monitored, monkeypatch):
    # The hook's per-step cost is one comparison with the next due count; the work itself keeps its schedule:
    # the first graphs and then powers of two walked, the loss read at every `every`-th call.
    monitor, tracker = monitored
    visited: list[int] = []
    before = monitor.before_backward
    monkeypatch.setattr(monitor, "before_backward", lambda tensors, count: visited.append(count) or before(tensors, count))
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = _counted(torch.optim.SGD(model.parameters(), lr=0.1), tracker)
    _train(model, optimizer, *_classification(), steps=200)
    graphs = [count for count in range(1, 201) if count <= health.GRAPH_SAMPLES_DENSE or not count & (count - 1)]
    reads = [count for count in range(1, 201) if not count % health.LOSS_EVERY_START]
    assert set(graphs + reads) <= set(visited)
    assert len(visited) < 200 // 2, visited  # the zero_grad checks add one call per 16; nothing else runs
    assert monitor.graph_samples == len(graphs)
    assert [count for count, _ in monitor.losses] == list(range(4, 201, 4))


def test_a_flipped_custom_backward_is_caught_and_a_correct_one_is_not():
    assert health.backward_mismatch(FlippedSwish, 1) is not None
    assert health.backward_mismatch(Swish, 1) is None


def test_memory_growth_is_attributed_to_the_list_that_holds_graphs():
    monitor = health.HealthMonitor()
    monitor.backwards = 100
    monitor.memory = [[step, 300 * 2**20 + step * 2**20] for step in range(1, 101)]
    weight = torch.randn(4, 4, requires_grad=True)
    kept = [(weight * step).sum() for step in range(20)]
    finding = _checks(monitor.findings(steps=100, main_globals={"val_history": kept}))["memory-growing"]
    assert "1.000 MiB per step" in finding.line and "`val_history`, a list of 20 tensors with grad_fn" in finding.line
    flat = health.HealthMonitor()
    flat.backwards = 100
    flat.memory = [[step, 300 * 2**20 + (step % 3) * 2**20] for step in range(1, 101)]
    assert flat._memory_check({}) == []


def test_gradcheck_probe_confirms_a_wrong_backward(monitored):
    from triage.incident import Incident
    from triage.probes.context import ProbeContext
    from triage.probes.gradcheck import gradcheck

    monitor, _tracker = monitored
    previous, health.MONITOR = health.MONITOR, monitor
    try:
        x = torch.randn(3, 4, requires_grad=True)
        FlippedSwish.apply(x).sum().backward()
        result = gradcheck(ProbeContext(incident=Incident(kind="silent")))
        assert result.status == "confirmed" and "FlippedSwish" in result.detail
        monitor.custom_functions = {"Swish": Swish}
        assert gradcheck(ProbeContext(incident=Incident(kind="silent"))).status == "refuted"
    finally:
        health.MONITOR = previous


def test_a_pasted_silent_report_is_diagnosed_by_explain():
    line = ("triage: silent: params-not-in-optimizer: 2 parameters get gradients but are in no optimizer's "
            "param_groups: net.fc.weight, net.fc.bias (the optimizers hold 6 other tensors; watched 10 backward "
            "graphs; threshold: any)")
    done = subprocess.run([sys.executable, "-m", "triage", "explain", "-", "--format", "json"], input=line,
                          capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    report = json.loads(done.stdout)
    assert report["incident"]["kind"] == "silent"
    assert report["diagnoses"][0]["rule"] == "learning.params-not-in-optimizer"
    assert "net.fc.weight" in report["diagnoses"][0]["title"]


def test_the_runner_reports_a_finished_run_that_did_not_learn_and_keeps_exit_0(tmp_path):
    script = REPO / "corpus" / "scripts" / "learning" / "accumulation_step_never_reached.py"
    done = subprocess.run([sys.executable, "-m", "triage", "--no-probes", "--report-dir", str(tmp_path / "r"), str(script)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO), "TRIAGE_DEBUG": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["incident"]["kind"] == "silent"
    assert report["diagnoses"][0]["rule"] == "learning.backward-without-step"
    assert report["diagnoses"][0]["category"] == "learning"
    loss_curve = report["incident"]["facts"]["health"]["loss"]
    assert loss_curve[-1][0] == 80 and all(0.0 < value < 1.0 for _, value in loss_curve)  # 80 backward calls
    assert (tmp_path / "r" / "report.html").exists()


def test_watch_with_health_reports_the_block_when_it_ends(monkeypatch):
    import triage
    from triage import wrapper

    seen = []
    monkeypatch.setattr(wrapper, "incident_handler", lambda incident, tracker: seen.append(incident))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model[2] = nn.Linear(16, 4)  # replaced after the optimizer was built
    x, y = _classification()
    with triage.watch(model=model, optimizer=optimizer, health=True):
        _train(model, optimizer, x, y, steps=30)
    assert health.MONITOR is None  # the block's monitor is gone with it
    assert len(seen) == 1 and seen[0].kind == "silent"
    assert any("params-not-in-optimizer" in line and "2 parameters" in line for line in seen[0].log_lines)


def test_loss_values_kept_as_device_scalars_are_settled_in_one_copy():
    monitor = health.HealthMonitor()
    monitor.backwards = 3
    monitor.losses = [[1, torch.tensor(0.5)], [2, 0.25], [3, torch.tensor(0.125)]]
    health._compact(monitor.losses)  # buckets merge on the device as they would on a GPU
    assert monitor.series()["loss"] == [[2, 0.375], [3, 0.125]]


class _GraphNode:
    """A graph node as torch 2.11 hands them out: each access to `next_functions` makes new Python objects, so a
    walk that drops a node can meet its id again on another node (on an H100 machine every run was told its
    parameters never got a gradient)."""

    def __init__(self, children=(), variable=None) -> None:
        self._children, self.variable = children, variable

    @property
    def next_functions(self):
        return tuple((make(), 0) for make in self._children)


def _node(name: str, *children, variable=None):
    return lambda: type(name, (_GraphNode,), {})(children, variable)


def test_a_graph_walk_keeps_its_nodes_so_that_no_id_is_reused():
    model = nn.Linear(3, 2)
    linear = _node("AddmmBackward0", _node("AccumulateGrad", variable=model.bias), _node("TBackward0", _node(
        "AccumulateGrad", variable=model.weight)))
    loss = type("Loss", (), {"grad_fn": _node("MeanBackward0", _node("LogSoftmaxBackward0", linear))()})()
    monitor = health.HealthMonitor()
    for count in range(1, 4):
        monitor.walk_graph(loss, count)
        assert {id(model.weight), id(model.bias)} <= set(monitor.leaves), count
