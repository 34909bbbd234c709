"""Shared pieces for the probe tests: small real models, real failures, and a check that user state is untouched."""

from __future__ import annotations

import copy
import os
import random
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from triage.diagnosis import Diagnosis
from triage.incident import ExceptionInfo, Incident
from triage.probes.runner import context_from_failure
from triage.tracking import Tracker
from triage.wrapper import incident_from_exception

# Verbatim device-side assert text (torch 2.x), as printed after an out-of-range embedding index on a GPU.
CUDA_ASSERT = (
    "CUDA error: device-side assert triggered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)
ASSERT_LINE = ("../aten/src/ATen/native/cuda/Indexing.cu:1289: indexSelectLargeIndex: block: [100,0,0], "
               "thread: [64,0,0] Assertion `srcIndex < srcSelectDimSize` failed.")


class Encoder(nn.Module):
    def __init__(self, vocab: int = 10) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 8)
        self.proj = nn.Linear(8, 8)

    def forward(self, ids):
        h = self.embed(ids)
        return self.proj(h).mean(1)


class TextModel(nn.Module):
    def __init__(self, vocab: int = 10, classes: int = 3) -> None:
        super().__init__()
        self.encoder = Encoder(vocab)
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(8, classes)

    def forward(self, ids):
        return self.head(self.dropout(self.encoder(ids)))


class ConvNet(nn.Module):
    """Built for 8x8 images: conv3 gives 64x2x2 = 256 features, fc1 expects 256."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3)
        self.conv2 = nn.Conv2d(16, 32, 3)
        self.conv3 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(256, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.conv3(x)
        x = x.flatten(1)
        return self.fc1(x)


def raised(fn, *args, **kwargs) -> BaseException:
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # the real failure under test
        return exc
    raise AssertionError("expected the call to fail")


def simulated_cuda_incident() -> tuple[Incident, RuntimeError]:
    exc = RuntimeError(CUDA_ASSERT)
    info = ExceptionInfo("RuntimeError", CUDA_ASSERT)
    incident = Incident(kind="exception", source="run", exception=info, exceptions=[info], log_lines=[ASSERT_LINE])
    return incident, exc


def diagnosis(category: str, *probes: str, **values) -> Diagnosis:
    return Diagnosis(rule=f"{category}.test", category=category, confidence=0.9, title="t", hypothesis="h", fix="f",
                     probe_names=list(probes), values=values)


def live_context(exc: BaseException, tracker: Tracker | None = None, report_dir: Path | None = None, **tracker_fields):
    tracker = tracker or Tracker(**tracker_fields)
    return context_from_failure(incident_from_exception(exc), exc, report_dir, tracker=tracker, time_limit_s=30)


def isolated(probe, ctx, limit_s: float = 60.0):
    """The probe run as the runner runs it: in a disposable child, so that what it does to the objects stays there."""
    from triage.probes.runner import run_probe

    return run_probe(probe.__name__, ctx, limit_s)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a, b) or (a.is_floating_point() and bool(torch.equal(a.isnan(), b.isnan()))
                                 and bool(torch.equal(a.nan_to_num(), b.nan_to_num())))


class StateGuard:
    """Snapshots what a probe must not change: RNG states, parameters, gradients, optimizer state, grad mode, files."""

    def __init__(self, *modules: nn.Module, optimizer=None, folder: Path | None = None, allowed: Path | None = None):
        self.modules = modules
        self.optimizer = optimizer
        self.folder = Path(folder or os.getcwd())
        self.allowed = allowed
        self.python = random.getstate()
        self.numpy = np.random.get_state()
        self.torch = torch.get_rng_state()
        self.grad = torch.is_grad_enabled()
        self.params = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in modules]
        self.grads = [[None if p.grad is None else p.grad.clone() for p in m.parameters()] for m in modules]
        self.training = [[s.training for s in m.modules()] for m in modules]
        self.hooks = [[(len(s._forward_hooks), len(s._forward_pre_hooks)) for s in m.modules()] for m in modules]
        self.optim = copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None
        self.files = self._files()

    def _files(self) -> set[str]:
        found = set()
        for path in self.folder.rglob("*"):
            if self.allowed is not None and (path == self.allowed or self.allowed in path.parents):
                continue
            found.add(str(path))
        return found

    def assert_unchanged(self) -> None:
        assert random.getstate() == self.python, "python RNG state changed"
        now = np.random.get_state()
        assert now[0] == self.numpy[0] and (now[1] == self.numpy[1]).all() and now[2:] == self.numpy[2:], "numpy RNG"
        assert torch.equal(torch.get_rng_state(), self.torch), "torch RNG state changed"
        assert torch.is_grad_enabled() == self.grad, "grad mode changed"
        for module, before, grads, training, hooks in zip(self.modules, self.params, self.grads, self.training,
                                                          self.hooks):
            after = module.state_dict()
            assert after.keys() == before.keys()
            for key in before:
                assert _same(after[key], before[key]), key
            for p, g in zip(module.parameters(), grads):
                assert (p.grad is None) == (g is None), "a gradient appeared or vanished"
                if g is not None:
                    assert _same(p.grad, g), "a gradient changed"
            assert [s.training for s in module.modules()] == training, "train/eval mode changed"
            assert [(len(s._forward_hooks), len(s._forward_pre_hooks)) for s in module.modules()] == hooks
        if self.optimizer is not None:
            after = self.optimizer.state_dict()
            assert after["param_groups"] == self.optim["param_groups"]
            for key, state in self.optim["state"].items():
                for name, value in state.items():
                    other = after["state"][key][name]
                    assert _same(other, value) if isinstance(value, torch.Tensor) else other == value, name
        assert self._files() == self.files, "files changed outside the report folder"
