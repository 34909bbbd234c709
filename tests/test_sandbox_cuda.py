"""An experiment forked from a process that holds a CUDA context cannot use CUDA: whatever it makes of torch's
"Cannot re-initialize CUDA in forked subprocess" is no finding, so it comes back as not run.

There is no GPU here. torch decides "bad fork" with `torch.cuda._is_in_bad_fork()` and reports a live context
with `torch.cuda.is_initialized()`; `simulated_cuda_parent` makes them say what they say on a GPU machine after
the model went to the GPU (this process initialised CUDA, every process forked from it is a bad fork), and
torch's own `_lazy_init` then raises its real message in the child, from a real CUDA tensor's creation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import FIXTURES, run_triage, triage_env
from triage.diagnosis import ProbeResult
from triage.incident import Incident
from triage.probes import PROBES, runner, sandbox
from triage.probes.context import ProbeContext

BAD_FORK = "Cannot re-initialize CUDA in forked subprocess"


@pytest.fixture
def simulated_cuda_parent(monkeypatch):
    parent = os.getpid()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: os.getpid() == parent)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: os.getpid() != parent)


def make_cuda_tensor():
    return torch.zeros(2, device="cuda")


def test_an_experiment_that_reaches_cuda_did_not_run(simulated_cuda_parent):
    outcome = sandbox.run(make_cuda_tensor, 30)
    assert outcome.stopped == "unavailable", outcome
    assert outcome.reason == sandbox.CUDA_AFTER_FORK
    assert outcome.error is None
    assert any(frame.name == "make_cuda_tensor" for frame in outcome.stack)


def test_an_experiment_that_catches_cudas_refusal_and_reports_it_did_not_run(simulated_cuda_parent):
    def reproduce():  # what workers0_rerun does with the sample's exception: a reproduction, it would say
        try:
            make_cuda_tensor()
        except RuntimeError as exc:
            return f"reproduced: {exc}"
        return "no error"

    outcome = sandbox.run(reproduce, 30)
    assert outcome.stopped == "unavailable", outcome
    assert outcome.value is None


def test_torchs_bad_fork_error_raised_without_a_cuda_start_did_not_run_either(simulated_cuda_parent):
    def wrapped():
        try:
            raise RuntimeError(f"{BAD_FORK}. To use CUDA with multiprocessing, you must use the 'spawn' start method")
        except RuntimeError as exc:
            raise ValueError("a library's wrapper around it") from exc

    outcome = sandbox.run(wrapped, 30)
    assert outcome.stopped == "unavailable", outcome


def test_an_experiment_that_stays_on_the_cpu_runs_under_a_cuda_parent(simulated_cuda_parent):
    outcome = sandbox.run(lambda: float(torch.ones(3).sum()), 30)
    assert outcome.stopped is None and outcome.value == 3.0


def test_a_parent_that_is_itself_a_bad_fork_gets_the_real_error(monkeypatch):
    # (its CUDA was never initialised here: the failure it triages is torch's error, and a child reproduces it)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    outcome = sandbox.run(make_cuda_tensor, 30)
    assert outcome.stopped is None
    assert outcome.error_type == "RuntimeError" and BAD_FORK in outcome.error


def reproduces(ctx: ProbeContext) -> ProbeResult:
    """A probe that takes the error it meets for the user's failure, reproduced."""
    try:
        make_cuda_tensor()
    except RuntimeError as exc:
        return ProbeResult("reproduces", "confirmed", f"raises {exc}")
    return ProbeResult("reproduces", "refuted", "no error")


def test_a_probe_that_would_confirm_from_cudas_refusal_is_skipped(simulated_cuda_parent, monkeypatch):
    monkeypatch.setitem(PROBES, "reproduces", f"{__name__}:reproduces")
    result = runner.run_probe("reproduces", ProbeContext(incident=Incident(source="run")), 30)
    assert result.status == "skipped", result
    assert result.detail.startswith(sandbox.CUDA_AFTER_FORK)
    assert "in make_cuda_tensor" in result.detail  # where the experiment reached CUDA


