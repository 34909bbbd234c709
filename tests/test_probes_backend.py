"""backend_census: is the backend the code asks for compiled into this torch, and which of the user's lines asks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from _probe_fixtures import diagnosis, live_context, raised
from triage.diagnosis import ProbeResult
from triage.kb import load_knowledge_base
from triage.kb.matcher import diagnose, rechoose
from triage.logparse import parse_text
from triage.probes import backend_census as census
from triage.probes.backend_census import backend_census

needs_cpu_build = pytest.mark.skipif(torch.backends.cuda.is_built(), reason="the failure needs a CPU-only torch build")


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(4, 8)

    def init_hidden(self, batch: int):
        return torch.zeros(1, batch, 8).cuda()


def _context(exc: BaseException, **values):
    ctx = live_context(exc)
    ctx.diagnosis = diagnosis("device", "backend_census", **values)
    return ctx


@needs_cpu_build
def test_backend_census_confirms_a_cuda_request_inside_a_module_on_a_cpu_build():
    exc = raised(Recurrent().init_hidden, 3)
    outcome = backend_census(_context(exc))
    assert outcome.status == "confirmed"
    assert (outcome.facts["backend"], outcome.facts["built"], outcome.facts["available"]) == ("cuda", False, False)
    assert outcome.facts["module"] == "Recurrent" and outcome.facts["creates_tensor"] is True
    assert "is built without CUDA; torch.cuda.is_available() is False, torch.version.cuda is None;" in outcome.detail
    assert "in init_hidden (inside Recurrent's own code) asks for it: `return torch.zeros(1, batch, 8).cuda()`" \
        in outcome.detail


DEVICE = torch.device("mps")


def _to_device(model: nn.Module) -> nn.Module:
    return model.to(DEVICE)


@pytest.mark.skipif(torch.backends.mps.is_built(), reason="the failure needs a build without MPS")
def test_backend_census_names_the_variable_that_holds_the_device():
    exc = raised(_to_device, nn.Linear(2, 2))
    outcome = backend_census(_context(exc, backend="mps"))
    assert outcome.status == "confirmed" and outcome.facts["backend"] == "mps"
    assert outcome.facts["names"] == ["DEVICE is device(type='mps')"]
    assert outcome.facts["module"] is None


@needs_cpu_build
def test_backend_census_refutes_when_the_backend_is_there(monkeypatch):
    exc = raised(Recurrent().init_hidden, 3)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    outcome = backend_census(_context(exc))
    assert outcome.status == "refuted"
    assert "is built with CUDA and cuda is available here" in outcome.detail


def test_the_machine_s_nvidia_gpus_are_counted_from_device_nodes_whatever_the_build(tmp_path, monkeypatch):
    monkeypatch.setattr(census.sys, "platform", "linux")
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-modeset"):
        (tmp_path / name).touch()
    assert census.nvidia_devices(str(tmp_path)) == 2  # the control and UVM nodes are not GPUs
    (tmp_path / "dxg").touch()
    assert census.nvidia_devices(str(tmp_path)) is None  # WSL2: GPUs behind /dev/dxg, no count from nodes
    monkeypatch.setattr(census.sys, "platform", "darwin")
    assert census.nvidia_devices(str(tmp_path)) == 0


@pytest.mark.parametrize(("built", "gpus", "available", "cause"), [
    (False, 0, False, "cuda-checkpoint-on-cpu-machine"),  # no GPU here: load with map_location
    (False, 2, False, "cpu-only-torch-build"),  # a GPU, but a build without CUDA
    (True, 1, False, "cuda-unavailable-in-process"),  # a CUDA build and a GPU, hidden from this process
])  # fmt: skip
def test_a_live_run_s_census_decides_why_a_cuda_checkpoint_cannot_load(built, gpus, available, cause):
    kb = load_knowledge_base(env={})
    incident = parse_text("RuntimeError: Attempting to deserialize object on a CUDA device but torch.cuda.is_available() "
                          "is False. If you are running on a CPU-only machine, please use torch.load with "
                          "map_location=torch.device('cpu') to map your storages to the CPU.\n")
    [lead, *_] = diagnose(incident, kb)
    assert (lead.rule, lead.cause_basis) == ("device.cuda-checkpoint-on-cpu", "base_rate")  # the log alone decides nothing
    lead.probes = [ProbeResult("backend_census", "confirmed", "", facts={
        "built": built, "available": available, "gpu_devices": gpus, "torch_version": "2.13.0", "cuda_version": None})]
    rechoose(lead, next(r for r in kb.rules if r.id == lead.rule), [])
    assert (lead.cause, lead.cause_basis) == (f"device.cuda-checkpoint-on-cpu/{cause}", "evidence")
