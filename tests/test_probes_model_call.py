"""The probes replay the model call the script really made, as the runner's hooks recorded it.

Each test runs a real small model the way public training code calls it (the text-classification tutorial's
EmbeddingBag model with text and offsets, the DCGAN example's two networks, a model called with keyword
arguments), with the runner's call recorder installed, lets the real failure happen, and checks what the
experiment replayed and concluded.
"""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from _model_call_models import NZ, Discriminator, Generator, TextClassificationModel, TinyTagger, text_batch
from _probe_fixtures import StateGuard, isolated, live_context, raised
from triage.probes.calls import recorded_model_call
from triage.probes.index_range import index_range
from triage.probes.shape_trace import shape_trace
from triage.runner.hooks import record_outer_calls
from triage.tracking import MAX_OUTER_CALLS, Tracker


@pytest.fixture
def recorded():
    """A Tracker fed by the runner's call recorder, as under `python -m triage`."""
    tracker = Tracker()
    undo = record_outer_calls(tracker)
    try:
        yield tracker
    finally:
        undo()


def failure(step) -> BaseException:
    return raised(step)


# ---------------------------------------------------------------------------- the recorder


def test_the_recorder_keeps_the_outermost_call_by_reference_and_skips_nested_ones(recorded):
    model = TinyTagger()
    ids, mask = torch.tensor([[1, 2, 3]]), torch.ones(1, 3)
    out = model(input_ids=ids, attention_mask=mask)
    calls = recorded.latest_calls()
    assert [c.module for c in calls] == [model]  # the embedding and the head ran inside: not recorded
    assert calls[0].args == () and calls[0].kwargs["input_ids"] is ids and calls[0].kwargs["attention_mask"] is mask
    assert calls[0].output() is out


def test_a_call_that_raises_is_recorded_and_the_next_one_is_outermost_again(recorded):
    model = TextClassificationModel()
    bad = torch.tensor([99])  # past the vocabulary
    raised(model, bad, torch.tensor([0]))
    assert recorded.latest_calls()[-1].args[0] is bad and recorded.call_depth == 0
    loss_fn = nn.CrossEntropyLoss()
    loss_fn(torch.randn(2, 4), torch.tensor([0, 1]))
    assert [type(c.module).__name__ for c in recorded.latest_calls()] == ["TextClassificationModel", "CrossEntropyLoss"]


def test_the_recorder_lets_go_of_dropped_models_and_keeps_a_few_modules(recorded):
    for _ in range(MAX_OUTER_CALLS + 3):
        nn.Linear(2, 2)(torch.randn(1, 2))
    gc.collect()
    assert recorded.latest_calls() == []  # every model was dropped: nothing of theirs is kept alive
    kept = [nn.Linear(2, 2) for _ in range(MAX_OUTER_CALLS + 2)]
    for layer in kept:
        layer(torch.randn(1, 2))
    assert [c.module for c in recorded.latest_calls()] == kept[-MAX_OUTER_CALLS:]


def test_after_the_first_step_only_the_classes_called_from_outside_carry_the_recorder(recorded):
    model, criterion = nn.Sequential(nn.Linear(4, 3), nn.ReLU()), nn.CrossEntropyLoss()
    x, y = torch.randn(2, 4), torch.tensor([0, 2])
    criterion(model(x), y)
    recorded.steps = 1  # the runner's optimizer hook counts the step
    criterion(model(x), y)
    assert nn.Module.__call__.__module__ == "torch.nn.modules.module"
    assert "__call__" in vars(nn.Sequential) and "__call__" in vars(nn.CrossEntropyLoss)
    assert "__call__" not in vars(nn.Linear) and "__call__" not in vars(nn.ReLU)
    x2 = torch.randn(2, 4)
    model(x2)
    assert recorded.latest_calls()[-1].args[0] is x2


def test_the_recorder_is_quiet_while_a_probe_replays_and_undo_restores_torch():
    tracker = Tracker()
    original = nn.Module.__call__
    undo = record_outer_calls(tracker)
    tracker.suspended = 1
    nn.Linear(2, 2)(torch.randn(1, 2))
    assert tracker.outer_calls == {}
    undo()
    assert nn.Module.__call__ is original and not tracker.calls_recorded and "__call__" not in vars(nn.Linear)


