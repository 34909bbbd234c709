"""The training-loop wrapper: install/uninstall chaining, watch/track, NaN/Inf incidents, auto_track."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import traceback
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import triage
from _probe_fixtures import ConvNet, raised
from triage import tracking, wrapper
from triage.tracking import TRACKER, Tracker

NAN_RULE = """\
- id: nan.test-loss
  category: nan
  title: The loss became non-finite at step {{ step }}
  confidence: 0.9
  match:
    kind: nan
    log: 'non-finite (?P<what>loss|gradients|model output) at step (?P<step>\\d+)'
  hypothesis: The {{ what }} became NaN/Inf at step {{ step }}.
  fix: Find the first non-finite operation.
  probes: [anomaly_rerun]
  examples:
    match: [{log: 'triage: non-finite loss at step 3 (batch 3): loss = nan', vars: {step: 3}}]
    no_match: ['RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x57600 and 64x128)']
"""


@pytest.fixture(autouse=True)
def clean_state(tmp_path, monkeypatch):
    TRACKER.reset()
    monkeypatch.chdir(tmp_path)
    yield
    wrapper.uninstall()
    TRACKER.reset()


@pytest.fixture
def nan_rules(tmp_path) -> Path:
    path = tmp_path / "nan_rules.yaml"
    path.write_text(NAN_RULE, encoding="utf-8")
    return path


def test_import_triage_stays_torch_free():
    code = ("import sys, triage; assert triage.install and triage.watch and triage.track; triage.install(); "
            "triage.uninstall(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1],
                         check=True)
    assert out.stdout.strip() == "False"


def test_install_chains_the_previous_hook_and_diagnoses_with_probes(tmp_path):
    calls = []

    def previous(exc_type, exc, tb):
        calls.append(exc_type)

    sys.excepthook = previous
    stream = io.StringIO()
    triage.install(report_dir=tmp_path / "report", stream=stream)
    model = ConvNet()
    images = torch.randn(2, 3, 10, 10)
    TRACKER.on_batch((images, torch.tensor([1, 2])))
    exc = raised(model, images)
    sys.excepthook(type(exc), exc, exc.__traceback__)
    assert calls == [RuntimeError]  # the original traceback printer ran first
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    lead = report["diagnoses"][0]
    assert lead["rule"] == "shape.linear-in-features"
    probes = {p["name"]: p for p in lead["probes"]}
    assert probes["shape_trace"]["status"] == "confirmed"
    assert "conv3 outputs 64×4×4 = 1024 features per sample; fc1 expects 256" in probes["shape_trace"]["detail"]
    assert probes["save_batch"]["status"] == "confirmed"
    assert (tmp_path / "report" / "batch.pt").exists() and (tmp_path / "report" / "report.md").exists()
    assert "shape_trace" in stream.getvalue()
    triage.uninstall()
    assert sys.excepthook is previous


def test_uninstall_leaves_a_hook_chained_after_ours_working_and_triage_quiet(tmp_path):
    sys.excepthook = sys.__excepthook__
    stream = io.StringIO()
    triage.install(report_dir=tmp_path / "r", stream=stream)
    ours = sys.excepthook
    seen = []

    def later(exc_type, exc, tb):
        seen.append(exc_type)
        ours(exc_type, exc, tb)

    sys.excepthook = later
    triage.uninstall()
    assert sys.excepthook is later
    exc = raised(lambda: 1 / 0)
    printed = io.StringIO()
    real_stderr, sys.stderr = sys.stderr, printed
    try:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    finally:
        sys.stderr = real_stderr
    assert seen == [ZeroDivisionError] and "ZeroDivisionError" in printed.getvalue()
    assert stream.getvalue() == "" and not (tmp_path / "r").exists()
    sys.excepthook = sys.__excepthook__


def test_exceptions_in_other_threads_are_diagnosed(tmp_path):
    stream = io.StringIO()
    previous = threading.excepthook
    threading.excepthook = lambda args: None  # keep the test output quiet; ours still chains to it
    try:
        triage.install(report_dir=tmp_path / "r", stream=stream)
        worker = threading.Thread(target=lambda: nn.Linear(4, 2)(torch.randn(3, 5)))
        worker.start()
        worker.join()
    finally:
        triage.uninstall()
        threading.excepthook = previous
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["diagnoses"][0]["rule"] == "shape.linear-in-features"


class LogNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 1)

    def forward(self, x):
        h = torch.relu(self.fc1(x)) + 1.0
        return self.fc2(torch.log(h * x.sum(1, keepdim=True).sign()))  # a negative row sum gives log(-h) = nan


def _nan_data(bad_at: int = 3, steps: int = 5):
    torch.manual_seed(0)
    data = []
    for i in range(steps):
        x = torch.rand(8, 4)
        if i == bad_at:
            x[2] = -x[2]
        data.append((x, torch.rand(8, 1)))
    return data


def _train(model, data, on_nan="report", loss_fn=None, record_calls=False):
    loss_fn = loss_fn or nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with triage.watch(model=model, optimizer=optimizer, loss_fn=loss_fn, on_nan=on_nan, record_calls=record_calls):
        for x, y in triage.track(data):
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
    return optimizer


def test_watch_turns_a_nan_loss_into_an_incident_with_step_and_first_module(tmp_path, nan_rules, monkeypatch):
    monkeypatch.setattr(wrapper, "GRADIENT_CHECK_BUDGET", 1e-9)  # full checks at most every 1000 steps: the
    stream = io.StringIO()  # per-step peek at the gradients must find the NaN at its own step
    triage.install(report_dir=tmp_path / "r", stream=stream, rules=[nan_rules])
    model = LogNet()
    _train(model, _nan_data(bad_at=3))
    assert TRACKER.model is None  # restored on a clean exit of watch()
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    incident = report["incident"]
    assert incident["kind"] == "nan"
    lines = incident["log_lines"]
    assert lines[0] == "triage: non-finite gradients at step 3 (batch 3): all 4 gradients (a non-finite loss does this)"
    assert lines[1] == "triage: step 3 replayed on CPU copies gives loss = nan"
    assert lines[2].startswith("triage: first non-finite value at step 3 (batch 3): log at ")
    assert lines[3] == "triage: first module with a non-finite output at step 3 (batch 3): fc2 (Linear) (nan)"
    assert incident["facts"]["nan"]["first_nonfinite_module"] == "fc2 (Linear)"
    lead = report["diagnoses"][0]
    assert lead["rule"] == "nan.test-loss"
    anomaly = lead["probes"][0]
    assert anomaly["name"] == "anomaly_rerun" and anomaly["status"] == "confirmed"
    assert "`return self.fc2(torch.log(h * x.sum(1, keepdim=True).sign()))" in anomaly["detail"]
    assert "Experiment anomaly_rerun: confirmed. first non-finite value in the forward pass: log at" in stream.getvalue()


def test_watch_reports_only_the_first_nan_and_training_goes_on(tmp_path):
    stream = io.StringIO()
    triage.install(report_dir=tmp_path / "r", stream=stream)
    model = LogNet()
    steps = []
    TRACKER.listeners.append(lambda what, n: steps.append(what))
    try:
        _train(model, _nan_data(bad_at=1, steps=4))
    finally:
        TRACKER.listeners.clear()
    assert steps.count("step") == 4
    assert len(list((tmp_path / "r").glob("report.json"))) == 1


def test_on_nan_raise_stops_before_the_optimizer_step(tmp_path):
    triage.install(report_dir=tmp_path / "r", stream=io.StringIO())
    model = LogNet()
    error = raised(_train, model, _nan_data(bad_at=2), "raise")
    assert isinstance(error, triage.NonFiniteError)
    assert str(error) == "non-finite gradients at step 2 (batch 2): all 4 gradients (a non-finite loss does this)"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == __file__]
    assert frames[-1].line == "optimizer.step()"
    assert bool(torch.isfinite(model.fc1.weight).all())  # stopped before the NaN reached the parameters
    assert TRACKER.batch_index == 2  # the crash path still sees the failing batch


def test_record_calls_checks_the_loss_itself_at_its_line(tmp_path):
    triage.install(report_dir=tmp_path / "r", stream=io.StringIO())
    error = raised(_train, LogNet(), _nan_data(bad_at=2), "raise", None, True)
    assert str(error) == "non-finite loss at step 2 (batch 2): loss = nan"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == __file__]
    assert frames[-1].line == "loss = loss_fn(model(x), y)"
    assert TRACKER.loss_call is not None and TRACKER.model_call is not None


class SqrtNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        return self.fc(torch.sqrt(x))  # d/dx sqrt(x) at 0 is inf: finite loss, infinite gradient


def test_watch_catches_non_finite_gradients_behind_a_finite_loss(tmp_path):
    triage.install(report_dir=tmp_path / "r", stream=io.StringIO())
    x = torch.rand(4, 4)
    x[0, 0] = 0.0
    model = SqrtNet()
    model.fc.weight.requires_grad_(False)
    sqrt_input = nn.Parameter(torch.ones(1))

    class WithInput(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = sqrt_input
            self.inner = model

        def forward(self, x):
            return self.inner(x * self.scale)

    net = WithInput()
    _train(net, [(x, torch.rand(4, 1))])
    incident = json.loads((tmp_path / "r" / "report.json").read_text())["incident"]
    assert incident["log_lines"][0] == "triage: non-finite gradients at step 0 (batch 0): 1 of 2 gradients: scale"
    assert incident["facts"]["nan"]["nonfinite_gradients"] == ["scale"]


def test_the_gradient_check_stride_keeps_its_cost_in_budget(monkeypatch):
    monitor = wrapper.NonFiniteMonitor(TRACKER)
    params = [nn.Parameter(torch.randn(64, 64)) for _ in range(4)]
    for p in params:
        p.grad = torch.randn_like(p)
    steps = Tracker()
    before_step = monitor.step_hook(params, steps)
    monkeypatch.setattr(wrapper, "GRADIENT_CHECK_BUDGET", 1e-9)
    for _ in range(3):
        before_step(None, (), {})
    assert monitor.stride == 1000  # a check that costs more than the budget runs rarely
    monkeypatch.setattr(wrapper, "GRADIENT_CHECK_BUDGET", 1e9)
    monitor.since = monitor.stride
    before_step(None, (), {})
    assert monitor.stride == 1 and steps.steps == 4


class _GradOnAnotherDevice:
    """A gradient on a device whose memory the host cannot read (a GPU): its address must never be read."""

    is_cpu = is_cuda = False

    def data_ptr(self):
        raise AssertionError("a device address read as host memory")

    def is_floating_point(self):
        return True

    def numel(self):
        return 3


def test_the_per_step_peek_never_reads_a_gradient_that_moved_off_the_cpu_as_host_memory(monkeypatch):
    # The hook was built for a CPU parameter; the model moved afterwards (optimizer built before .to(device)).
    monitor = wrapper.NonFiniteMonitor(TRACKER)
    monitor.stride = 10**6  # the per-step peek only, no strided full check
    checked = []
    monkeypatch.setattr(monitor, "_check_all", lambda params, adapt: checked.append(adapt))
    param = nn.Parameter(torch.ones(3))
    before_step = monitor.step_hook([param], Tracker())
    moved = type("Moved", (), {"grad": _GradOnAnotherDevice()})()
    monkeypatch.setattr(wrapper, "sentinel_for", lambda params: [(moved, *wrapper.READERS["torch.float32"])])
    monitor.step_hook([moved], Tracker())(None, (), {})  # would crash the run if it read the address
    param.grad = torch.tensor([float("nan"), 0.0, 0.0])
    before_step(None, (), {})
    assert checked == [False]  # the CPU NaN was still seen, and sent to the exact check


def test_an_asynchronous_flag_is_reported_with_its_own_step(tmp_path):
    triage.install(report_dir=tmp_path / "r", stream=io.StringIO())

    class ReadyFlags:
        pending = True

        def ready(self):
            return [{"what": "loss", "step": 7, "batch_index": 7, "model_call": None}]

    TRACKER.steps = 9
    monitor = wrapper.NonFiniteMonitor(TRACKER)
    monitor.flags = ReadyFlags()
    monitor.poll()
    lines = json.loads((tmp_path / "r" / "report.json").read_text())["incident"]["log_lines"]
    assert lines[0] == "triage: non-finite loss at step 7 (batch 7): NaN/Inf (found by an asynchronous check)"
    assert lines[-1] == "triage: found by an asynchronous check, 2 step(s) later"


def test_an_asynchronous_gradient_flag_names_the_gradients_when_it_is_read(tmp_path):
    # On a GPU the flag says only "NaN/Inf"; when it is read, the gradients are read once to say which.
    triage.install(report_dir=tmp_path / "r", stream=io.StringIO())
    model = nn.Linear(2, 1)
    model.weight.grad, model.bias.grad = torch.full((1, 2), float("nan")), torch.zeros(1)

    class ReadyFlags:
        pending = True

        def ready(self):
            return [{"what": "gradients", "step": 3, "batch_index": None, "model_call": None}]

    monitor = wrapper.NonFiniteMonitor(TRACKER, model=model)
    monitor.flags = ReadyFlags()
    monitor.poll()
    report = json.loads((tmp_path / "r" / "report.json").read_text())["incident"]
    assert report["log_lines"][0] == ("triage: non-finite gradients at step 3: 1 of 2 gradients: weight, "
                                      "found by an asynchronous check")
    assert report["facts"]["nan"]["nonfinite_gradients"] == ["weight"]


class FakeEvent:
    """Stands in for torch.cuda.Event on a CPU-only machine: completes when told to."""

    made: list[FakeEvent] = []
    waits = 0

    def __init__(self):
        self.done = False
        FakeEvent.made.append(self)

    def record(self):
        self.done = False  # a recorded event completes when the work before it has (here: when told)

    def query(self):
        return self.done

    def synchronize(self):
        self.done = True
        FakeEvent.waits += 1


def test_device_flags_are_read_only_once_their_event_completes():
    FakeEvent.made.clear()
    flags = wrapper.DeviceFlags(event_factory=FakeEvent)
    flags.push(torch.tensor(True), {"step": 0})  # True: finite
    flags.push(torch.tensor(False), {"step": 1})
    flags.push(torch.tensor(False), {"step": 2})
    assert flags.ready() == [] and flags.pending  # nothing has completed: nothing is read, nothing waits
    FakeEvent.made[0].done = FakeEvent.made[1].done = True
    assert flags.ready() == [{"step": 1}]
    assert flags.pending  # step 2 still in flight
    FakeEvent.made[2].done = True
    assert flags.ready() == [{"step": 2}] and not flags.pending


def test_device_flags_wait_for_the_oldest_only_when_a_whole_buffer_is_in_flight():
    FakeEvent.made.clear()
    FakeEvent.waits = 0
    flags = wrapper.DeviceFlags(event_factory=FakeEvent)
    for step in range(flags.SLOTS + 5):
        flags.push(torch.tensor(step != 3), {"step": step})
    assert FakeEvent.waits == 6  # one synchronize per push beyond SLOTS - 1 in flight
    assert len(FakeEvent.made) == flags.SLOTS  # one event per slot, made once and recorded again
    assert flags.ready() == [{"step": 3}]  # its slot was read before being reused
    assert len(flags.items) == flags.SLOTS - 1


def test_watch_restores_the_tracker_and_removes_its_hooks():
    model, loss_fn = nn.Linear(2, 1), nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with triage.watch(model=model, optimizer=optimizer, loss_fn=loss_fn, record_calls=True):
        assert TRACKER.model is model and wrapper.installed()
        loss_fn(model(torch.ones(3, 2)), torch.zeros(3, 1)).backward()
        optimizer.step()
        assert TRACKER.steps == 1 and TRACKER.model_call is not None and TRACKER.loss_call is not None
    assert TRACKER.model is None and TRACKER.loss_call is None and not wrapper.installed()
    assert not model._forward_pre_hooks and not loss_fn._forward_hooks
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks


def test_watch_keeps_the_context_when_an_exception_leaves_it():
    model = ConvNet()
    with pytest.raises(RuntimeError):
        with triage.watch(model=model):
            for batch in triage.track([torch.randn(2, 3, 10, 10)]):
                model(batch)
    assert TRACKER.model is model and TRACKER.batch_index == 0 and TRACKER.model_call is not None
    assert not model._forward_pre_hooks


def test_probes_on_a_watched_model_do_not_feed_the_tracker(tmp_path):
    from triage.probes.cpu_rerun import cpu_rerun
    from triage.probes.runner import context_from_failure

    model = ConvNet()
    images = torch.randn(2, 3, 10, 10)
    with pytest.raises(RuntimeError) as info:
        with triage.watch(model=model):
            for batch in triage.track([images]):
                model(batch)
    recorded = TRACKER.model_call
    ctx = context_from_failure(wrapper.incident_from_exception(info.value), info.value, tracker=TRACKER)
    assert cpu_rerun(ctx).status == "confirmed"
    assert TRACKER.model_call is recorded and TRACKER.batches_seen == 1


def test_track_yields_batches_unchanged_and_keeps_a_cpu_copy_of_the_container():
    batch = {"x": torch.ones(2)}
    seen = []
    for item in triage.track([batch]):
        item["x"] = item["x"] * 2  # the user's loop replaces entries (as .to(device) would)
        seen.append(item)
    assert seen[0] is batch
    assert torch.equal(TRACKER.batch["x"], torch.ones(2))


def test_auto_track_follows_dataloaders_and_optimizers_without_code_changes():
    undo = wrapper.auto_track()
    try:
        loader = DataLoader(torch.arange(8.0), batch_size=2)
        model = nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for batch in loader:
            model(batch.unsqueeze(1)).sum().backward()
            optimizer.step()
        assert TRACKER.batches_seen == 4 and TRACKER.steps == 4
        assert TRACKER.loader is loader and TRACKER.optimizer is optimizer
        assert torch.equal(TRACKER.batch, torch.tensor([6.0, 7.0]))
        for _ in triage.track(loader):  # the wrapper and the automatic hook do not both count
            pass
        assert TRACKER.batches_seen == 8
    finally:
        undo()
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    assert DataLoader.__iter__.__module__ == "torch.utils.data.dataloader"
    assert _BaseDataLoaderIter.__next__.__module__ == "torch.utils.data.dataloader"
    list(DataLoader(torch.arange(2.0)))
    assert TRACKER.batches_seen == 8


def test_auto_track_turns_nan_gradients_into_an_incident(tmp_path):
    triage.install(report_dir=tmp_path / "r", stream=io.StringIO())
    undo = wrapper.auto_track()
    try:
        model = nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in DataLoader(torch.tensor([[1.0, 2.0], [float("nan"), 1.0]]), batch_size=1):
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
    finally:
        undo()
    incident = json.loads((tmp_path / "r" / "report.json").read_text())["incident"]
    assert incident["log_lines"][0].startswith("triage: non-finite gradients at step 1 (batch 1)")
    assert incident["facts"]["nan"]["nonfinite_gradients"] == ["weight"]


SCRIPT = """\
import torch
from torch import nn
import triage

