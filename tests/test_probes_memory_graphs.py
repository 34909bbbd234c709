"""memory_breakdown at an out-of-memory error: graphs kept across batches, and a sample too large for any batch size.

The GPU bugs are reproduced on the CPU with small tensors: a validation loop without `torch.no_grad()` that sums
loss tensors keeps every batch's graph alive exactly as it does on a GPU; the out-of-memory error it would end in is
raised at the same line with the allocator's own wording, scaled to the small tensors.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from triage.incident import ExceptionInfo, Incident
from triage.kb import load_paths
from triage.kb.matcher import diagnose, rechoose
from triage.logparse import parse_text
from triage.probes import memory_breakdown as breakdown
from triage.probes.context import ProbeContext
from triage.probes.graph_memory import model_storages, walk_graphs
from triage.probes.memory_breakdown import memory_breakdown

@pytest.fixture(autouse=True)
def _collect_the_failures():
    """Reading a frame's locals (frame.f_locals) stores a snapshot of them on the frame, and the frame that caught the
    error then holds its exception, whose traceback holds the frame: a reference cycle that keeps this test's graphs
    alive until the garbage collector runs. Collect it, so that later tests' scans of live tensors do not meet them."""
    yield
    gc.collect()


OOM_RULES = Path(__file__).resolve().parents[1] / "knowledge_base" / "oom.yaml"
BATCH, FEATURES, WIDTH, BATCHES = 64, 32, 1024, 12
MiB = 2**20


def _small_card_oom(allocated: float) -> str:
    """The allocator's torch >= 2.4 wording, for a card this test's small tensors fill: `allocated` bytes, 2 MiB more
    in all."""
    allocated_mib = allocated / MiB
    return (f"CUDA out of memory. Tried to allocate 1.00 MiB. GPU 0 has a total capacity of "
            f"{allocated_mib + 2:.2f} MiB of which 512.00 KiB is free. Of the allocated memory {allocated_mib:.2f} MiB "
            "is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated "
            "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH), nn.GELU(),
                         nn.Linear(WIDTH, 10))