def test_a_compiled_model_still_compiles_in_one_graph_and_its_call_is_recorded(recorded):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    x = torch.randn(2, 4)
    assert torch.equal(compiled(x), model(x))
    assert any(c.args and c.args[0] is x for c in recorded.latest_calls())


@pytest.mark.filterwarnings("ignore:Using a target size")
def test_the_model_whose_output_the_failing_call_got_wins_over_a_later_one(recorded):
    student, teacher = nn.Linear(4, 3), nn.Linear(4, 5)
    x = torch.randn(2, 4)

    def step():
        predicted = student(x)
        teacher(x)  # called later, but not what the loss got
        return F.mse_loss(predicted, torch.randn(2, 4))

    exc = failure(step)
    assert recorded_model_call(recorded, exc)[0].module is student


# ---------------------------------------------------------------------------- the probes replay the real call


def test_index_range_replays_text_and_offsets_and_measures_one_based_labels(recorded):
    """The tutorial's AG_NEWS labels run 1..4; forgetting `label - 1` fails in cross_entropy, outside the model."""
    model, criterion = TextClassificationModel(num_class=4), nn.CrossEntropyLoss()
    batch = text_batch([1, 4, 2, 3])
    recorded.batch = batch  # the label comes first: the batch alone would feed the label to the model
    label, text, offsets = batch
    exc = failure(lambda: criterion(model(text, offsets), label))
    ctx = live_context(exc, recorded)
    assert ctx.model is model and ctx.model_args[0] is text and ctx.model_args[1] is offsets
    guard = StateGuard(model)
    outcome = isolated(index_range, ctx)
    guard.assert_unchanged()
    assert outcome.status == "confirmed", outcome.detail
    assert "target of CrossEntropyLoss" in outcome.detail and "4 at [1]" in outcome.detail
    facts = outcome.facts
    assert (facts["target"], facts["target_min"], facts["target_max"], facts["classes"]) == \
        ("target of CrossEntropyLoss", 1, 4, 4)
    assert (facts["ids"], facts["ids_min"], facts["ids_max"], facts["num_embeddings"]) == \
        ("input of embedding (EmbeddingBag)", int(text.min()), int(text.max()), 50)


def test_shape_trace_feeds_an_embeddingbag_model_both_its_arguments(recorded):
    """Labels kept as a column ([B, 1]) fail in the loss; the replay must reach it through model(text, offsets)."""
    model, criterion = TextClassificationModel(), nn.CrossEntropyLoss()
    label, text, offsets = text_batch([0, 3, 1, 2])
    recorded.batch = (label.unsqueeze(1), text, offsets)
    exc = failure(lambda: criterion(model(text, offsets), label.unsqueeze(1)))
    outcome = isolated(shape_trace, live_context(exc, recorded))
    assert outcome.status == "confirmed", outcome.detail
    assert outcome.detail.startswith("the loss raises RuntimeError: 0D or 1D target tensor expected")
    assert outcome.facts["model_inputs"] == "call" and "taken from the batch" not in outcome.detail
    assert f"embedding (EmbeddingBag): [{len(text)}], [4] -> [4, 16]" in outcome.facts["trace"]
    assert (outcome.facts["layer_class"], outcome.facts["input_shape"], outcome.facts["target_shape"]) == \
        ("CrossEntropyLoss", [4, 4], [4, 1])


def test_without_a_record_the_probe_says_why_it_cannot_call_an_embeddingbag_model():
    """The loop's own code fails after the model returned: only the model's call can be replayed, and no record
    of it exists (a script with its own `triage.install()`): the batch's first tensor is the label."""
    model = TextClassificationModel()
    label, text, offsets = text_batch([0, 3, 1, 2])
    exc = failure(lambda: model(text, offsets).view(3, -1))
    outcome = isolated(shape_trace, live_context(exc, Tracker(model=model, batch=(label, text, offsets))))
    assert outcome.status == "skipped"
    assert outcome.detail.startswith("TextClassificationModel.forward(text, offsets) cannot take the batch's Long[4]")
    assert "no call of the model was recorded" in outcome.detail


