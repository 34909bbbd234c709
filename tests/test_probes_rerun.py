"""cpu_rerun, index_range and shape_trace on real CPU failures and on a simulated CUDA device-side assert."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from _probe_fixtures import (ASSERT_LINE, CUDA_ASSERT, ConvNet, StateGuard, TextModel, diagnosis, live_context, raised,
                             simulated_cuda_incident)
from triage.probes import _support, shape_trace as shape_trace_module
from triage.probes.context import ProbeContext
from triage.probes.cpu_rerun import cpu_rerun
from triage.probes.index_range import index_range
from triage.probes.shape_trace import shape_trace


def _cuda_context(model, batch, tmp_path, **extra) -> ProbeContext:
    """A device-side assert seen at `loss.item()`, with the model's CUDA inputs unreadable (meta stands in)."""
    incident, exc = simulated_cuda_incident()
    ids = batch[0]
    return ProbeContext(incident=incident, exception=exc, model=model, batch=batch, batch_index=4, step=4,
                        report_dir=tmp_path, loss_fn=nn.CrossEntropyLoss(),
                        model_args=(torch.empty(ids.shape, dtype=ids.dtype, device="meta"),), **extra)


def test_cpu_rerun_turns_a_device_side_assert_into_the_embedding_index_error(tmp_path):
    torch.manual_seed(0)
    model = TextModel(vocab=10)
    ids = torch.tensor([[1, 2, 3], [4, 12, 5]])  # 12 >= num_embeddings=10: the real bug, in the data
    batch = (ids, torch.tensor([0, 2]))
    ctx = dataclasses.replace(_cuda_context(model, batch, tmp_path), diagnosis=diagnosis("cuda-assert"))
    guard = StateGuard(model, allowed=tmp_path)
    outcome = cpu_rerun(ctx)
    guard.assert_unchanged()
    assert outcome.status == "confirmed"
    assert outcome.facts["module"] == "encoder.embed"
    assert outcome.facts["exception"] == "IndexError"
    assert "index out of range in self" in outcome.detail
    assert "encoder.embed (Embedding)" in outcome.detail
    assert "h = self.embed(ids)" in outcome.detail  # the user's line, not the line the GPU reported
    assert any("taken from the batch" in note for note in outcome.facts["inputs"])


def test_cpu_rerun_finds_a_label_out_of_range_in_the_loss_after_a_cuda_assert(tmp_path):
    model = TextModel(vocab=10, classes=3)
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    labels = torch.tensor([0, 3])  # 3 classes: label 3 is out of range
    ctx = _cuda_context(model, (ids, labels), tmp_path)
    # The loss was called with the logits (unreadable on the device) and the labels.
    ctx.loss_args = (torch.empty(2, 3, device="meta"), torch.empty(2, dtype=torch.long, device="meta"))
    outcome = cpu_rerun(ctx)
    assert outcome.status == "confirmed"
    assert outcome.facts["exception"] == "IndexError"
    assert "Target 3 is out of bounds" in outcome.detail
    assert "loss" in outcome.detail


def test_cpu_rerun_refutes_a_cuda_assert_when_the_batch_is_clean(tmp_path):
    model = TextModel(vocab=10)
    ctx = _cuda_context(model, (torch.tensor([[1, 2], [3, 4]]), torch.tensor([0, 1])), tmp_path)
    outcome = cpu_rerun(ctx)
    assert outcome.status == "refuted"
    assert "the model and the loss run without error" in outcome.detail


def test_cpu_rerun_reproduces_a_cpu_shape_error_deterministically():
    model = ConvNet()
    images = torch.randn(2, 3, 10, 10)  # 10x10 instead of 8x8
    exc = raised(model, images)
    ctx = live_context(exc, model=model, batch=(images, torch.tensor([1, 2])))
    assert ctx.module is model.fc1 and ctx.model is model
    guard = StateGuard(model)
    outcome = cpu_rerun(ctx)
    guard.assert_unchanged()
    assert outcome.status == "confirmed"
    assert outcome.facts["module"] == "fc1"
    assert "2x1024 and 256x10" in outcome.detail