def _weights(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


# What one forward of _model keeps for backward, parameters aside: the input, and per hidden layer the Linear's
# output (saved by GELU) and the GELU's output (saved by the next Linear).
ONE_PASS_BYTES = BATCH * FEATURES * 4 + 4 * BATCH * WIDTH * 4


class RunsOutOfMemory(nn.Module):
    """The model, on a card that runs out at its `at`-th forward call (with the allocator's message)."""

    def __init__(self, model: nn.Module, at: int, message: str) -> None:
        super().__init__()
        self.model, self.at, self.message, self.calls = model, at, message, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.at:
            raise torch.OutOfMemoryError(self.message)
        return self.model(x)


def _validate_without_no_grad(model: nn.Module, batches: int, message: str) -> None:
    model = RunsOutOfMemory(model, batches + 1, message)
    total = torch.zeros(())
    for _ in range(batches + 1):
        x = torch.randn(BATCH, FEATURES)
        y = torch.randint(0, 10, (BATCH,))
        total = total + F.cross_entropy(model(x), y)


def _train_one_step(model: nn.Module, message: str) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(3):
        x = torch.randn(BATCH, FEATURES)
        y = torch.randint(0, 10, (BATCH,))
        out = model(x)
        if step == 2:
            raise torch.OutOfMemoryError(message)  # the loss of a step whose forward filled the card
        loss = F.cross_entropy(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _two_views_step(model: nn.Module, message: str) -> None:
    anchor, positive = torch.randn(BATCH, FEATURES), torch.randn(BATCH, FEATURES)
    difference = model(anchor) - model(positive)  # one step, two forwards through the same weights
    if difference.requires_grad:
        raise torch.OutOfMemoryError(message)  # the contrastive loss on top of them


def _context(exc: BaseException, model: nn.Module, library_frames: int, **fields) -> ProbeContext:
    """The context the runner builds at the failure, `library_frames` innermost frames standing for torch's."""
    frames, tb = [], exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    info = ExceptionInfo("torch.OutOfMemoryError", str(exc))
    fields = {"model_args": (torch.zeros(BATCH, FEATURES),), **fields}
    return ProbeContext(incident=Incident(source="run", exception=info, exceptions=[info]), exception=exc,
                        model=model, frames=frames[: len(frames) - library_frames], **fields)


def _run(fn, model: nn.Module, *args, library_frames: int = 0, **fields):
    """memory_breakdown at the out-of-memory error fn raises."""
    try:
        fn(model, *args)
    except torch.OutOfMemoryError as exc:
        return memory_breakdown(_context(exc, model, library_frames, **fields))
    raise AssertionError("expected the out-of-memory error")


def _leading_oom_diagnosis(message: str, outcome):
    kb = load_paths([OOM_RULES])
    assert kb.problems == []
    [diagnosis] = [d for d in diagnose(parse_text(f"torch.OutOfMemoryError: {message}\n"), kb)
                   if d.rule == "oom.gpu-out-of-memory"]
    diagnosis.probes.append(outcome)
    warnings: list[str] = []
    rechoose(diagnosis, next(r for r in kb.rules if r.id == diagnosis.rule), warnings)
    assert warnings == []
    return diagnosis


def test_validation_graphs_kept_across_batches_are_named_with_their_passes_and_memory():
    model = _model()
    # the card is filled by the weights (4.17 MiB), 12 batches' graphs (12.09 MiB) and a little else
    message = _small_card_oom(_weights(model) + BATCHES * ONE_PASS_BYTES * 1.1)
    outcome = _run(_validate_without_no_grad, model, BATCHES, message)
    graph = outcome.facts["kept_graph"]
    assert graph["variable"] == "total"
    assert graph["where"] == f"{__file__}:{_validate_without_no_grad.__code__.co_firstlineno + 6}"  # total = ...
    assert graph["passes"] == BATCHES and graph["complete"]
    assert BATCHES * ONE_PASS_BYTES <= graph["held_bytes"] < 1.05 * BATCHES * ONE_PASS_BYTES
    assert outcome.facts["graphs_kept_across_batches"] is True
    assert f"`total` ({graph['where']}) keeps autograd graphs that span 12 forward passes" in outcome.detail
    assert "reduce the batch" not in outcome.detail
    assert outcome.facts["fixes"][0].startswith("run the evaluation under `torch.no_grad()`")

    diagnosis = _leading_oom_diagnosis(message, outcome)
    assert diagnosis.cause == "oom.gpu-out-of-memory/graphs-kept-across-batches"
    assert diagnosis.fix_id == "no-grad-in-validation"
    assert diagnosis.title == "`total` keeps the autograd graphs of 12 forward passes alive until memory runs out"
    assert f"`total` ({graph['where']}) holds graphs that span 12 forward passes and keep 12" in diagnosis.hypothesis
    assert "69% of the 17.48 MiB allocated by PyTorch" in diagnosis.hypothesis
    assert "`total += loss.item()`" in diagnosis.fix and "torch.no_grad()" in diagnosis.fix


def test_one_training_step_that_fills_the_card_is_not_blamed_on_kept_graphs():
    model = _model()
    message = _small_card_oom(2 * _weights(model) + ONE_PASS_BYTES * 1.1)  # weights, gradients and one step
    outcome = _run(_train_one_step, model, message)
    graph = outcome.facts["kept_graph"]
    assert graph["variable"] == "out" and graph["passes"] == 1  # the step's own graph: most of the memory, one pass
    assert graph["share"] > 0.1
    assert outcome.facts["graphs_kept_across_batches"] is False
    assert "reduce the batch from 64" in outcome.detail
    diagnosis = _leading_oom_diagnosis(message, outcome)
    assert diagnosis.cause == "oom.gpu-out-of-memory/batch-too-large-for-gpu"


def test_one_step_with_two_forwards_through_the_same_model_is_not_kept_across_batches():
    model = _model()
    outcome = _run(_two_views_step, model, _small_card_oom(_weights(model) + 2 * ONE_PASS_BYTES * 1.1))
    graph = outcome.facts["kept_graph"]
    assert graph["variable"] == "difference" and graph["passes"] == 2 and graph["share"] > 0.3
    assert outcome.facts["graphs_kept_across_batches"] is False


def test_graphs_that_hold_little_of_the_memory_do_not_choose_the_cause():
    model = _model()
    message = _small_card_oom(_weights(model) + BATCHES * ONE_PASS_BYTES * 4)  # something else holds most
    outcome = _run(_validate_without_no_grad, model, BATCHES, message)
    assert outcome.facts["kept_graph"]["passes"] == BATCHES
    assert outcome.facts["graphs_kept_across_batches"] is False
    assert _leading_oom_diagnosis(message, outcome).cause == "oom.gpu-out-of-memory/batch-too-large-for-gpu"


def test_kept_graphs_on_the_host_are_measured_against_the_resident_memory(monkeypatch):
    model = _model()
    kept = BATCHES * ONE_PASS_BYTES
    monkeypatch.setattr(breakdown, "_resident_bytes", lambda: int(_weights(model) + kept * 1.25))
    host_oom = ("[enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
                "to allocate 4194304 bytes. Error code 12 (Cannot allocate memory)")
    outcome = _run(_validate_without_no_grad, model, BATCHES, host_oom)
    assert outcome.facts["graphs_kept_across_batches"] is True
    assert outcome.status == "confirmed"  # what filled the memory, though this host has room for 4 MiB by now
    assert outcome.facts["kept_graph"]["in_use_word"] == "resident in this process"
    assert "of saved tensors, 63% of the 19.29 MiB resident in this process" in outcome.detail


def test_the_walk_counts_each_storage_once_and_stops_at_its_node_budget():
    model = _model()
    x = torch.randn(BATCH, FEATURES)
    losses = [model(x).sum() for _ in range(5)]  # five passes over the same input: x is one storage
    exclude = model_storages()
    whole = walk_graphs([loss.grad_fn for loss in losses], exclude)
    assert whole.passes == 5 and whole.complete
    assert whole.held_bytes == BATCH * FEATURES * 4 + 5 * (ONE_PASS_BYTES - BATCH * FEATURES * 4)
    part = walk_graphs([loss.grad_fn for loss in losses], exclude, max_nodes=10)
    assert part.nodes == 10 and not part.complete and part.held_bytes < whole.held_bytes
    cpu_only = walk_graphs([loss.grad_fn for loss in losses], exclude, device_type="cuda")
    assert cpu_only.held_bytes == 0 and cpu_only.passes == 5  # another device's storages are not this card's


def test_the_walk_never_unpacks_what_a_saved_tensor_hook_packed():
    unpacked = []

    def pack(tensor):
        return "offloaded", tensor.detach().clone()  # a copy, as save_on_cpu and offloaders keep

    def unpack(packed):
        unpacked.append(packed)  # on a GPU: a copy of the activation back onto the full card
        return packed[1]

    model = _model()
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        loss = model(torch.randn(BATCH, FEATURES)).sum()
    walk = walk_graphs([loss.grad_fn], model_storages())
    assert unpacked == []
    assert walk.held_bytes >= ONE_PASS_BYTES  # the packed copies, counted where they live
    assert walk.passes == 1


def test_a_graph_freed_by_backward_holds_nothing():
    model = _model()
    loss = model(torch.randn(BATCH, FEATURES)).sum()
    loss.backward()
    walk = walk_graphs([loss.grad_fn], model_storages())
    assert walk.held_bytes == 0 and walk.passes == 1


# The GPU's own report (H100, torch 2.11): 2 x 8 heads x 65,536^2 attention scores in one allocation.
ATTENTION_OOM = ("CUDA out of memory. Tried to allocate 255.99 GiB. GPU 0 has a total capacity of 79.18 GiB of which "
                 "77.66 GiB is free. Including non-PyTorch memory, this process has 1.51 GiB memory in use. Of the "
                 "allocated memory 867.13 MiB is allocated by PyTorch, and 895.00 KiB is reserved by PyTorch but "
                 "unallocated. If reserved but unallocated memory is large try setting "
                 "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


def _on_the_full_card(scores):
    raise torch.OutOfMemoryError(ATTENTION_OOM)  # what the 65,536-token run's scores asked for


def _attention(model, q, k):
    scores = _on_the_full_card(q @ k.transpose(-2, -1))
    return scores


def test_an_allocation_larger_than_any_free_memory_gets_no_batch_size_fix():
    model = nn.Sequential(nn.Embedding(1000, 32), nn.Linear(32, 32))
    tokens = torch.randint(0, 1000, (2, 512))
    # on the GPU the allocation fails inside torch, whose frames are not the user's
    outcome = _run(_attention, model, torch.randn(2, 8, 512, 4), torch.randn(2, 8, 512, 4), library_frames=1,
                   model_args=(tokens,))
    assert outcome.status == "confirmed"
    assert "that one allocation (255.99 GiB) is more than the 71.26 GiB the card can free" in outcome.detail
    assert "no batch size fits, not even 1" in outcome.detail
    assert not any("batch" in fix and "reduce" in fix for fix in outcome.facts["fixes"])
    line = _attention.__code__.co_firstlineno + 1
    first = outcome.facts["fixes"][0]
    assert first.startswith(f"split the operation at {__file__}:{line} (`scores = _on_the_full_card(q @ k.")
    assert "scaled_dot_product_attention" in outcome.facts["fixes"][1]
    assert outcome.facts["fixes"][2].startswith("shorten the inputs")
    assert len(outcome.facts["fixes"]) == 3  # half precision would still need 128 GiB: not offered


def test_one_sample_larger_than_the_card_gets_checkpointing_not_a_smaller_batch():
    message = ("CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 8.00 GiB of which "
               "400.00 MiB is free. Of the allocated memory 7.50 GiB is allocated by PyTorch, and 20.00 MiB is "
               "reserved by PyTorch but unallocated.")
    info = ExceptionInfo("torch.OutOfMemoryError", message)
    ctx = ProbeContext(incident=Incident(source="run", exception=info, exceptions=[info]), batch=torch.zeros(1, 3))
    outcome = memory_breakdown(ctx)
    assert "one sample alone needs ≈ 8.50 GiB of activations, more than the 7.20 GiB" in outcome.detail
    assert outcome.facts["fixes"][0].startswith("use activation checkpointing")
    assert outcome.facts["fixes"][-1].startswith("train in mixed precision")  # 4.25 GiB in half precision fits
    assert outcome.facts["batch_size_estimate"] == 0


@pytest.mark.parametrize("rule", ["oom.gpu-out-of-memory-legacy", "oom.gpu-out-of-memory-in-log", "oom.host-allocator"])
def test_every_oom_rule_with_live_evidence_has_the_kept_graphs_cause(rule):
    kb = load_paths([OOM_RULES])
    causes = [c.id for c in next(r for r in kb.rules if r.id == rule).causes]
    assert "graphs-kept-across-batches" in causes


def test_weights_and_optimizer_state_that_fill_the_card_get_no_batch_size_fix():
    model = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 256))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 256)).sum().backward()
    optimizer.step()  # weights, gradients and two Adam moments: 4 x 514 KiB
    message = ("CUDA out of memory. Tried to allocate 64.00 KiB. GPU 0 has a total capacity of 2.00 MiB of which "
               "10.00 KiB is free. Of the allocated memory 1.95 MiB is allocated by PyTorch, and 0 bytes is reserved "
               "by PyTorch but unallocated.")
    info = ExceptionInfo("torch.OutOfMemoryError", message)
    ctx = ProbeContext(incident=Incident(source="run", exception=info, exceptions=[info]), model=model,
                       optimizer=optimizer, batch=torch.zeros(4, 256))
    outcome = memory_breakdown(ctx)
    assert "the weights, gradients and optimizer state alone take 2.01 MiB of the 2.00 MiB card" in outcome.detail
    assert outcome.facts["fixes"][0].startswith("load less model onto the card")
    assert outcome.facts["fixes"][1].startswith("hold less optimizer state (1.00 MiB)")