def test_a_dcgan_discriminator_is_replayed_on_fakes_and_the_generator_never_sees_real_images(recorded):
    """The discriminator's output left [B, 1, 1, 1] fails in BCELoss. The last optimizer stepped was the generator's,
    whose parameters a guess would follow, feeding it the batch of real images."""
    netG, netD, criterion = Generator(), Discriminator(flatten=False), nn.BCELoss()
    optimizerG = torch.optim.Adam(netG.parameters())
    real = torch.randn(4, 3, 16, 16)
    recorded.batch, recorded.optimizer = [real, torch.zeros(4)], optimizerG

    def generator_step():
        fake = netG(torch.randn(4, NZ, 1, 1))
        output = netD(fake)
        return criterion(output, torch.full((4,), 1.0))

    exc = failure(generator_step)
    ctx = live_context(exc, recorded)
    assert ctx.model is netD and ctx.model_args[0].shape == (4, 3, 16, 16) and ctx.model_args[0] is not real
    guard = StateGuard(netG, netD)
    outcome = isolated(shape_trace, ctx)
    guard.assert_unchanged()
    assert outcome.status == "confirmed", outcome.detail
    assert outcome.detail.startswith("the loss raises ValueError: Using a target size (torch.Size([4])) that is "
                                     "different to the input size (torch.Size([4, 1, 1, 1]))")
    assert not any("ConvTranspose2d" in line for line in outcome.facts["trace"])
    assert outcome.facts["input_shape"] == [4, 1, 1, 1] and outcome.facts["target_shape"] == [4]


def test_a_model_called_with_keyword_arguments_is_replayed_with_them(recorded):
    """Per-token logits [B, T, C] given to cross_entropy with [B, T] labels: the class dimension must be 1."""
    model, criterion = TinyTagger(tags=5), nn.CrossEntropyLoss()
    ids, mask, labels = torch.randint(0, 30, (2, 6)), torch.ones(2, 6), torch.randint(0, 5, (2, 6))
    recorded.batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    exc = failure(lambda: criterion(model(input_ids=ids, attention_mask=mask), labels))
    ctx = live_context(exc, recorded)
    assert ctx.model_args == () and ctx.model_kwargs["attention_mask"] is mask
    outcome = isolated(shape_trace, ctx)
    assert outcome.status == "confirmed", outcome.detail
    assert "the loss raises RuntimeError: Expected target size [2, 5], got [2, 6]" in outcome.detail
    assert outcome.facts["trace"][0].startswith("embed (Embedding): [2, 6] -> [2, 6, 8]")
    assert outcome.facts["input_shape"] == [2, 6, 5] and outcome.facts["target_shape"] == [2, 6]


def test_a_model_never_called_before_the_failure_is_not_replayed_on_a_guess(recorded):
    model = TinyTagger()
    recorded.model, recorded.batch = model, (torch.randint(0, 30, (2, 6)), torch.zeros(2))
    exc = failure(lambda: torch.zeros(3).view(2, 2))  # the loop fails before it calls the model
    outcome = isolated(shape_trace, live_context(exc, recorded))
    assert outcome.status == "skipped"
    assert outcome.detail == "no call of TinyTagger was recorded before the failure, so there is none to replay"


def test_shape_trace_facts_name_the_layer_its_sizes_and_the_producer(recorded):
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
    images = torch.randn(2, 1, 10, 10)
    exc = failure(lambda: model(images))
    facts = isolated(shape_trace, live_context(exc, recorded)).facts
    assert {k: facts[k] for k in ("layer_path", "layer_class", "expects", "in_features", "received", "producer",
                                  "producer_class", "producer_shape", "input_shape")} == {
        "layer_path": "3", "layer_class": "Linear", "expects": "in_features", "in_features": 144, "received": 256,
        "producer": "2", "producer_class": "Flatten", "producer_shape": [2, 256], "input_shape": [2, 256]}


def test_a_guess_from_the_batch_is_said_to_be_one():
    """No record (a script with its own `triage.install()`) and a forward that takes the batch's first tensor."""
    model = nn.Sequential(nn.Linear(4, 3))
    x = torch.randn(2, 4)
    exc = failure(lambda: model(x).view(4, -1))
    outcome = isolated(shape_trace, live_context(exc, Tracker(model=model, batch=(x, torch.zeros(2)))))
    # (the .view outside the model is not the replay's to decide: skipped, not refuted)
    assert outcome.status == "skipped" and outcome.facts["model_inputs"] == "batch"
    assert outcome.detail.endswith("(no call of Sequential was recorded: its inputs were taken from the batch)")


