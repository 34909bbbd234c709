"""saved_versions on real "modified by an inplace operation" failures: the stale saved tensor, read from the graph."""

from __future__ import annotations

import torch
from torch import nn

from _probe_fixtures import isolated, live_context, raised
from triage.probes.saved_versions import saved_versions


def two_losses_with_a_step_between(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    out = model(x)
    first, second = out.sum(), (out ** 2).sum()
    first.backward(retain_graph=True)
    optimizer.step()
    second.backward()


def test_saved_versions_names_the_weight_an_optimizer_step_changed():
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    exc = raised(two_losses_with_a_step_between, model, optimizer, torch.randn(5, 3))
    assert "modified by an inplace operation" in str(exc)
    outcome = isolated(saved_versions, live_context(exc, model=model, optimizer=optimizer))
    assert outcome.status == "confirmed"
    assert (outcome.facts["node"], outcome.facts["saved"], outcome.facts["shape"]) == ("AddmmBackward0", "mat2", [4, 2])  # weight.T
    assert outcome.facts["parameter"] == "parameter `2.weight` of Sequential" and outcome.facts["held_by_optimizer"]


def exp_then_shift(x: torch.Tensor) -> None:
    y = x.exp()
    y.add_(1)  # exp's backward needs its own output
    y.sum().backward()


def test_saved_versions_names_an_intermediate_result():
    outcome = isolated(saved_versions, live_context(raised(exp_then_shift, torch.randn(3, requires_grad=True))))
    assert outcome.status == "confirmed"
    assert (outcome.facts["node"], outcome.facts["saved"], outcome.facts["leaf"]) == ("ExpBackward0", "result", False)
    assert outcome.detail.startswith("ExpBackward0 saved `result` for backward, and it has been changed in place since: "
                                     "an intermediate result of the forward pass")


def failing_hook(x: torch.Tensor) -> None:
    y = x.exp() * 2
    y.register_hook(lambda grad: (_ for _ in ()).throw(RuntimeError("a hook failed")))
    y.sum().backward(retain_graph=True)


def test_saved_versions_refutes_a_graph_whose_saved_tensors_are_intact():
    outcome = isolated(saved_versions, live_context(raised(failing_hook, torch.randn(3, requires_grad=True))))
    assert outcome.status == "refuted"
    assert outcome.detail.endswith("reads back at its saved version: none was changed in place")


def test_saved_versions_skips_without_a_backward():
    assert isolated(saved_versions, live_context(raised(lambda: 1 / 0))).status == "skipped"
