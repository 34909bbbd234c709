"""NaN origins: the run's loss trend (loss_watch.py) and the first torch call that made NaN/Inf (probes/nonfinite.py)."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings(r"ignore:std\(\). degrees of freedom is")

from triage import loss_watch  # noqa: E402
from triage.context import ProbeContext  # noqa: E402
from triage.incident import Incident  # noqa: E402
from triage.probes.nonfinite import OriginLog, find_origin  # noqa: E402
from triage.probes.source_step import user_frames  # noqa: E402


def _trend(losses: list[float], norms: list[float | None], clip_calls: int = 0) -> loss_watch.LossTrend:
    """A trend fed the way the backward() hook feeds it: a loss before each backward, a norm after it."""
    trend = loss_watch.LossTrend()
    trend._readers = {torch.float32: _reader()}
    for loss, norm in zip(losses, norms):
        trend.read_loss(torch.tensor(loss))
        if norm is not None:
            trend.note_grad_norm(norm)
    trend.clip_calls = clip_calls
    trend.clip_max_norm = 1.0 if clip_calls else None
    return trend


def _reader():
    from triage.host_memory import READERS

    return READERS["torch.float32"]


class _GpuScalar:
    """What read_loss sees of a CUDA loss (is_cuda, not is_cpu); its value lives in a CPU tensor here."""

    def __init__(self, value: float) -> None:
        self.value = torch.tensor(value)
        self.dtype, self.device, self.is_cuda, self.is_cpu = self.value.dtype, self.value.device, True, False

    def numel(self) -> int:
        return 1

    def is_floating_point(self) -> bool:
        return True

    def detach(self) -> torch.Tensor:
        return self.value


def test_a_gpu_runs_losses_are_kept_on_the_device_and_read_at_the_incident_like_a_cpu_runs():
    # On an H100 a diverging regression got "No rule matched": a GPU loss was never read (a read synchronises).
    losses, norms = [7.0e4, 4.1e9, 1.4e7, 3.0e6, 6.0e34, float("inf")], [4074, 6.8e8, 6.4e6, 119, None, None]
    on_gpu = loss_watch.LossTrend()
    on_gpu._readers = {torch.float32: _reader()}
    for loss, norm in zip(losses, norms):
        on_gpu.read_loss(_GpuScalar(loss))
        if norm is not None:
            on_gpu.note_device_grad_norm(torch.tensor(norm))
    assert not on_gpu.losses and on_gpu.first_nonfinite is None  # nothing read per step
    on_gpu.read_device_values()
    assert on_gpu.verdict() == _trend(losses, norms).verdict()
    on_gpu.read_device_values()  # a second incident reads them again without doubling them
    assert on_gpu.verdict() == _trend(losses, norms).verdict()
    on_gpu.read_loss(_GpuScalar(float("nan")))
    on_gpu.read_device_values()
    on_gpu.read_device_values()
    assert [call for call, _ in on_gpu.losses] == [1, 2, 3, 4, 5, 6, 7]


def test_a_gpu_series_keeps_the_latest_values_with_their_calls():
    series = loss_watch.DeviceSeries(4)
    for call in range(1, 7):
        series.record(call, torch.tensor(float(call) * 10))
    assert series.read() == [(3, 30.0), (4, 40.0), (5, 50.0), (6, 60.0)]
    assert loss_watch.DeviceSeries(4).read() == []


def test_a_loss_and_gradient_norm_growing_together_is_a_divergence_led_by_the_updates():
    # the VAE of pytorch/examples at Adam(lr=0.3): the loss jumps with the gradient norm at the second step
    trend = _trend([7.0e4, 4.1e9, 1.4e7, 3.0e6, 6.0e34, float("inf")], [4074, 6.8e8, 6.4e6, 119, None, None])
    facts = trend.verdict()
    assert facts["diverged"] and not facts["gradient_led"]
    assert facts["nonfinite_at"] == 6 and facts["nonfinite_loss"] == "inf"
    lines = trend.lines(facts)
    assert lines[0].startswith("triage: the loss diverged: it grew from 7e+04 to 6e+34")
    assert lines[0].endswith("then became inf at call 6")
    assert "clip_grad_norm_ was never called" in lines[-1]


def test_gradients_that_explode_before_the_loss_grows_are_gradient_led():
    # word_language_model without its clip: the gradient norm x54 while the loss is still x1.6
    trend = _trend([5.3, 5.5, 8.4, 69.6, 1487.0], [0.25, 1.56, 13.4, 43.1, 109.3])
    facts = trend.verdict()
    assert facts["diverged"] and facts["gradient_led"]
    assert "growing before the loss did" in trend.lines(facts)[1]


def test_a_loss_that_turns_nan_without_growing_is_not_a_divergence():
    trend = _trend([4.8, 14.0, 5.6, 0.99, float("nan")], [13.5, 44.4, 20.0, 10.0, None])
    facts = trend.verdict()
    assert not facts["diverged"]
    assert trend.lines(facts)[0].startswith("triage: the loss was nan at backward() call 5 without growing first")


def test_a_steady_loss_gives_no_lines():
    trend = _trend([2.3, 2.2, 2.1, 2.0], [1.0, 0.9, 0.8, 0.7])
    assert trend.lines(trend.verdict()) == []


def test_the_first_nonfinite_loss_is_handed_on_once():
    seen = []
    trend = loss_watch.LossTrend()
    trend._readers = {torch.float32: _reader()}
    trend.on_nonfinite = lambda call, value: seen.append((call, value))
    for value in (1.0, float("inf"), float("nan")):
        trend.read_loss(torch.tensor(value))
    assert len(seen) == 1 and seen[0][0] == 2


def test_clip_grad_norm_calls_are_counted_with_the_norm_before_clipping():
    undo = loss_watch.start()
    try:
        model = torch.nn.Linear(3, 1)
        model(torch.full((4, 3), 10.0)).sum().backward()
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        assert loss_watch.TREND.clip_calls == 1 and loss_watch.TREND.clip_max_norm == 0.5
        assert loss_watch.TREND.grad_norms[-1][1] == pytest.approx(float(total))
    finally:
        undo()
    assert loss_watch.TREND is None
    assert not getattr(torch.nn.utils.clip_grad_norm_, "_triage_hook", False)


def test_a_learning_rate_is_read_from_the_optimizer_or_the_scripts_lr():
    optimizer = torch.optim.Adam(torch.nn.Linear(2, 1).parameters(), lr=0.3)
    trend = _trend([1.0, 1e4], [1.0, 1e3])
    assert trend.verdict(optimizer)["lr"] == 0.3
    assert trend.verdict(None, None, {"lr": 20})["lr_source"].startswith("the script's `lr`")


def _origin_of(fn) -> object:
    log = OriginLog()
    with log:
        fn()
    return log.origin


def test_origin_log_names_the_singular_point_of_each_kind():
    one = torch.tensor([1.0])
    assert _origin_of(lambda: (one - one.mean()) / (one.std() + 1e-8)).cause == "std-of-one-element"
    counts = torch.tensor([0.0, 2.0, 3.0])
    origin = _origin_of(lambda: torch.log(counts).mean())
    assert (origin.op, origin.cause, origin.kind) == ("log", "log-of-zero", "inf")
    assert origin.inputs == ["Float32[3] in [0, 3], 1 zero"]
    assert _origin_of(lambda: torch.exp(torch.tensor([1.0, 120.0]))).cause == "exp-overflow"
    blank = torch.zeros(2, 4)
    blank[0] = torch.arange(4.0)
    assert _origin_of(lambda: (blank - blank.mean(1, keepdim=True)) / blank.std(1, keepdim=True)).cause == "division-by-zero-std"
    assert _origin_of(lambda: torch.ones(3) / torch.tensor([1.0, 0.0, 2.0])).cause == "division-by-zero"


def test_origin_log_skips_calls_that_only_pass_a_nan_on():
    origin = _origin_of(lambda: (torch.tensor([1.0]).std() * 2).sum())
    assert origin.op == "std"
    assert origin.site.startswith("test_nan_origin.py:")


def _normalised_returns(rewards: list[float]):
    returns = torch.tensor(rewards)
    returns = (returns - returns.mean()) / (returns.std() + 1e-8)
    loss = returns.sum()
    return user_frames(None), loss  # the frames as a hook would see them, from inside the step


@pytest.mark.skipif(sys.platform == "win32", reason="experiments fork")
def test_find_origin_replays_the_users_statements_in_a_child_and_names_the_line():
    frames, loss = _normalised_returns([1.0])
    ctx = ProbeContext(incident=Incident(kind="nan", source="run"), time_limit_s=30.0)
    origin, replayed = find_origin(frames, include_failing=False, ctx=ctx)
    assert origin is not None, replayed
    assert origin.cause == "std-of-one-element"
    assert origin.code == "returns = (returns - returns.mean()) / (returns.std() + 1e-8)"
    assert "test_nan_origin.py" in origin.site and replayed.startswith("replayed ")


def test_divergence_rerun_confirms_when_a_smaller_update_settles_and_refutes_when_none_does():
    from triage.probes.divergence_rerun import _verdict

    runs = {"as run": {"losses": [5.3, 69.0, 1487.0], "error": "", "scale": 1.0},
            "clipped at norm 0.25": {"losses": [5.3, 6.4, 5.9], "error": "", "scale": 1.0}}
    found = _verdict(runs, "train.py:114-122", 3)
    assert found.status == "confirmed" and found.facts["stopped_by"] == "clipping"
    runs = {"as run": {"losses": [7e4, float("inf")], "error": "RuntimeError", "scale": 1.0},
            "lr / 10": {"losses": [7e4, 2e6, 9e4], "error": "", "scale": 0.1},
            "lr / 100": {"losses": [7e4, 7e4, 6e4], "error": "", "scale": 0.01}}
    found = _verdict(runs, "vae.py:77-82", 3)
    assert found.status == "confirmed" and found.facts["stopped_by"] == "lr / 100"
    assert "lr / 10 " not in found.detail  # only the run as it was and the rate that settled are shown
    runs = {"as run": {"losses": [1.0, 1e3], "error": "", "scale": 1.0},
            "lr / 10": {"losses": [1.0, 1e2], "error": "", "scale": 0.1}}
    assert _verdict(runs, "x.py:1", 2).status == "refuted"
    runs = {"as run": {"losses": [1.0, 0.9], "error": "", "scale": 1.0}}
    assert _verdict(runs, "x.py:1", 2).status == "inconclusive"


EPISODES = '''
import torch
from torch.distributions import Categorical

torch.manual_seed(0)
policy = torch.nn.Linear(3, 2)
optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
for length in (3, 2, 1, 3):
    probs = torch.softmax(policy(torch.randn(length, 3)), -1)
    dist = Categorical(probs)
    actions = dist.sample()
    returns = torch.arange(length, dtype=torch.float32)
    returns = (returns - returns.mean()) / (returns.std() + 1e-8)
    loss = -(dist.log_prob(actions) * returns).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
'''


def test_the_runner_explains_a_crash_by_the_nan_born_steps_before(tmp_path):
    """An episode of one step: returns.std() is NaN, the weights turn NaN, and Categorical raises an episode later.
    The NaN check fires at the NaN loss (before backward) and names the std; the crash's report leads with it."""
    import json
    import os
    import subprocess

    from pathlib import Path

    script = tmp_path / "episodes.py"
    script.write_text(EPISODES)
    repo = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS")}
    env.update(PYTHONPATH=str(repo), TRIAGE_DEBUG="1")
    done = subprocess.run([sys.executable, "-m", "triage", "--report-dir", str(tmp_path / "r"), str(script)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    nan_report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert nan_report["incident"]["kind"] == "nan"
    crash = json.loads((tmp_path / "r-2" / "report.json").read_text())
    leading = crash["diagnoses"][0]
    assert crash["incident"]["exception"]["type"] == "ValueError"
    assert (leading["rule"], leading["cause"]) == ("nan.nonfinite-origin", "nan.nonfinite-origin/std-of-one-element")
    assert "episodes.py:13" in leading["title"] and "ValueError is its consequence" in leading["title"]
    assert leading["fix_id"] == "skip-std-of-one-element"
