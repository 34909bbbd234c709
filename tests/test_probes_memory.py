"""memory_breakdown on a real host OOM and on CUDA OOM texts from public logs, with a live model and optimizer."""

from __future__ import annotations

import torch
from torch import nn

from _probe_fixtures import StateGuard, diagnosis, raised
from triage.incident import ExceptionInfo, Incident
from triage.probes.context import ProbeContext
from triage.probes.memory_breakdown import memory_breakdown, parse_oom

# https://github.com/pytorch/pytorch/issues/16417 (comment of 2024-03-13)
OOM_2X = ("CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a total capacity of 23.65 GiB of which 11.06 MiB "
          "is free. Including non-PyTorch memory, this process has 23.60 GiB memory in use. Of the allocated memory "
          "22.90 GiB is allocated by PyTorch, and 194.87 MiB is reserved by PyTorch but unallocated. If reserved but "
          "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
          "fragmentation.  See documentation for Memory Management  "
          "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
# https://github.com/carolchenyx/MGFN./issues/35 (torch 2.1 wording, "capacty")
OOM_FRAGMENTED = ("CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total capacty of 6.00 GiB of which 0 "
                  "bytes is free. Of the allocated memory 2.93 GiB is allocated by PyTorch, and 2.30 GiB is reserved "
                  "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
                  "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and "
                  "PYTORCH_CUDA_ALLOC_CONF")
# https://github.com/pytorch/pytorch/issues/59778 (torch 1.x wording)
OOM_1X = ("CUDA out of memory. Tried to allocate 2.26 GiB (GPU 0; 6.00 GiB total capacity; 781.59 MiB already "
          "allocated; 3.03 GiB free; 1.24 GiB reserved in total by PyTorch)")

GiB, MiB = 1024**3, 1024**2


def _incident(message: str, type_: str = "torch.OutOfMemoryError") -> Incident:
    info = ExceptionInfo(type_, message)
    return Incident(source="run", exception=info, exceptions=[info])


def test_parse_oom_reads_every_wording():
    figures = parse_oom(OOM_2X)
    assert figures["tried"] == 22 * MiB and figures["capacity"] == int(23.65 * GiB)
    assert figures["free"] == int(11.06 * MiB) and figures["allocated"] == int(22.90 * GiB)
    assert figures["unallocated"] == int(194.87 * MiB)
    assert parse_oom(OOM_FRAGMENTED)["free"] == 0 and parse_oom(OOM_FRAGMENTED)["capacity"] == 6 * GiB
    old = parse_oom(OOM_1X)
    assert old["allocated"] == int(781.59 * MiB) and old["reserved"] == int(1.24 * GiB) and old["free"] == int(3.03 * GiB)


def test_memory_breakdown_estimates_a_batch_size_that_fits():
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 64)).sum().backward()
    optimizer.step()
    batch = (torch.randn(32, 64), torch.randint(0, 10, (32,)))
    ctx = ProbeContext(incident=_incident(OOM_2X), model=model, optimizer=optimizer, batch=batch,
                       diagnosis=diagnosis("oom"))
    guard = StateGuard(model, optimizer=optimizer)
    outcome = memory_breakdown(ctx)
    guard.assert_unchanged()
    assert outcome.status == "confirmed"  # 22 MiB requested, 11.06 MiB free
    assert "the failed allocation needed 22.00 MiB; the GPU has 23.65 GiB, 22.90 GiB allocated by PyTorch" in outcome.detail
    # (22.90 GiB + 22 MiB) of activations for 32 samples: about 0.72 GiB per sample; 0.9 × 23.65 GiB fits 29.
    assert outcome.facts["batch_size_estimate"] == 29
    assert "(1) reduce the batch from 32 to about 29" in outcome.detail
    assert "accumulate gradients over 2 steps" in outcome.detail
    # Adam: exp_avg and exp_avg_sq the size of each of the 4 parameters, plus a 4-byte step counter each.
    assert outcome.facts["optimizer_state"] == 2 * outcome.facts["parameters"] + 4 * 4
    assert any("optimizer exp_avg" in t or "weight" in t for t in outcome.facts["largest_tensors"])


def test_memory_breakdown_puts_fragmentation_first():
    ctx = ProbeContext(incident=_incident(OOM_FRAGMENTED, "torch.cuda.OutOfMemoryError"), batch=torch.zeros(16, 3))
    outcome = memory_breakdown(ctx)
    assert outcome.status == "confirmed"
    assert outcome.facts["fixes"][0].startswith("memory is fragmented (2.30 GiB reserved but unallocated, more than "
                                                "the 1.70 GiB requested): set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


def test_memory_breakdown_refutes_a_shortage_when_the_message_shows_enough_free():
    outcome = memory_breakdown(ProbeContext(incident=_incident(OOM_1X, "RuntimeError")))
    assert outcome.status == "refuted"
    assert "3.03 GiB free" in outcome.detail


def test_memory_breakdown_on_a_real_host_allocation_failure():
    exc = raised(torch.empty, 2**50)  # 1 PiB of float32: the allocator refuses
    assert "DefaultCPUAllocator: can't allocate memory" in str(exc)
    incident = _incident(str(exc), "RuntimeError")
    outcome = memory_breakdown(ProbeContext(incident=incident, exception=exc))
    assert outcome.status == "confirmed"
    assert outcome.detail.startswith("the failed host allocation asked for 4096.00 TiB; the host has ")
    assert "more than the machine's entire memory: the size itself is wrong" in outcome.detail


def test_memory_breakdown_takes_figures_the_rule_extracted_when_the_text_has_none():
    from _probe_fixtures import diagnosis as make_diagnosis

    incident = Incident(source="run", log_lines=["RuntimeError: CUDA error: out of memory"])
    ctx = ProbeContext(incident=incident, diagnosis=make_diagnosis("oom", tried="2.00 GiB", total="8.00 GiB",
                                                                   free="512.00 MiB"))
    outcome = memory_breakdown(ctx)
    assert outcome.status == "confirmed"
    assert outcome.detail.startswith("the failed allocation needed 2.00 GiB; the GPU has 8.00 GiB, 512.00 MiB free")