def test_cpu_rerun_confirms_a_device_mismatch_by_running_cleanly_on_one_device():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.scale = torch.ones(4)  # a plain attribute: .to() leaves it behind

        def forward(self, x):
            return self.fc(x) * self.scale

    model = Scaled().to("meta")  # stands in for .cuda(): parameters move, the attribute stays on the CPU
    x = torch.empty(2, 4, device="meta")
    exc = raised(model, x)
    assert "device" in str(exc)
    ctx = dataclasses.replace(live_context(exc), diagnosis=diagnosis("device"))
    outcome = cpu_rerun(ctx)
    assert outcome.status == "confirmed"
    assert outcome.detail.startswith("with every tensor on the CPU the model runs without error")


def test_cpu_rerun_skips_without_a_live_model():
    incident, exc = simulated_cuda_incident()
    outcome = cpu_rerun(ProbeContext(incident=incident, exception=exc))
    assert outcome.status == "skipped"
    assert "no live model" in outcome.detail


def test_cpu_rerun_skips_a_device_model_over_the_copy_limit(monkeypatch, tmp_path):
    monkeypatch.setattr(_support, "MAX_COPY_BYTES", 100)
    model = TextModel().to("meta")  # stands in for an unreadable CUDA model: its zeros would be made on the CPU
    ctx = _cuda_context(model, (torch.tensor([[1, 2]]), torch.tensor([0])), tmp_path)
    outcome = cpu_rerun(ctx)
    assert outcome.status == "skipped"
    assert "over the" in outcome.detail and "GB a probe copies" in outcome.detail


def test_index_range_names_the_embedding_the_value_and_its_position(tmp_path):
    model = TextModel(vocab=10)
    ids = torch.tensor([[1, 2, 3], [4, 12, 5]])
    ctx = _cuda_context(model, (ids, torch.tensor([0, 2])), tmp_path)
    guard = StateGuard(model, allowed=tmp_path)
    outcome = index_range(ctx)
    guard.assert_unchanged()
    assert outcome.status == "confirmed"
    assert "input of encoder.embed (Embedding)" in outcome.detail
    assert "num_embeddings=10" in outcome.detail
    assert "1 of 6 values outside [0, 10): 12 at [1, 1]" in outcome.detail


def test_index_range_checks_targets_against_the_class_count():
    model = TextModel(vocab=10, classes=3)
    ids = torch.tensor([[1, 2], [3, 4], [5, 6]])
    labels = torch.tensor([0, 3, -1])
    loss_fn = nn.CrossEntropyLoss()
    exc = raised(lambda: loss_fn(model(ids), labels))
    ctx = live_context(exc, model=model, batch=(ids, labels), loss_fn=loss_fn)
    outcome = index_range(ctx)
    assert outcome.status == "confirmed"
    assert "target of CrossEntropyLoss" in outcome.detail
    assert "2 of 3 values outside [0, 3): 3 at [1], -1 at [2]" in outcome.detail


def test_index_range_reports_the_ranges_that_choose_a_cause(tmp_path):
    # Rules choose between causes by these facts: 1..C labels are 1-based, ids a little past the table a grown vocabulary.
    model = TextModel(vocab=10, classes=3)
    ids = torch.tensor([[1, 2], [3, 4], [5, 6]])
    labels = torch.tensor([1, 3, -100])  # -100 is the loss's ignore_index: left out of the range
    loss_fn = nn.CrossEntropyLoss()
    exc = raised(lambda: loss_fn(model(ids), labels))
    facts = index_range(live_context(exc, model=model, batch=(ids, labels), loss_fn=loss_fn)).facts
    assert (facts["target_min"], facts["target_max"], facts["classes"]) == (1, 3, 3)
    ctx = _cuda_context(model, (torch.tensor([[1, 2, 3], [4, 12, 5]]), torch.tensor([0, 2])), tmp_path)
    facts = index_range(ctx).facts
    assert (facts["ids_min"], facts["ids_max"], facts["num_embeddings"]) == (1, 12, 10)
    assert facts["embedding"] == "encoder.embed (Embedding)"


def test_index_range_refutes_when_every_index_fits(tmp_path):
    model = TextModel(vocab=10, classes=3)
    ctx = _cuda_context(model, (torch.tensor([[1, 9]]), torch.tensor([2])), tmp_path)
    outcome = index_range(ctx)
    assert outcome.status == "refuted"
    assert "in [1, 9] vs num_embeddings=10" in outcome.detail


