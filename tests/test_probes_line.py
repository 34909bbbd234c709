"""The failing line's own tensors, re-read in its frame: numpy_grad, inplace_leaf, inplace_view, view_contiguity and
index_bounds, each on a real failure (confirmed) and on a line where the measured cause is absent."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from _probe_fixtures import isolated, live_context, raised
from triage.probes.line_tensors import index_bounds, inplace_leaf, inplace_view, numpy_grad, view_contiguity


def score(model: nn.Module, x: torch.Tensor) -> float:
    preds = model(x)
    return float(np.mean(preds.numpy()))


def to_numpy_of_long(ids: torch.Tensor):
    return ids.numpy(force=False) + "x"  # numpy() works; the failure is the string


def test_numpy_grad_confirms_a_model_output_that_requires_grad():
    exc = raised(score, nn.Linear(3, 1), torch.randn(4, 3))
    outcome = isolated(numpy_grad, live_context(exc))
    assert outcome.status == "confirmed", outcome.detail
    assert (outcome.facts["tensor"], outcome.facts["grad_fn"], outcome.facts["detached_reads"]) == \
        ("preds", "AddmmBackward0", True)
    assert "requires grad: it is the output of AddmmBackward0, still tied to the autograd graph" in outcome.detail


def test_numpy_grad_refutes_a_tensor_without_grad():
    outcome = isolated(numpy_grad, live_context(raised(to_numpy_of_long, torch.arange(3))))
    assert outcome.status == "refuted" and outcome.facts["requires_grad"] is False


def sgd_step(w: torch.Tensor, lr: float = 0.1) -> None:
    w.sum().backward()
    w -= lr * w.grad


def sgd_step_no_grad(w: torch.Tensor, lr: float = 0.1) -> None:
    with torch.no_grad():
        w -= lr * w.grad.view(5)  # the view fails: the update itself is allowed here


def test_inplace_leaf_confirms_a_manual_update_with_grad_mode_on():
    exc = raised(sgd_step, torch.ones(2, requires_grad=True))
    outcome = isolated(inplace_leaf, live_context(exc))
    assert outcome.status == "confirmed", outcome.detail
    assert outcome.facts == {"target": "w", "is_leaf": True, "requires_grad": True, "grad_enabled": True,
                             "parameter": False, "reads_grad": True}


def test_inplace_leaf_refutes_an_update_under_no_grad():
    w = torch.ones(2, requires_grad=True)
    w.grad = torch.ones(2)
    outcome = isolated(inplace_leaf, live_context(raised(sgd_step_no_grad, w)))
    assert outcome.status == "refuted" and outcome.facts["grad_enabled"] is False
    assert "grad mode is off at that line" in outcome.detail


def scale_query(qkv: torch.Tensor, scale: float = 0.5) -> torch.Tensor:
    q, k = qkv.unbind(0)
    q *= scale
    return q @ k.T


def scale_copy(qkv: torch.Tensor, scale: float = 0.5) -> torch.Tensor:
    q = qkv[0].clone()
    q *= scale
    return q @ qkv[2]  # qkv holds two rows: index 2 fails after the in-place op


def test_inplace_view_confirms_an_unbind_output_changed_in_place():
    qkv = (torch.randn(2, 3, 3, requires_grad=True) * 1).contiguous()
    outcome = isolated(inplace_view, live_context(raised(scale_query, qkv)))
    assert outcome.status == "confirmed", outcome.detail
    assert (outcome.facts["grad_fn"], outcome.facts["multi_output"], outcome.facts["base_requires_grad"]) == \
        ("UnbindBackward0", True, True)


def test_inplace_view_refutes_a_target_that_is_no_view():
    outcome = isolated(inplace_view, live_context(raised(scale_copy, torch.randn(2, 3, 3))))
    assert outcome.status == "skipped"  # the line that failed changes nothing in place
    outcome = isolated(inplace_view, live_context(raised(sgd_step, torch.ones(2, requires_grad=True))))
    assert outcome.status == "refuted" and outcome.detail.endswith("is not a view of another tensor")


def flat_topk(scores: torch.Tensor, k: int = 2) -> torch.Tensor:
    correct = scores.topk(k, 1).indices.t()
    return correct[:k].view(-1)


def flat_wrong_size(scores: torch.Tensor) -> torch.Tensor:
    return scores.view(7)


def test_view_contiguity_confirms_a_transposed_slice():
    outcome = isolated(view_contiguity, live_context(raised(flat_topk, torch.randn(4, 5))))
    assert outcome.status == "confirmed", outcome.detail
    assert (outcome.facts["tensor"], outcome.facts["contiguous"], outcome.facts["contiguous_view"]) == \
        ("correct[:k]", False, [8])


def test_view_contiguity_refutes_a_contiguous_tensor():
    outcome = isolated(view_contiguity, live_context(raised(flat_wrong_size, torch.randn(4, 5))))
    assert outcome.status == "refuted" and outcome.facts["contiguous"] is True


def q_values(q: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    return q.gather(1, actions.unsqueeze(1)).squeeze(1)


def q_values_then_fail(q: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    return torch.gather(q, 1, actions.unsqueeze(1)).squeeze(1)[5]


def test_index_bounds_confirms_an_action_outside_the_head():
    actions = torch.tensor([0, 3, 4, 1])
    outcome = isolated(index_bounds, live_context(raised(q_values, torch.randn(4, 4), actions)))
    assert outcome.status == "confirmed", outcome.detail
    assert (outcome.facts["dim"], outcome.facts["size"], outcome.facts["index_min"], outcome.facts["index_max"]) == \
        (1, 4, 0, 4)
    assert "`actions.unsqueeze(1)` (values 0..4) indexes dim 1 of `q` (4x4, size 4)" in outcome.detail
    assert outcome.detail.endswith("1 of 4 indices fall outside [0, 4)")


def test_index_bounds_refutes_indices_in_range():
    outcome = isolated(index_bounds, live_context(raised(q_values_then_fail, torch.randn(4, 4), torch.tensor([0, 3]))))
    assert outcome.status == "refuted"
    assert "`actions.unsqueeze(1)` runs 0..3 within dim 1 of size 4" in outcome.detail


def test_line_probes_skip_a_line_without_their_call():
    outcome = isolated(index_bounds, live_context(raised(flat_wrong_size, torch.randn(4, 5))))
    assert outcome.status == "skipped" and outcome.detail.startswith("no gather/index_select/scatter call")
