"""grad_graph on real autograd failures: where the graph was cut, what carried it across iterations, what shape."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from _probe_fixtures import StateGuard, diagnosis, isolated, live_context, raised
from triage.probes.grad_graph import grad_graph


def _probe(exc, **tracker):
    ctx = live_context(exc, **tracker)
    return isolated(grad_graph, dataclasses.replace(ctx, diagnosis=diagnosis("autograd", "grad_graph")))


@torch.no_grad()
def compute_loss(model, x, y):
    return nn.functional.cross_entropy(model(x), y)


def train_with_helper(model, steps=2):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    for _ in range(steps):
        loss = compute_loss(model, x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_a_no_grad_decorator_on_the_loss_helper_is_named_with_its_line():
    model = nn.Linear(4, 3)
    exc = raised(train_with_helper, model)
    guard = StateGuard(model)
    outcome = _probe(exc)
    guard.assert_unchanged()
    assert outcome.status == "confirmed", outcome.detail
    assert outcome.facts["cut_by"] == "no_grad"
    assert "under its @torch.no_grad() decorator (line 19)" in outcome.detail
    assert "return nn.functional.cross_entropy(model(x), y)" in outcome.detail


def train_detached(model):
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    for _ in range(2):
        prediction = model(x).detach()
        loss = ((prediction - y) ** 2).mean()
        loss.backward()


def test_a_detach_on_the_way_to_the_loss_is_found():
    outcome = _probe(raised(train_detached, nn.Linear(4, 1)))
    assert outcome.status == "confirmed", outcome.detail
    assert outcome.facts["cut_by"] == "detach"
    assert "`prediction = model(x).detach()`" in outcome.detail


def test_frozen_parameters_are_named_when_no_op_cut_the_graph():
    model = nn.Linear(4, 1)
    model.requires_grad_(False)
    outcome = _probe(raised(train_detached_free, model))
    assert outcome.status == "confirmed", outcome.detail
    assert outcome.facts["cut_by"] == "frozen" and "every one of model's 2 parameter tensors" in outcome.detail


def train_detached_free(model):
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    for _ in range(2):
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()


def train_rnn(model, head):
    ids = torch.randn(1, 20, 4)
    hidden = None
    for start in range(0, 16, 4):
        out, hidden = model(ids[:, start:start + 4], hidden)
        loss = head(out).pow(2).mean()
        loss.backward()


def test_an_rnn_hidden_state_carried_with_its_graph_is_named():
    exc = raised(train_rnn, nn.GRU(4, 8, batch_first=True), nn.Linear(8, 1))
    outcome = _probe(exc)
    assert outcome.status == "confirmed", outcome.detail
    assert outcome.facts["carried_graph"] == ["hidden"]
    assert "`hidden` is carried from one iteration of the loop in train_rnn" in outcome.detail


def train_two_losses(encoder, head_a, head_b):
    x = torch.randn(8, 4)
    for _ in range(2):
        features = encoder(x)
        head_a(features).mean().backward()
        head_b(features).mean().backward()


def test_two_backwards_over_a_shared_graph_are_named_with_their_lines():
    exc = raised(train_two_losses, nn.Linear(4, 4), nn.Linear(4, 1), nn.Linear(4, 1))
    outcome = _probe(exc)
    assert outcome.status == "confirmed", outcome.detail
    assert outcome.facts["carried_graph"] == [] and len(outcome.facts["backward_lines"]) == 2


def test_a_non_scalar_loss_s_shape_is_measured():
    model = nn.Linear(4, 1)
    loss = nn.functional.mse_loss(model(torch.randn(6, 4)), torch.randn(6, 1), reduction="none")
    outcome = _probe(raised(loss.backward))
    assert outcome.status == "confirmed"
    assert outcome.facts["shape"] == [6, 1] and "(6 values)" in outcome.detail


def build_frozen_optimizer():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    model.requires_grad_(False)
    return torch.optim.Adam(filter(lambda p: p.requires_grad, model.parameters()))


def build_consumed_optimizer():
    model = nn.Linear(4, 2)
    params = model.parameters()
    print(sum(p.numel() for p in params))
    return torch.optim.Adam(params)


def test_an_empty_parameter_list_tells_frozen_parameters_from_a_consumed_iterator():
    frozen = _probe(raised(build_frozen_optimizer))
    assert frozen.facts["cause"] == "all-frozen" and "all 4 parameter tensors of model" in frozen.detail
    consumed = _probe(raised(build_consumed_optimizer))
    assert consumed.facts["cause"] == "consumed-iterator" and "2 trainable parameter tensors" in consumed.detail


POLICY = nn.Linear(4, 2)
SAVED: list[torch.Tensor] = []


@torch.no_grad()
def act_without_grad(state: torch.Tensor) -> None:
    SAVED.append(POLICY(state).log_softmax(-1)[0, 0])


def act_detached(state: torch.Tensor) -> None:
    SAVED.append(POLICY(state).log_softmax(-1)[0, 0].detach())


def episode(act) -> None:
    SAVED.clear()
    reward = 0.0
    for _ in range(3):
        act(torch.randn(1, 4))
        loss = torch.stack(SAVED).sum() * reward  # no replay of the loop calls the model (act is no module)
        reward = reward + 1.0
        loss.backward()


def test_a_model_called_under_no_grad_is_named_when_the_replayed_step_does_not_call_it():
    exc = raised(episode, act_without_grad)
    ctx = live_context(exc, model=POLICY, model_call=((torch.randn(1, 4),), {}))
    outcome = isolated(grad_graph, ctx)
    assert outcome.status == "confirmed"
    assert (outcome.facts["cut_by"], outcome.facts["cut_code"]) == ("no_grad", "SAVED.append(POLICY(state).log_softmax(-1)[0, 0])")
    assert "Linear builds a graph when called with tracking on (its output requires grad)" in outcome.detail
    assert "under its @torch.no_grad() decorator" in outcome.detail


def test_no_no_grad_call_is_claimed_when_the_model_is_called_with_tracking_on():
    exc = raised(episode, act_detached)
    ctx = live_context(exc, model=POLICY, model_call=((torch.randn(1, 4),), {}))
    outcome = isolated(grad_graph, ctx)
    assert outcome.status == "skipped" and "cut_by" not in outcome.facts  # the carried `reward` stops the replay
    assert outcome.detail.startswith("the failing step cannot be replayed")
