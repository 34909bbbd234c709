"""Fix trials on real failing steps: each fix is verified on its own bug, and fails or is not tried where it does not
apply; the user's objects stay as they were (the trials run in a forked child)."""

from __future__ import annotations

import importlib.util
import io
import sys
import textwrap

import pytest
import torch
from torch import nn

from _probe_fixtures import StateGuard, live_context, raised
from triage.diagnosis import Diagnosis, Fix
from triage.probes.fix_trials import TRIALS, order_fixes, run_trial, try_fixes
from triage.probe_registry import FIX_TRIALS
from triage.tracking import Tracker

SCRIPT = '''
import dataclasses

import torch
from torch import nn
from torch.nn import functional as F


class ConvNet(nn.Module):
    """Built for 8x8 images: fc1 expects 64x2x2 = 256 features."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3)
        self.conv2 = nn.Conv2d(16, 32, 3)
        self.conv3 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(256, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.conv3(x).flatten(1)
        return self.fc1(x)


class Classifier(nn.Module):
    def __init__(self, features=4, classes=10):
        super().__init__()
        self.body = nn.Linear(features, 16)
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 5, batch_first=True)
        self.out = nn.Linear(5, 1)

    def forward(self, x, state):
        y, _ = self.lstm(x, state)
        return self.out(y[:, -1])


class Sequence64(nn.Module):
    """time_sequence_prediction's shape: the LSTMCell's state is made in float64 inside forward."""

    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(1, 8)
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        h = torch.zeros(x.size(0), 8, dtype=torch.double)
        c = torch.zeros(x.size(0), 8, dtype=torch.double)
        for t in range(x.size(1)):
            h, c = self.cell(x[:, t:t + 1], (h, c))
        return self.out(h)


class Scorer(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1), nn.Sigmoid())

    def forward(self, x):
        return self.net(x)


class Patches(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(12, 10)

    def forward(self, x):
        b = x.size(0)
        x = x.transpose(1, 2).view(b, -1)
        return self.proj(x)


def gated(features=4):
    return nn.Sequential(nn.Linear(features, 8), nn.ReLU(inplace=True), nn.Linear(8, 8), nn.Sigmoid(),
                         nn.ReLU(inplace=True), nn.Linear(8, 3))


@dataclasses.dataclass
class Config:
    lr: float = 0.1
    layers: int = 2


def train_functional(model, optimizer, data):
    for x, y in data:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def rnn_train(model, optimizer, data):
    hidden = torch.zeros(1, 2, 6)
    for x, y in data:
        out, hidden = model(x, hidden)
        loss = ((out[:, -1] - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def gan_train(net_g, net_d, opt_g, opt_d, data):
    criterion = nn.BCELoss()
    for real in data:
        noise = torch.randn(real.size(0), 2)
        fake = net_g(noise)
        opt_d.zero_grad()
        err_d = criterion(net_d(real), torch.ones(real.size(0), 1)) + criterion(net_d(fake), torch.zeros(real.size(0), 1))
        err_d.backward()
        opt_d.step()
        opt_g.zero_grad()
        err_g = criterion(net_d(fake), torch.ones(real.size(0), 1))
        err_g.backward()
        opt_g.step()
'''


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("user") / "train_script.py"
    path.write_text(textwrap.dedent(SCRIPT))
    spec = importlib.util.spec_from_file_location("train_script", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_script"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("train_script", None)


def _line(module, text: str) -> int:
    lines = open(module.__file__).read().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def trial(name, ctx, **values):
    return run_trial(name, ctx, values, limit_s=60)


def step_context(model, batch, loss_fn):
    """The failing step `loss_fn(model(x), y).backward()` as the runner sees it: the exception, the model, the batch
    and the loss."""
    x, y = batch
    exc = raised(lambda: loss_fn(model(x), y).backward())
    return live_context(exc, model=model, batch=batch, loss_fn=loss_fn)


# ---------------------------------------------------------------------------- layer sizes


def test_resize_linear_in_verifies_the_size_the_conv_stack_gives(script, tmp_path):
    torch.manual_seed(0)
    model = script.ConvNet()
    ctx = step_context(model, (torch.randn(2, 3, 10, 10), torch.tensor([1, 2])), nn.CrossEntropyLoss())
    guard = StateGuard(model, folder=tmp_path)
    outcome = trial("resize-linear-in", ctx, got="1024", want="256")
    guard.assert_unchanged()
    assert outcome.verdict == "verified", outcome.detail
    assert outcome.detail.startswith("with nn.Linear(1024, 10) as fc1 the step runs with its backward and the loss is ")
    assert model.fc1.in_features == 256  # the user's model is untouched


def test_resize_linear_in_fails_when_the_labels_are_wrong_too(script):
    model = script.ConvNet()
    ctx = step_context(model, (torch.randn(2, 3, 10, 10), torch.tensor([1, 12])), nn.CrossEntropyLoss())
    outcome = trial("resize-linear-in", ctx)
    assert (outcome.verdict, outcome.detail) == ("fails", "IndexError: Target 12 is out of bounds.")


def test_resize_head_gives_the_classifier_one_output_per_label(script):
    model = script.Classifier(classes=10)
    ctx = step_context(model, (torch.randn(4, 4), torch.tensor([1, 10, 3, 7])), nn.CrossEntropyLoss())
    outcome = trial("resize-head", ctx)
    assert outcome.verdict == "verified", outcome.detail
    assert outcome.detail.startswith("with nn.Linear(16, 11) as head (labels reach 10) the step runs")


def test_resize_embedding_grows_the_table_past_the_largest_id(script):
    from _probe_fixtures import TextModel

    model = TextModel(vocab=10, classes=3)
    ids = torch.tensor([[1, 2, 3], [4, 12, 5]])
    ctx = step_context(model, (ids, torch.tensor([0, 2])), nn.CrossEntropyLoss())
    outcome = trial("resize-embedding", ctx)
    assert outcome.verdict == "verified", outcome.detail
    assert outcome.detail.startswith("with nn.Embedding(13, 8) as encoder.embed the step runs")
    assert trial("resize-linear-in", ctx).verdict == "not tried"


# ---------------------------------------------------------------------------- labels and targets


def test_one_based_labels_are_fixed_by_shifting_them(script):
    model = script.Classifier(classes=10)
    labels = torch.tensor([1, 10, 3, 7])
    ctx = step_context(model, (torch.randn(4, 4), labels), nn.CrossEntropyLoss())
    outcome = trial("shift-labels", ctx)
    assert outcome.verdict == "verified", outcome.detail
    assert outcome.detail.startswith("with labels - 1 (now 0..9) the step runs with its backward and the loss is ")
    assert labels.tolist() == [1, 10, 3, 7]
    assert trial("ignore-index", ctx, target="10").detail.startswith(
        "with CrossEntropyLoss(ignore_index=10) the step runs")
    not_floats = trial("target-long", ctx)
    assert (not_floats.verdict, not_floats.detail) == ("not tried", "the target is already int64")


def test_a_functional_loss_in_the_loop_is_replayed_from_the_loop_s_statements(script):
    model = script.Classifier(classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = (torch.randn(4, 4), torch.tensor([1, 10, 3, 7]))
    exc = raised(script.train_functional, model, optimizer, [batch])
    ctx = live_context(exc, model=model, batch=batch)  # F.cross_entropy: no loss call was recorded
    shifted = trial("shift-labels", ctx)
    assert shifted.verdict == "verified", shifted.detail
    assert shifted.detail.startswith("with labels - 1 (now 0..9) the step runs with its backward and the loss is ")
    head = trial("resize-head", ctx)
    assert head.verdict == "verified" and "nn.Linear(16, 11) as head" in head.detail
    ignored = trial("ignore-index", ctx, target="10")
    assert ignored.verdict == "verified" and ignored.detail.startswith("with ignore_index=10 the step runs with its "
                                                                      "backward")


def test_shifting_labels_that_start_at_zero_fails(script):
    model = script.Classifier(classes=10)
    ctx = step_context(model, (torch.randn(3, 4), torch.tensor([0, 255, 3])), nn.CrossEntropyLoss())
    shifted = trial("shift-labels", ctx)
    assert (shifted.verdict, shifted.detail) == ("fails", "IndexError: Target -1 is out of bounds.")
    ignored = trial("ignore-index", ctx)  # the one label outside the classes, found in the batch
    assert ignored.verdict == "verified" and "ignore_index=255" in ignored.detail


def test_float_class_labels_are_fixed_by_long(script):
    model = script.Classifier(classes=3)
    ctx = step_context(model, (torch.randn(4, 4), torch.tensor([0.0, 2.0, 1.0, 1.0])), nn.CrossEntropyLoss())
    outcome = trial("target-long", ctx)
    assert outcome.verdict == "verified", outcome.detail
    assert outcome.detail.startswith("with target.long() (was float32) the step runs")
    assert trial("target-float", ctx).detail == "the target is already float32"


def test_int32_class_labels_from_numpy_are_fixed_by_long(script):
    import numpy as np

    model = script.Classifier(classes=3)
    ctx = step_context(model, (torch.randn(3, 4), torch.from_numpy(np.array([0, 2, 1], dtype=np.int32))),
                       nn.CrossEntropyLoss())
    outcome = trial("target-long", ctx)
    assert outcome.verdict == "verified", outcome.detail
    assert outcome.detail.startswith("with target.long() (was int32) the step runs")


def test_fractional_targets_are_not_cast_to_class_indices(script):
    model = script.Classifier(classes=3)
    ctx = step_context(model, (torch.randn(2, 4), torch.tensor([0.5, 2.0])), nn.CrossEntropyLoss())
    outcome = trial("target-long", ctx)
    assert outcome.verdict == "not tried"
    assert "fractional values (0.5)" in outcome.detail


def test_integer_targets_of_a_binary_loss_are_fixed_by_float(script):
    model = script.Scorer()
    ctx = step_context(model, (torch.randn(4, 4), torch.tensor([[0], [1], [1], [0]])), nn.BCELoss())
    outcome = trial("target-float", ctx)
    assert outcome.verdict == "verified", outcome.detail
    assert outcome.detail.startswith("with target.to(torch.float32) (was int64) the step runs")


def test_a_binary_loss_on_n_by_1_outputs_and_n_targets(script):
    model = script.Scorer()
    ctx = step_context(model, (torch.randn(4, 4), torch.tensor([0.0, 1.0, 1.0, 0.0])), nn.BCELoss())
    squeezed = trial("squeeze-output", ctx)
    assert squeezed.verdict == "verified", squeezed.detail
    assert squeezed.detail.startswith("with output.squeeze(-1) ([4, 1] -> [4]) the step runs")
    unsqueezed = trial("unsqueeze-target", ctx)
    assert unsqueezed.verdict == "verified", unsqueezed.detail
    assert unsqueezed.detail.startswith("with target.unsqueeze(-1) ([4] -> [4, 1]) the step runs")


def test_squeezing_does_not_apply_to_class_scores(script):
    model = script.Classifier(classes=10)
    ctx = step_context(model, (torch.randn(4, 4), torch.tensor([1, 10, 3, 7])), nn.CrossEntropyLoss())
    outcome = trial("squeeze-output", ctx)
    assert (outcome.verdict, outcome.detail) == ("not tried", "the loss's input [4, 10] has no last dimension of size 1")
    assert trial("unsqueeze-target", ctx).verdict == "not tried"
    assert trial("resize-embedding", ctx).detail == "every embedding's ids fit its table in this step"


def test_resizing_the_head_does_not_apply_when_every_label_fits(script):
    model = script.Classifier(classes=3)
    ctx = step_context(model, (torch.randn(2, 4), torch.tensor([0.0, 2.0])), nn.CrossEntropyLoss())
    assert trial("resize-head", ctx).detail == "the loss's target is float32, not integer class labels"
    several = step_context(model, (torch.randn(3, 4), torch.tensor([5, 2, 7])), nn.CrossEntropyLoss())
    assert trial("ignore-index", several).detail == \
        "labels [5, 7] are outside the 3 classes: ignore_index takes one value"


# ---------------------------------------------------------------------------- inputs, views, in-place writes


def test_double_input_and_state_into_an_lstm_are_both_cast(script):
    model = script.Sequence()
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    state = (torch.zeros(1, 2, 5, dtype=torch.float64), torch.zeros(1, 2, 5, dtype=torch.float64))
    exc = raised(model, x, state)
    ctx = live_context(exc, model=model, loss_fn=nn.MSELoss())
    outcome = trial("input-float", ctx)
    assert outcome.verdict == "verified", outcome.detail
    assert outcome.detail.startswith("with arg0 (float64), arg1[0] (float64), arg1[1] (float64) cast to float32 the "
                                     "step runs with its backward and the output's sum (standing in for the loss) is ")
    assert x.dtype == torch.float64


def test_a_state_made_in_float64_inside_forward_is_cast_at_the_layer(script):
    model = script.Sequence64()
    batch = (torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 1))
    ctx = step_context(model, batch, nn.MSELoss())
    outcome = trial("input-float", ctx)
    assert outcome.verdict == "verified", outcome.detail
    assert outcome.detail.startswith("with arg0 (float64) and the inputs made inside the forward of cell (LSTMCell) "
                                     "cast to float32 the step runs with its backward and the loss is ")


def test_casting_inputs_does_not_apply_when_they_already_match(script):
    model = script.Classifier(classes=3)
    ctx = step_context(model, (torch.randn(4, 4), torch.tensor([0.0, 2.0, 1.0, 1.0])), nn.CrossEntropyLoss())
    outcome = trial("input-float", ctx)
    assert outcome.verdict == "not tried"
    assert "already float32" in outcome.detail


def test_contiguous_before_the_view_that_failed(script):
    model = script.Patches()
    ctx = step_context(model, (torch.randn(2, 3, 4), torch.tensor([1, 2])), nn.CrossEntropyLoss())
    outcome = trial("contiguous", ctx)
    assert outcome.verdict == "verified", outcome.detail
    line = _line(script, "x = x.transpose(1, 2).view(b, -1)")
    assert outcome.detail.startswith(f"with .contiguous() before .view at {script.__file__}:{line} "
                                     f"(`x = x.transpose(1, 2).view(b, -1)`) the step runs")
    assert trial("relu-not-inplace", ctx).verdict == "not tried"  # the step fails the same way: nothing in place


def test_the_in_place_relu_that_breaks_the_backward_is_named(script, tmp_path):
    torch.manual_seed(0)
    model = script.gated()
    ctx = step_context(model, (torch.randn(4, 4), torch.tensor([0, 1, 2, 1])), nn.CrossEntropyLoss())
    assert "modified by an inplace operation" in str(ctx.exception)
    guard = StateGuard(model, folder=tmp_path)
    outcome = trial("relu-not-inplace", ctx)
    guard.assert_unchanged()
    assert outcome.verdict == "verified", outcome.detail
    assert outcome.detail.startswith("with inplace=False on 4 (ReLU) the step runs with its backward")  # not 1
    assert model[4].inplace and model[1].inplace
    assert trial("contiguous", ctx).detail == "no .view in the step fails on a non-contiguous tensor"


# ---------------------------------------------------------------------------- state kept across backward passes


def test_a_recurrent_state_kept_across_steps_is_detached_in_the_loop(script, tmp_path):
    torch.manual_seed(0)
    model = nn.RNN(3, 6, batch_first=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(2, 5, 3), torch.randn(2, 6)) for _ in range(3)]
    exc = raised(script.rnn_train, model, optimizer, data)
    assert "backward through the graph a second time" in str(exc)
    ctx = live_context(exc)  # no DataLoader, and the failure is in backward(): only the loop says what the step was
    guard = StateGuard(model, optimizer=optimizer, folder=tmp_path)
    outcome = trial("detach-hidden", ctx)
    guard.assert_unchanged()
    assert outcome.verdict == "verified", outcome.detail
    assert outcome.detail.startswith("with hidden detached at the start of the step the step runs with its backward "
                                     "and the loss is ")
    assert trial("detach-fake", ctx).verdict == "not tried"


