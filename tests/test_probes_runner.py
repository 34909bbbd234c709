"""run_probes: time limits, failures kept inside their result, one run per probe and hypothesis, re-ranking."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from _probe_fixtures import diagnosis
from triage.diagnosis import ProbeResult
from triage.incident import Incident
from triage.probes import PROBES, known_probes
from triage.probes.context import ProbeContext
from triage.probes.runner import rerank, run_probes

def _boom(ctx):
    raise ZeroDivisionError("division by zero in a probe")


def _sleepy(ctx):
    time.sleep(5)
    return ProbeResult("sleepy", "confirmed", "never")


def _swallows(ctx):
    try:
        time.sleep(5)
    except Exception as exc:  # a probe that treats whatever the user's code raised as its finding
        return ProbeResult("swallows", "confirmed", f"found {exc!r}")
    return ProbeResult("swallows", "refuted", "never")


def _confirm(ctx):
    return ProbeResult("yes", "confirmed", f"run for {ctx.diagnosis.rule}")


def _refute(ctx):
    return ProbeResult("no", "refuted", "it is not so")


def _not_a_result(ctx):
    return "confirmed"


@pytest.fixture(autouse=True)
def test_probes(monkeypatch):
    for name in ("_boom", "_sleepy", "_swallows", "_confirm", "_refute", "_not_a_result"):
        monkeypatch.setitem(PROBES, name.strip("_"), f"{__name__}:{name}")


def _ctx(**fields) -> ProbeContext:
    return ProbeContext(incident=Incident(source="run"), **fields)


def test_every_registered_probe_has_an_importable_function():
    import importlib

    builtin = {"save_batch", "cpu_rerun", "index_range", "shape_trace", "device_census", "dtype_census",
               "anomaly_rerun", "workers0_rerun", "memory_breakdown"}
    assert builtin <= known_probes()
    for name in builtin:
        module, _, function = PROBES[name].partition(":")
        assert callable(getattr(importlib.import_module(module), function))


def test_a_probe_that_raises_is_an_error_result():
    d = diagnosis("shape", "boom")
    run_probes([d], _ctx())
    (outcome,) = d.probes
    assert outcome.status == "error"
    assert outcome.detail == "the probe failed: ZeroDivisionError: division by zero in a probe"
    assert outcome.seconds is not None


def test_a_probe_past_its_time_limit_is_stopped_on_the_main_thread():
    d = diagnosis("shape", "sleepy")
    started = time.monotonic()
    run_probes([d], _ctx(time_limit_s=0.3))
    assert time.monotonic() - started < 2
    (outcome,) = d.probes
    assert outcome.status == "error"
    assert outcome.detail.startswith("stopped at its time limit of 0.3 s (it was at ")
    assert "in _sleepy: `time.sleep(5)`" in outcome.detail


def test_a_probe_cannot_mistake_its_time_limit_for_a_finding():
    d = diagnosis("shape", "swallows")
    run_probes([d], _ctx(time_limit_s=0.2))
    assert d.probes[0].status == "error" and "time limit" in d.probes[0].detail


def test_a_probe_past_its_time_limit_off_the_main_thread_is_abandoned():
    d = diagnosis("shape", "sleepy")
    worker = threading.Thread(target=run_probes, args=([d], _ctx(time_limit_s=0.3)))
    started = time.monotonic()
    worker.start()
    worker.join(3)
    assert not worker.is_alive() and time.monotonic() - started < 2
    assert d.probes[0].status == "error" and "time limit of 0.3 s" in d.probes[0].detail


def test_the_users_alarm_survives_a_probe_time_limit():
    fired = []

    def handler(*args):
        fired.append(True)

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 60)
    try:
        run_probes([diagnosis("shape", "sleepy")], _ctx(time_limit_s=0.2))
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 55 < remaining <= 60
        assert signal.getsignal(signal.SIGALRM) is handler and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_unknown_probes_and_bad_results_are_errors():
    d = diagnosis("shape", "no_such_probe", "not_a_result")
    run_probes([d], _ctx())
    unknown, bad = d.probes
    assert unknown.status == "error" and "cannot load the probe" in unknown.detail
    assert bad.status == "error" and "returned str, not a ProbeResult" in bad.detail


def test_each_probe_runs_once_per_hypothesis():
    first, second = diagnosis("shape", "confirm"), diagnosis("shape", "confirm")
    first.rule = "shape.first"
    other = diagnosis("index", "confirm")
    run_probes([first, second, other], _ctx())
    # the second shape diagnosis with the same values reuses the first's result
    assert [d.probes[0].detail for d in (first, second, other)] == ["run for shape.first"] * 2 + ["run for index.test"]
    assert [d.probes[0].status for d in (first, second, other)] == ["confirmed"] * 3


def test_the_time_budget_skips_what_is_left():
    d = diagnosis("shape", "confirm", "refute")
    run_probes([d], _ctx(total_time_s=0.0))
    assert [p.status for p in d.probes] == ["skipped", "skipped"]
    assert "time budget" in d.probes[0].detail


def test_refuted_hypotheses_give_up_their_rank_and_confirmed_ones_move_up():
    refuted = diagnosis("device", "refute")
    refuted.rule, refuted.confidence = "device.top", 0.95
    untested = diagnosis("shape")
    untested.rule, untested.confidence = "shape.middle", 0.9
    confirmed = diagnosis("index", "confirm", "save_batch")
    confirmed.rule, confirmed.confidence = "index.low", 0.85
    ranked = [refuted, untested, confirmed]
    run_probes(ranked, _ctx())  # save_batch skips (no folder) and does not count either way
    assert [d.rule for d in ranked] == ["index.low", "shape.middle", "device.top"]


def test_a_confirmation_does_not_overtake_a_much_stronger_hypothesis():
    """A worker's exception that reproduces in the main process confirms the DataLoader rule, but the
    plain-Python rule for the same exception stays ahead: the probe showed a fact both share."""
    python_rule = diagnosis("python")
    python_rule.rule, python_rule.confidence = "python.file-not-found", 0.65
    worker_rule = diagnosis("dataloader", "confirm")
    worker_rule.rule, worker_rule.confidence = "dataloader.worker-exception", 0.55
    ranked = [python_rule, worker_rule]
    run_probes(ranked, _ctx())
    assert [d.rule for d in ranked] == ["python.file-not-found", "dataloader.worker-exception"]


def test_mixed_verdicts_keep_the_matchers_order():
    a, b = diagnosis("shape", "confirm", "refute"), diagnosis("index")
    a.rule, b.rule = "a", "b"
    ranked = [a, b]
    run_probes(ranked, _ctx())
    rerank(ranked)
    assert [d.rule for d in ranked] == ["a", "b"]


def test_every_probe_leaves_the_users_state_and_files_alone(tmp_path, monkeypatch):
    import random

    import numpy as np
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    from _probe_fixtures import StateGuard, TextModel, live_context, raised
    from triage.tracking import Tracker

    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "data.txt").write_text("the user's file")
    monkeypatch.chdir(workdir)
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    model = TextModel(vocab=10, classes=3).train()
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters())
    ids, labels = torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([0, 2])
    loss_fn(model(ids), labels).backward()
    optimizer.step()  # Adam state and .grad to keep as they are
    loader = DataLoader(list(zip(ids, labels)), batch_size=2, shuffle=True)
    bad = torch.tensor([[1, 2, 3], [4, 11, 6]])
    exc = raised(model, bad)
    tracker = Tracker(model=model, optimizer=optimizer, loss_fn=loss_fn, loader=loader, batch=(bad, labels),
                      batch_index=0, steps=1)
    report_dir = tmp_path / "report"
    ctx = live_context(exc, tracker=tracker, report_dir=report_dir)
    everything = ["save_batch", "cpu_rerun", "index_range", "shape_trace", "device_census", "dtype_census",
                  "anomaly_rerun", "workers0_rerun", "memory_breakdown"]
    d = diagnosis("index", *everything)
    guard = StateGuard(model, optimizer=optimizer, folder=tmp_path, allowed=report_dir)
    run_probes([d], ctx)
    guard.assert_unchanged()
    statuses = {p.name: p.status for p in d.probes}
    assert "error" not in statuses.values(), [(p.name, p.detail) for p in d.probes]
    assert statuses["cpu_rerun"] == statuses["index_range"] == statuses["save_batch"] == "confirmed"
    assert (workdir / "data.txt").read_text() == "the user's file"
    assert sorted(p.name for p in report_dir.iterdir()) == ["batch.pt", "shape_trace.txt"]