triage.install(report_dir={report!r})


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc = nn.Linear(8 * 6 * 6, 10)

    def forward(self, x):
        return self.fc(self.conv(x).flatten(1))


model = Net()
loader = torch.utils.data.DataLoader(torch.randn(8, 3, 10, 10), batch_size=4)
with triage.watch(model=model):
    for images in triage.track(loader):
        model(images)
"""


def test_a_failing_script_prints_its_traceback_then_the_confirmed_diagnosis(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(report=str(tmp_path / "report")), encoding="utf-8")
    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120,
                          cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1  # what plain python gives for an uncaught exception
    stderr = done.stderr
    assert stderr.index("Traceback (most recent call last)") < stderr.index("shape_trace")
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x512 and 288x10)" in stderr
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    probes = {p["name"]: p for p in report["diagnoses"][0]["probes"]}
    assert probes["shape_trace"]["status"] == "confirmed"
    assert "conv outputs 8×8×8 = 512 features per sample; fc expects 288" in probes["shape_trace"]["detail"]
    assert probes["save_batch"]["status"] == "confirmed" and "saved batch 0" in probes["save_batch"]["detail"]
    # How to verify a fix: the commands name this script, and the replay its saved batch.
    assert report["rerun"]["replay"] == "python -m triage --replay report train.py"  # from where it ran
    assert f"    $ {report['rerun']['replay']}\n" in stderr


TWO_FAILURES = """import threading
import triage

triage.install()
thread = threading.Thread(target=lambda: {}["missing"])
thread.start()
thread.join()
[1, 2][5]
"""


def test_install_diagnoses_each_failure_once_alone_and_under_the_runner(tmp_path):
    script = tmp_path / "two.py"
    script.write_text(TWO_FAILURES)
    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    for argv in ([str(script)], ["-m", "triage", str(script)]):
        done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=120,
                              cwd=tmp_path)  # fmt: skip
        assert done.returncode == 1
        headlines = [line for line in done.stderr.splitlines() if line.startswith("triage: ") and "Error" in line]
        assert headlines == ["triage: KeyError: 'missing'", "triage: IndexError: list index out of range"], argv


def test_the_runner_can_take_nan_incidents_and_the_crash_path(monkeypatch):
    taken = []
    monkeypatch.setattr(wrapper, "incident_handler", lambda incident, tracker: taken.append((incident, tracker)))
    monkeypatch.setattr(tracking, "capture_owner", "runner")
    _train(LogNet(), _nan_data(bad_at=1, steps=3))
    assert not wrapper.installed()  # watch() left the crash path to the runner
    (incident, tracker), = taken
    assert incident.kind == "nan" and tracker is TRACKER
    assert incident.facts["nan"]["step"] == 1