def test_a_recorded_model_call_with_a_previous_graph_is_detached(script):
    model = script.Sequence()
    x = torch.randn(2, 4, 3)
    h = torch.zeros(1, 2, 5, requires_grad=True) * 2  # carries a graph, as a state from the previous step would
    state = (h, h.clone())
    model(x, state).sum().backward()  # that previous step's backward frees the graph
    exc = raised(lambda: model(x, state).sum().backward())
    tracker = Tracker(model=model, model_call=((x, state), {}))
    ctx = live_context(exc, tracker=tracker)
    outcome = trial("detach-hidden", ctx)
    assert outcome.verdict == "verified", outcome.detail
    assert outcome.detail.startswith("with arg1[0], arg1[1] detached before the model's call the step runs")


def test_a_gan_discriminator_step_on_the_fake_batch_is_detached(script, tmp_path):
    torch.manual_seed(0)
    net_g = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 4))
    net_d = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1), nn.Sigmoid())
    opt_g = torch.optim.Adam(net_g.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(net_d.parameters(), lr=1e-3)
    data = [torch.randn(3, 4) for _ in range(2)]
    exc = raised(script.gan_train, net_g, net_d, opt_g, opt_d, data)
    assert "backward through the graph a second time" in str(exc)
    ctx = live_context(exc)
    guard = StateGuard(net_g, net_d, optimizer=opt_d, folder=tmp_path)
    outcome = trial("detach-fake", ctx)
    guard.assert_unchanged()
    assert outcome.verdict == "verified", outcome.detail
    line = _line(script, "err_d = criterion(")
    assert f"`net_d(fake.detach())` at {script.__file__}:{line}" in outcome.detail
    assert "the step runs with its backward and the loss is " in outcome.detail
    hidden = trial("detach-hidden", ctx)
    assert hidden.verdict == "not tried", hidden.detail


# ---------------------------------------------------------------------------- checkpoints


def test_a_data_parallel_state_dict_loads_once_module_is_stripped(script):
    source, model = script.Classifier(), script.Classifier()
    state = {f"module.{k}": v for k, v in source.state_dict().items()}
    exc = raised(model.load_state_dict, state)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ctx = live_context(exc)
    outcome = trial("strip-module-prefix", ctx)
    assert outcome.verdict == "verified", outcome.detail
    assert outcome.detail == "with `module.` stripped from 4 of 4 keys, Classifier.load_state_dict(strict=True) loads them"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_stripping_does_not_apply_to_a_state_dict_of_another_model(script):
    model = script.Classifier(classes=10)
    exc = raised(model.load_state_dict, script.Classifier(classes=3).state_dict())
    outcome = trial("strip-module-prefix", live_context(exc))
    assert (outcome.verdict, outcome.detail) == ("not tried", "no key of the state dict starts with `module.`")


def test_a_config_object_refused_by_the_weights_only_unpickler(script, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a path relative to the script's folder: the trial's child works in its own
    torch.save({"config": script.Config(), "weights": torch.ones(2)}, "ckpt.pt")
    exc = raised(torch.load, "ckpt.pt", weights_only=True)
    ctx = live_context(exc)
    unsafe = trial("weights-only-false", ctx)
    assert (unsafe.verdict, unsafe.detail) == ("verified", "with weights_only=False torch.load reads the checkpoint "
                                                           "(a dict of 2 keys)")
    allowed = trial("safe-globals", ctx)
    assert (allowed.verdict, allowed.detail) == ("verified", "with torch.serialization.safe_globals("
                                                             "[train_script.Config]) torch.load reads the checkpoint "
                                                             "(a dict of 2 keys)")
    mapped = trial("map-location-cpu", ctx)
    assert (mapped.verdict, mapped.detail) == ("fails", "UnpicklingError: WeightsUnpickler error: Unsupported global: "
                                                        "GLOBAL train_script.Config was not an allowed global by "
                                                        "default.")


def _saved_as_if_on_cuda(path) -> None:
    """A checkpoint whose storages are tagged cuda:0, as torch.save writes them on a GPU."""
    from torch import serialization

    entry = (-1, lambda storage: "cuda:0", lambda storage, location: None)
    serialization._package_registry.insert(0, entry)
    try:
        torch.save({"weights": torch.ones(3)}, path)
    finally:
        serialization._package_registry.remove(entry)


def test_a_checkpoint_saved_on_cuda_loads_on_the_cpu_with_map_location(tmp_path):
    path = tmp_path / "gpu.pt"
    _saved_as_if_on_cuda(path)
    with open(path, "rb") as handle:
        exc = raised(torch.load, io.BytesIO(handle.read()))
    assert "Attempting to deserialize object on a CUDA device" in str(exc)
    ctx = live_context(exc)
    outcome = trial("map-location-cpu", ctx)
    assert (outcome.verdict, outcome.detail) == ("verified", "with map_location='cpu' torch.load reads the checkpoint "
                                                             "(a dict of 1 key)")
    assert trial("weights-only-false", ctx).verdict == "fails"
    assert trial("safe-globals", ctx).detail == "the error names no unsupported global"


# ---------------------------------------------------------------------------- the entry point


def _with_fixes(*fixes: Fix) -> Diagnosis:
    return Diagnosis(rule="index.test", category="index", confidence=0.9, title="t", hypothesis="h",
                     fix=fixes[0].text, fixes=list(fixes))


def test_try_fixes_stops_at_the_first_verified_fix_and_orders_them(script):
    model = script.Classifier(classes=10)
    ctx = step_context(model, (torch.randn(4, 4), torch.tensor([1, 10, 3, 7])), nn.CrossEntropyLoss())
    diagnosis = _with_fixes(Fix("cast", "Cast the labels.", "target-long"),
                            Fix("resize", "Grow the head.", "squeeze-output"),
                            Fix("explain", "Read the docs."),
                            Fix("shift", "Subtract 1.", "shift-labels"),
                            Fix("head", "Give the head 11 outputs.", "resize-head"))
    result = try_fixes(diagnosis, ctx)
    verdicts = {f.id: f.verdict for f in diagnosis.fixes}
    assert verdicts == {"cast": "not tried", "resize": "not tried", "explain": None, "shift": "verified", "head": None}
    assert result.name == "fix_trial" and result.status == "confirmed"
    assert "shift verified: with labels - 1 (now 0..9)" in result.detail
    order_fixes(diagnosis)
    assert [f.id for f in diagnosis.fixes] == ["shift", "cast", "resize", "explain", "head"]
    assert diagnosis.fix == "Subtract 1." and diagnosis.fix_id == "shift"


def test_a_fix_that_fails_goes_below_the_next_candidate(script):
    model = script.Classifier(classes=10)
    ctx = step_context(model, (torch.randn(3, 4), torch.tensor([0, 255, 3])), nn.CrossEntropyLoss())
    diagnosis = _with_fixes(Fix("shift", "Subtract 1.", "shift-labels"), Fix("other", "Check the data."))
    result = try_fixes(diagnosis, ctx)
    assert result.status == "refuted"
    assert result.detail == "shift fails: now IndexError: Target -1 is out of bounds."
    order_fixes(diagnosis)
    assert [f.id for f in diagnosis.fixes] == ["other", "shift"]


def test_without_a_live_failure_nothing_is_tried():
    from triage.logparse import parse_text
    from triage.probes.context import ProbeContext

    ctx = ProbeContext(incident=parse_text("IndexError: Target 10 is out of bounds.\n"))
    outcome = trial("shift-labels", ctx)
    assert outcome.verdict == "not tried" and "pasted log" in outcome.detail


def test_every_trial_the_rules_may_name_is_implemented():
    assert set(TRIALS) == set(FIX_TRIALS)


def test_a_trial_refuses_to_run_in_the_user_s_process(script):
    model = script.Classifier(classes=10)
    ctx = step_context(model, (torch.randn(4, 4), torch.tensor([1, 10, 3, 7])), nn.CrossEntropyLoss())
    with pytest.raises(RuntimeError, match="run it through run_trial"):
        TRIALS["resize-head"](ctx, {})


# ---------------------------------------------------------------------------- in the pipeline

RULE = """\
- id: team.label-out-of-range
  category: index
  title: Label {{ target }} is out of range
  match:
    exception: IndexError
    message: 'Target (?P<target>-?\\d+) is out of bounds'
  hypothesis: The loss got label {{ target }}, beyond the model's classes.
  fix: Make every label fit 0..C-1.
  probes: [index_range]
  causes:
    - id: label-off-by-one
      hypothesis: The labels do not start at 0.
      fixes:
        - id: cast-labels
          text: Cast the labels to long.
          trial: target-long
        - id: shift-labels
          text: Subtract 1 from the labels.
          trial: shift-labels
        - id: ignore-void
          text: Pass ignore_index={{ target }} to the loss.
          trial: ignore-index
  examples:
    match: ['IndexError: Target 10 is out of bounds.']
    no_match: ['IndexError: index out of range in self']
"""


def _triaged(tmp_path, model, batch):
    from triage.kb import load_paths
    from triage.pipeline import LiveContext, triage_incident
    from triage.wrapper import incident_from_exception

    rules = tmp_path / "team.yaml"
    rules.write_text(RULE)
    kb = load_paths([rules])
    assert kb.problems == []
    loss_fn = nn.CrossEntropyLoss()
    exc = raised(lambda: loss_fn(model(batch[0]), batch[1]).backward())
    live = LiveContext(exception=exc, tracker=Tracker(model=model, batch=batch, loss_fn=loss_fn))
    return triage_incident(incident_from_exception(exc), kb, live=live)


def test_the_pipeline_leads_with_the_fix_a_trial_verified(script, tmp_path):
    from triage.render import to_markdown

    report = _triaged(tmp_path, script.Classifier(classes=10), (torch.randn(4, 4), torch.tensor([1, 10, 3, 7])))
    leading = report.leading
    assert [(f.id, f.verdict) for f in leading.fixes] == [("shift-labels", "verified"), ("cast-labels", "not tried"),
                                                          ("ignore-void", None)]
    trial_result = next(p for p in leading.probes if p.name == "fix_trial")
    assert trial_result.status == "confirmed"
    as_json = leading.to_dict()
    assert as_json["fix_id"] == "shift-labels" and as_json["fix"] == "Subtract 1 from the labels."
    markdown = to_markdown(report)
    assert "**Fix.** Subtract 1 from the labels. (fix verified: with labels - 1 (now 0..9) the step runs" in markdown
    assert "- Cast the labels to long. (not tried: the target is already int64)" in markdown


def test_the_pipeline_moves_a_failed_fix_below_the_next_candidate(script, tmp_path):
    from triage.render import to_markdown

    report = _triaged(tmp_path, script.Classifier(classes=10), (torch.randn(3, 4), torch.tensor([0, 255, 3])))
    leading = report.leading
    assert [(f.id, f.verdict) for f in leading.fixes] == [("ignore-void", "verified"), ("cast-labels", "not tried"),
                                                          ("shift-labels", "fails")]
    markdown = to_markdown(report)
    assert "**Fix.** Pass ignore_index=255 to the loss. (fix verified: with CrossEntropyLoss(ignore_index=255)" \
        in markdown
    assert "- tried: Subtract 1 from the labels. (fails: now IndexError: Target -1 is out of bounds.)" in markdown


def test_when_every_fix_fails_the_leading_fix_says_what_it_now_raises(script, tmp_path):
    from triage.render import to_markdown

    model = script.Classifier(classes=10)
    report = _triaged(tmp_path, model, (torch.randn(3, 4), torch.tensor([0, 255, 12])))  # two labels out of range
    leading = report.leading
    assert [(f.id, f.verdict) for f in leading.fixes] == [("cast-labels", "not tried"), ("shift-labels", "fails"),
                                                          ("ignore-void", "fails")]
    assert next(p for p in leading.probes if p.name == "fix_trial").status == "refuted"
    markdown = to_markdown(report)
    assert "**Fix.** Cast the labels to long. (fix not tried: the target is already int64)" in markdown
    assert "- tried: Pass ignore_index=255 to the loss. (fails: now IndexError: Target 12 is out of bounds.)" in markdown
