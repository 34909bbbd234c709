"""eager_rerun on real torch.compile failures: the compiler's own (eager runs) against a model bug (eager fails too)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from _probe_fixtures import StateGuard, diagnosis, isolated, live_context, raised
from triage.probes.eager_rerun import eager_rerun


class Refiner(nn.Module):
    """Exits its loop on a tensor's value: Dynamo cannot trace it with fullgraph=True; eagerly it is fine."""

    def __init__(self) -> None:
        super().__init__()
        self.step = nn.Linear(8, 8)

    def forward(self, x):
        for _ in range(3):
            x = x + torch.tanh(self.step(x))
            if x.mean() > 10:
                break
        return x


class Mismatched(nn.Module):
    """A real shape bug: fc expects 16 features and gets 8, compiled or not."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(x)


def _compiled_failure(model: nn.Module, x: torch.Tensor):
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    exc = raised(compiled, x)
    ctx = live_context(exc, model=compiled)
    return dataclasses.replace(ctx, model=compiled, model_args=(x,), diagnosis=diagnosis("compile", "eager_rerun"))


def test_a_graph_break_under_fullgraph_runs_eagerly_so_the_compiler_is_confirmed():
    torch.manual_seed(0)
    model = Refiner()
    ctx = _compiled_failure(model, torch.randn(4, 8))
    assert "Unsupported" in type(ctx.exception).__name__ or "graph break" in str(ctx.exception).lower()
    guard = StateGuard(model)
    outcome = isolated(eager_rerun, ctx)
    guard.assert_unchanged()
    assert outcome.status == "confirmed", outcome.detail
    assert "the step runs without error" in outcome.detail and "the model's call replayed" in outcome.detail


def test_a_model_bug_that_compiling_surfaced_fails_eagerly_too_and_refutes_the_compiler():
    model = Mismatched()
    ctx = _compiled_failure(model, torch.randn(4, 8))
    outcome = isolated(eager_rerun, ctx)
    assert outcome.status == "refuted", outcome.detail
    assert "mat1 and mat2 shapes cannot be multiplied (4x8 and 16x4)" in outcome.detail


@torch.compile(fullgraph=True, backend="eager")
def _scaled(x):
    if x.sum() > 0:  # data-dependent branch: a graph break, refused under fullgraph
        return x * 2
    return x


def test_with_the_model_s_call_read_from_the_traceback_it_replays_that_call():
    model = Refiner()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    exc = raised(compiled, torch.randn(4, 8))
    ctx = dataclasses.replace(live_context(exc), diagnosis=diagnosis("compile", "eager_rerun"))
    assert ctx.model_args is not None  # the outermost module call on the traceback, with its real arguments
    assert isolated(eager_rerun, ctx).status == "confirmed"


def test_without_a_model_call_or_a_loop_to_replay_it_says_why():
    exc = raised(lambda: _scaled(torch.ones(3)))
    ctx = dataclasses.replace(live_context(exc), diagnosis=diagnosis("compile", "eager_rerun"))
    outcome = isolated(eager_rerun, ctx)
    assert outcome.status == "skipped", outcome.detail
    assert "no live model" in outcome.detail
