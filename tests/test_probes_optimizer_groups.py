"""optimizer_groups on a real refused optimizer state: the saved group sizes against the optimizer's and the model's."""

from __future__ import annotations

import torch
from torch import nn

from _probe_fixtures import isolated, live_context, raised
from triage.probes.optimizer_groups import optimizer_groups


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_optimizer_groups_confirms_a_state_saved_before_the_backbone_was_frozen():
    model = _model()
    saved = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9).state_dict()
    model[0].requires_grad_(False)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    exc = raised(optimizer.load_state_dict, saved)
    outcome = isolated(optimizer_groups, live_context(exc, model=model))
    assert outcome.status == "confirmed"
    assert (outcome.facts["saved_groups"], outcome.facts["current_groups"]) == ([4], [2])
    assert outcome.facts["saved_all_parameters"] and outcome.facts["current_trainable_only"]
    assert outcome.detail == ("the saved SGD state has 1 parameter group of 4 parameters, the optimizer it was loaded "
                              "into has 1 parameter group of 2 parameters: the saved optimizer held all 4 of the "
                              "model's parameters, this one only the 2 that require grad now")


def test_optimizer_groups_names_a_different_number_of_groups():
    model = _model()
    saved = torch.optim.Adam([{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 1e-4}]).state_dict()
    optimizer = torch.optim.Adam(model.parameters())
    outcome = isolated(optimizer_groups, live_context(raised(optimizer.load_state_dict, saved), model=model))
    assert outcome.status == "confirmed" and outcome.facts["same_group_count"] is False


def test_optimizer_groups_refutes_matching_groups():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    saved = optimizer.state_dict()
    del saved["state"]  # the groups fit; the load fails on the missing state
    outcome = isolated(optimizer_groups, live_context(raised(optimizer.load_state_dict, saved), model=model))
    assert outcome.status == "refuted"
    assert outcome.detail == "the saved state's parameter groups match the optimizer's (1 parameter group of 4 parameters)"


def test_optimizer_groups_skips_without_the_load_on_the_traceback():
    assert isolated(optimizer_groups, live_context(raised(lambda: 1 / 0))).status == "skipped"