SCRIPT = '''
import os
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

MAIN = os.getpid()  # this process plays one that moved its model to the GPU (see the test module's docstring)
torch.cuda.is_initialized = lambda: os.getpid() == MAIN
torch.cuda._is_in_bad_fork = lambda: os.getpid() != MAIN


class Features(Dataset):
    def __init__(self):
        self.rows = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return torch.tensor(self.rows[i].tolist(), device="cuda")


model = nn.Linear(16, 1)
for rows in DataLoader(Features(), batch_size=8, num_workers=2):
    model(rows).sum().backward()
'''


def test_cuda_made_in_a_forked_worker_leads_with_its_own_rule_and_no_false_confirmation(tmp_path):
    script = tmp_path / "cuda_workers.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run([sys.executable, "-m", "triage", "--report-dir", str(tmp_path / "report"), str(script)],
                          cwd=tmp_path, capture_output=True, text=True, env=triage_env(), timeout=180)
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert BAD_FORK in report["incident"]["exception"]["message"]
    first = report["diagnoses"][0]
    assert first["rule"] == "dataloader.cuda-in-forked-worker"
    assert first["cause"] == "dataloader.cuda-in-forked-worker/cuda-in-dataset"
    assert f"{script}:20 in __getitem__" in first["fix"]
    assert "dataloader.worker-exception" not in [d["rule"] for d in report["diagnoses"]]
    reruns = [p for d in report["diagnoses"] for p in d["probes"] if p["name"] == "workers0_rerun"]
    assert reruns and {p["status"] for p in reruns} == {"skipped"}, reruns
    assert all(p["detail"].startswith(sandbox.CUDA_AFTER_FORK) for p in reruns)


def test_the_h100_log_leads_with_cuda_in_the_dataset_and_names_the_line():
    done = run_triage("explain", FIXTURES / "cuda_in_forked_worker_h100.log", "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    first = report["diagnoses"][0]
    assert first["rule"] == "dataloader.cuda-in-forked-worker"
    assert first["cause"] == "dataloader.cuda-in-forked-worker/cuda-in-dataset"
    assert "dataset_makes_cuda_tensors_in_workers.py:27 in __getitem__" in first["fix"]
    assert "dataloader.worker-exception" not in [d["rule"] for d in report["diagnoses"]]


# On a machine with a GPU, autograd's engine starts a worker thread per GPU at the run's first backward, whatever
# the tensors' device, and from then on refuses a backward in any forked child (seen on an H100: fix trials were
# reported as failing with this error, and most learning experiments came back inconclusive).
AUTOGRAD_FORK = ("Unable to handle autograd's threading in combination with fork-based multiprocessing. See "
                 "https://github.com/pytorch/pytorch/wiki/Autograd-and-Fork")


@pytest.fixture
def simulated_gpu_autograd_threads(monkeypatch):
    parent, original = os.getpid(), torch.autograd.graph._engine_run_backward

    def engine_run_backward(*args, **kwargs):
        if os.getpid() != parent:
            raise RuntimeError(AUTOGRAD_FORK)
        return original(*args, **kwargs)

    monkeypatch.setattr(torch.autograd.graph, "_engine_run_backward", engine_run_backward)
    monkeypatch.setattr(torch.autograd, "_engine_run_backward", engine_run_backward)


def a_step():
    weight = torch.ones(3, requires_grad=True)
    (weight * 2).sum().backward()
    return float(weight.grad.sum())


def trial_of_a_fix():
    """A fix trial's shape: the step's error, caught, is the verdict "the fix fails"."""
    try:
        return f"verified: {a_step()}"
    except RuntimeError as exc:
        return f"fails: now {exc}"


@pytest.mark.parametrize("experiment", [a_step, trial_of_a_fix])
def test_an_experiment_whose_backward_autograd_refuses_did_not_run(simulated_gpu_autograd_threads, experiment):
    assert a_step() == 6.0  # the run itself is untouched
    outcome = sandbox.run(experiment, 30)
    assert outcome.stopped == "unavailable", outcome
    assert outcome.reason == sandbox.BACKWARD_AFTER_FORK
    assert any(frame.name == "a_step" for frame in outcome.stack)


def test_without_the_refusal_the_backward_runs_in_the_child():
    assert sandbox.run(trial_of_a_fix, 30).value == "verified: 6.0"