def test_index_range_replays_a_dict_batch_with_one_input():
    model = TextModel(vocab=10, classes=3)
    incident, exc = simulated_cuda_incident()
    batch = {"input_ids": torch.tensor([[1, 10]]), "labels": torch.tensor([1])}
    outcome = index_range(ProbeContext(incident=incident, exception=exc, model=model, batch=batch))
    assert outcome.status == "confirmed"
    assert "input of encoder.embed (Embedding) (num_embeddings=10): 1 of 2 values outside [0, 10): 10 at [0, 1]" \
        in outcome.detail


def test_index_range_without_a_replay_checks_the_batch_against_the_model():
    model = TextModel(vocab=10, classes=3)
    incident, exc = simulated_cuda_incident()
    # Two inputs the model's forward(ids) cannot take by name: no replay, the batch is checked directly.
    batch = {"input_ids": torch.tensor([[1, 2]]), "mask": torch.tensor([[1, 1]]), "labels": torch.tensor([5])}
    outcome = index_range(ProbeContext(incident=incident, exception=exc, model=model, batch=batch))
    assert outcome.status == "confirmed"
    assert "batch['labels'] (targets) (out_features=3 of head (Linear)): 1 of 1 values outside [0, 3): 5 at [0]" in outcome.detail
    assert "input_ids" not in outcome.facts["offending"]


def test_shape_trace_names_the_layer_and_the_arithmetic(tmp_path):
    model = ConvNet()
    images = torch.randn(2, 3, 10, 10)
    exc = raised(model, images)
    ctx = live_context(exc, model=model, batch=(images, torch.tensor([1, 2])), report_dir=tmp_path)
    guard = StateGuard(model, allowed=tmp_path)
    outcome = shape_trace(ctx)
    guard.assert_unchanged()
    assert outcome.status == "confirmed"
    assert "conv3 outputs 64×4×4 = 1024 features per sample; fc1 expects 256" in outcome.detail
    assert "nn.Linear(1024, 10)" in outcome.detail
    assert any(line.startswith("conv2 (Conv2d): [2, 16, 8, 8] -> [2, 32, 6, 6]") for line in outcome.facts["trace"])
    trace_file = tmp_path / "shape_trace.txt"
    assert outcome.artifacts == [str(trace_file)] and "fc1 (Linear): [2, 1024] -> raised" in trace_file.read_text()


def test_shape_trace_explains_a_channel_mismatch():
    model = ConvNet()
    gray = torch.randn(2, 1, 8, 8)
    exc = raised(model, gray)
    outcome = shape_trace(live_context(exc, model=model, batch=gray))
    assert outcome.status == "confirmed"
    assert "1 channels; conv1 expects in_channels=3" in outcome.detail


def test_shape_trace_on_the_meta_device_for_large_models(monkeypatch):
    monkeypatch.setattr(shape_trace_module, "META_ABOVE_BYTES", 0)
    model = ConvNet()
    images = torch.randn(2, 3, 10, 10)
    exc = raised(model, images)
    outcome = shape_trace(live_context(exc, model=model, batch=images))
    assert outcome.facts["device"] == "meta"
    assert outcome.status == "confirmed"
    assert "conv3 outputs 64×4×4 = 1024 features" in outcome.detail


def test_shape_trace_refutes_when_the_shapes_flow():
    model = ConvNet()
    images = torch.randn(2, 3, 8, 8)
    outcome = shape_trace(ProbeContext(incident=simulated_cuda_incident()[0], model=model, batch=(images,)))
    assert outcome.status == "refuted"
    assert "output [2, 10]" in outcome.detail


def test_shape_trace_skips_a_size_error_raised_outside_the_model_and_the_loss():
    # A metric after the step (`pred.view(...)` of a transposed tensor): the model runs on the batch, which says nothing
    # about the metric's line; refuting the shape diagnosis there was wrong
    model = ConvNet()
    images = torch.randn(2, 3, 8, 8)

    def accuracy(logits):
        return logits.t().view(-1)

    exc = raised(lambda: accuracy(model(images)))
    outcome = shape_trace(live_context(exc, model=model, batch=(images,)))
    assert outcome.status == "skipped", outcome.detail
    assert "outside every module call and the loss" in outcome.detail and "in accuracy" in outcome.detail
    # a size error inside the model's own call is still the replay's to decide (here: reproduced, confirmed)
    inside = raised(model, torch.randn(2, 3, 10, 10))
    assert shape_trace(live_context(inside, model=model, batch=(images,))).status == "confirmed"