def test_a_failure_in_backward_gets_the_recorded_model_and_loss_calls(recorded):
    model, criterion = TextClassificationModel(), nn.CrossEntropyLoss()
    label, text, offsets = text_batch([0, 3, 1, 2])

    def step():
        loss = criterion(model(text, offsets), label)
        loss.backward()
        loss.backward()  # the graph is already freed

    exc = failure(step)
    assert "backward through the graph a second time" in str(exc)
    ctx = live_context(exc, recorded)
    assert ctx.model is model and ctx.model_args[0] is text and ctx.model_args[1] is offsets
    assert ctx.loss_fn is criterion and ctx.loss_args[1] is label


def test_a_step_that_chains_modules_is_not_replayed_from_its_last_call(recorded):
    """`head(blocks(embed(tokens)))` with an in-place residual in `blocks`: backward fails after all three
    returned. Replaying `head` alone would run cleanly and refute a true cause: the probe says why it cannot."""

    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(8)
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            x += self.fc(self.norm(x))  # the bug: LayerNorm saved x for its backward
            return x

    embed, blocks, head = nn.Embedding(20, 8), Residual(), nn.Linear(8, 20)
    tokens = torch.randint(0, 20, (2, 5))
    exc = failure(lambda: head(blocks(embed(tokens))).sum().backward())
    assert "modified by an inplace operation" in str(exc)
    ctx = live_context(exc, recorded)
    assert ctx.model_args is None
    assert ctx.model_call_note.startswith("the step chains modules (Embedding → Residual → Linear)")
    outcome = isolated(shape_trace, ctx)
    assert outcome.status == "skipped" and outcome.detail == ctx.model_call_note


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_model_called_several_times_in_the_step_is_not_replayed_from_its_last_call(recorded):
    """A triplet loss over one encoder: the NaN gradient of sqrt(0) needs all three calls, the last one is not it."""
    encoder = nn.Linear(4, 3)
    samples = torch.randn(3, 4)

    def step():
        anchor, positive, negative = (encoder(samples) for _ in range(3))
        distance = ((anchor - positive) ** 2).sum(1).sqrt() - ((anchor - negative) ** 2).sum(1).sqrt()
        with torch.autograd.detect_anomaly():
            distance.relu().mean().backward()

    exc = failure(step)
    assert "returned nan values" in str(exc)
    ctx = live_context(exc, recorded)
    assert ctx.model_args is None
    assert ctx.model_call_note.startswith("Linear was called 3 times since the last optimizer step")


def test_a_step_with_two_models_is_not_replayed_from_the_last_one(recorded):
    """Distillation: the loss needs the teacher's and the student's outputs; the loop's own guard raises."""
    teacher, student = nn.Linear(4, 3), nn.Linear(4, 3)
    x = torch.randn(2, 4)

    def step():
        with torch.no_grad():
            target = teacher(x) / 0.0
        loss = (student(x) - target).pow(2).mean()
        if not torch.isfinite(loss):
            raise FloatingPointError("loss is not finite")

    ctx = live_context(failure(step), recorded)
    assert ctx.model_args is None
    assert ctx.model_call_note.startswith("the step calls several modules (Linear, Linear)")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_loss_written_as_plain_code_is_not_replaced_by_the_models_output_sum(recorded):
    """A hand-written BCE on saturated sigmoids: NaN in LogBackward. The model's call alone, with the sum of its
    output for a loss, runs cleanly; the probes must not conclude from that."""
    model = nn.Linear(4, 1)
    with torch.no_grad():
        model.bias.fill_(40.0)
    x, y = torch.randn(8, 4), torch.ones(8, 1)

    def step():
        p = torch.sigmoid(model(x))
        with torch.autograd.detect_anomaly():
            (-(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()).backward()

    ctx = live_context(failure(step), recorded)
    assert ctx.model_args is None
    assert ctx.model_call_note.startswith("the failure came after Linear returned, and the loss is no module")