@pytest.mark.parametrize("probe", [cpu_rerun, index_range, shape_trace])
def test_probes_leave_dropout_rng_and_train_mode_alone(probe, tmp_path):
    torch.manual_seed(1)
    model = TextModel(vocab=10).train()
    ctx = _cuda_context(model, (torch.tensor([[1, 2, 11]]), torch.tensor([0])), tmp_path)
    guard = StateGuard(model, allowed=tmp_path)
    probe(ctx)
    guard.assert_unchanged()


SIMULATED_GPU_STEP = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

CUDA_ASSERT = {assert_text!r}

generator = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 8, generator=generator), torch.randint({low}, {high}, (64,), generator=generator))
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 10))


def gpu_cross_entropy(logits, labels):
    if labels.max() >= logits.shape[1]:  # what the GPU does: the kernel asserts, a later call raises
        raise torch.AcceleratorError(CUDA_ASSERT)
    return nn.functional.cross_entropy(logits, labels)


for features, labels in DataLoader(data, batch_size=16):
    loss = gpu_cross_entropy(model(features), labels)
    loss.backward()
'''


@pytest.mark.parametrize(("low", "high", "cause", "fact"), [
    (1, 11, "one-based-labels", "labels 1..10 (no 0) for 10 outputs"),
    (0, 12, "head-too-small", "labels 0..11 for a model with 10 outputs"),
])
def test_a_live_device_side_assert_without_its_assertion_line_gets_its_cause_from_the_batch(tmp_path, low, high, cause, fact):
    # On a GPU the kernel's `Assertion ... failed.` lines reach the process's stderr, outside the traceback triage
    # captures (seen on an H100): the index_range experiment reads the saved batch's labels against the head instead.
    script = tmp_path / "train.py"
    script.write_text(SIMULATED_GPU_STEP.format(assert_text=CUDA_ASSERT, low=low, high=high))
    done = subprocess.run([sys.executable, "-m", "triage", "--report-dir", str(tmp_path / "report"), "--json",
                           str(tmp_path / "report.json"), str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    leading = json.loads((tmp_path / "report.json").read_text())["diagnoses"][0]
    assert leading["cause"] == f"cuda-assert.device-side-assert/{cause}", leading["hypothesis"]
    assert leading["cause_basis"] == "evidence"
    assert fact in leading["hypothesis"]


KERNEL_ASSERTION = ("/pytorch/aten/src/ATen/native/cuda/Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: "
                    "block: [0,0,0], thread: [{thread},0,0] Assertion `t >= 0 && t < n_classes` failed.\n")


def test_a_device_side_assert_reads_the_kernels_assertion_back_from_the_stderr_log(tmp_path):
    # The CUDA runtime writes the assertion to stderr (seen on an H100); a job's log file holds it. Only what this
    # run wrote counts: the log's earlier lines (another run's assertion on an embedding) are not read.
    script = tmp_path / "train.py"
    source = SIMULATED_GPU_STEP.format(assert_text=CUDA_ASSERT, low=1, high=11)
    source = source.replace("        raise torch.AcceleratorError", "        import os\n" + "".join(
        f"        os.write(2, {KERNEL_ASSERTION.format(thread=t).encode()!r})\n" for t in (1, 14, 19))
        + "        raise torch.AcceleratorError")
    assert "os.write(2" in source
    script.write_text(source)
    log = tmp_path / "train.log"
    log.write_text(ASSERT_LINE + "\n")
    with open(log, "a") as stderr:
        done = subprocess.run([sys.executable, "-m", "triage", "--report-dir", str(tmp_path / "report"), "--json",
                               str(tmp_path / "report.json"), str(script)], cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=stderr, timeout=120)
    assert done.returncode == 1, log.read_text()[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["incident"]["log_lines"][0] == KERNEL_ASSERTION.format(thread=1).strip()  # one per distinct check
    assert not any("srcSelectDimSize" in line or "thread: [14" in line for line in report["incident"]["log_lines"])
    leading = report["diagnoses"][0]
    assert leading["rule"] == "cuda-assert.class-label-out-of-range", leading["title"]
    assert leading["cause"] == "cuda-assert.class-label-out-of-range/one-based-labels"
