"""device_census and dtype_census on real mismatches (the meta device stands in for a GPU on CPU-only machines)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from _probe_fixtures import StateGuard, TextModel, live_context, raised
from triage.probes.census import device_census, dtype_census


class PositionalEncoding(nn.Module):
    def __init__(self, size: int = 4) -> None:
        super().__init__()
        self.pe = torch.ones(size)  # a plain attribute, not register_buffer: .to() leaves it where it is

    def forward(self, x):
        return x + self.pe


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.pos = PositionalEncoding()

    def forward(self, x):
        return self.pos(self.fc(x))


def test_device_census_names_the_tensor_left_behind():
    model = Model().to("meta")
    x = torch.empty(2, 4, device="meta")
    exc = raised(model, x)
    assert "is not on the expected device" in str(exc)  # a real device mismatch
    ctx = live_context(exc)
    guard = StateGuard()
    outcome = device_census(ctx)
    guard.assert_unchanged()
    assert outcome.status == "confirmed"
    assert outcome.facts["home"] == "meta"
    assert outcome.detail.startswith("the model's tensors are on meta (2 parameters/buffers) but attribute `pe` of pos "
                                     "(PositionalEncoding) on cpu (a plain tensor attribute, which .to() does not "
                                     "move: register it with self.register_buffer)")


def test_device_census_names_an_input_on_the_wrong_device():
    model = nn.Sequential(nn.Linear(4, 2)).to("meta")
    exc = raised(model, torch.randn(3, 4))
    outcome = device_census(live_context(exc))
    assert outcome.status == "confirmed"
    assert "input arg0 of 0 (Linear) on cpu" in outcome.detail


def test_device_census_refutes_when_everything_is_on_one_device():
    model = TextModel()
    ids = torch.tensor([[1, 12]])
    exc = raised(model, ids)
    outcome = device_census(live_context(exc))
    assert outcome.status == "refuted"
    assert outcome.detail.startswith("every parameter, buffer and input is on cpu")


def test_dtype_census_names_a_double_input_to_a_float_layer():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4, dtype=torch.float64)
    exc = raised(model, x)
    assert "must have the same dtype" in str(exc)
    guard = StateGuard(model)
    outcome = dtype_census(live_context(exc))
    guard.assert_unchanged()
    assert outcome.status == "confirmed"
    assert "input arg0 of 0 (Linear) is Double[3, 4] on cpu while its weights are float32" in outcome.detail


def test_dtype_census_names_a_half_parameter_among_float_ones():
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    model[1].half()
    exc = raised(model, torch.randn(3, 4))
    outcome = dtype_census(live_context(exc))
    assert outcome.status == "confirmed"
    assert "parameter `weight` of 1 (Linear) is float16" in outcome.detail


def test_dtype_census_names_float_class_targets():
    logits = torch.randn(4, 3)
    target = torch.tensor([0.0, 2.0, 1.0, 1.0])
    loss_fn = nn.CrossEntropyLoss()
    exc = raised(loss_fn, logits, target)
    outcome = dtype_census(live_context(exc, loss_fn=loss_fn))
    assert outcome.status == "confirmed"
    assert "the target of CrossEntropyLoss is Float[4] on cpu: class indices must be Long" in outcome.detail


def test_dtype_census_refutes_when_dtypes_agree():
    model = nn.Sequential(nn.Linear(4, 2))
    exc = raised(model, torch.randn(3, 5))
    outcome = dtype_census(live_context(exc))
    assert outcome.status == "refuted"
    assert "the model's floating tensors are float32" in outcome.detail


def test_census_skips_without_live_objects():
    from triage.incident import Incident
    from triage.probes.context import ProbeContext

    ctx = ProbeContext(incident=Incident())
    assert device_census(ctx).status == "skipped"
    assert dtype_census(ctx).status == "skipped"


class SequenceClassifier(nn.Module):
    """An LSTM over a sequence with its hidden state handed in, as word-language-model style loops do."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 8, batch_first=True)
        self.fc = nn.Linear(8, 2)

    def forward(self, x, hidden):
        out, hidden = self.lstm(x, hidden)
        return self.fc(out[:, -1]), hidden


def test_dtype_census_confirms_a_double_input_and_double_hidden_state_into_a_float_lstm():
    """NumPy features and a hidden state built with np.zeros are both float64: casting only the data still fails."""
    model = SequenceClassifier()
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 5, 4)))
    hidden = (torch.from_numpy(np.zeros((1, 2, 8))), torch.from_numpy(np.zeros((1, 2, 8))))
    exc = raised(model, x, hidden)
    assert "RNN input dtype (torch.float64) does not match weight dtype (torch.float32)" in str(exc)
    outcome = dtype_census(live_context(exc))
    assert outcome.status == "confirmed"
    assert outcome.facts["weight_dtype"] == "float32"
    assert [(m["arg"], m["kind"], m["dtype"]) for m in outcome.facts["mismatched"]] == [
        ("arg0", "input", "float64"), ("arg1[0]", "state", "float64"), ("arg1[1]", "state", "float64")]
    assert outcome.facts["mismatched"][1]["name"] == "hidden state arg1[0] of lstm (LSTM)"
    assert "hidden state arg1[1] of lstm (LSTM) is Double[1, 2, 8] on cpu while its weights are float32" \
        in outcome.detail



def test_device_census_confirms_a_model_whose_weights_stayed_on_meta():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 3))
    model.load_state_dict(nn.Sequential(nn.Linear(4, 3)).state_dict())  # copying into meta does nothing
    exc = raised(model, torch.randn(2, 4))
    outcome = device_census(live_context(exc))
    assert outcome.status == "confirmed" and outcome.facts["home"] == "meta"
    assert outcome.facts["meta"] == ["parameter `weight` of 0 (Linear)", "parameter `bias` of 0 (Linear)"]
    assert outcome.detail.startswith("the model's tensors are on meta (2 parameters/buffers) but input arg0")


def test_device_census_confirms_meta_when_the_inputs_are_on_meta_too():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 3))
        x = torch.empty(2, 4)
    exc = raised(lambda: model(x).sum().item())  # a meta forward runs; reading a value fails
    outcome = device_census(live_context(exc, model=model))
    assert outcome.status == "confirmed"
    assert outcome.detail.startswith("every parameter, buffer and input is on meta, which holds no data (2 tensors")


def test_dtype_census_reads_the_target_of_a_functional_loss_from_its_frame():
    model = nn.Linear(4, 3)
    logits = model(torch.randn(5, 4))
    labels = torch.from_numpy(np.array([0, 2, 1, 1, 0], dtype=np.int32))
    exc = raised(nn.functional.cross_entropy, logits, labels)  # no hook records a functional loss
    outcome = dtype_census(live_context(exc, model=model))
    assert outcome.status == "confirmed"
    assert outcome.facts["mismatched"][0]["kind"] == "target" and outcome.facts["mismatched"][0]["dtype"] == "int32"
    assert "the target of cross_entropy is Int[5] on cpu: class indices must be Long (int64)" in outcome.detail


def test_dtype_census_refutes_when_the_functional_loss_target_is_long():
    model = nn.Linear(4, 3)
    logits = model(torch.randn(5, 4))
    exc = raised(nn.functional.cross_entropy, logits, torch.tensor([0, 2, 1, 1]))  # a batch-size error, not a dtype one
    outcome = dtype_census(live_context(exc, model=model))
    assert outcome.status == "refuted" and outcome.facts["mismatched"] == []


def test_dtype_census_names_float_indices_of_an_embedding():
    model = TextModel()
    ids = torch.tensor([[1.0, 7.0, 2.0]])
    exc = raised(model, ids)
    assert "'indices'" in str(exc)
    outcome = dtype_census(live_context(exc))
    assert outcome.status == "confirmed"
    fact = outcome.facts["mismatched"][0]
    assert (fact["kind"], fact["dtype"], fact["whole_numbers"]) == ("indices", "float32", True)
    assert ("the indices (arg0) of encoder.embed (Embedding) are Float[1, 3] on cpu: an embedding needs Long or Int "
            "indices; every value is a whole number") in outcome.detail


def test_dtype_census_refutes_integer_indices_of_an_embedding():
    model = TextModel()
    exc = raised(model, torch.tensor([[1, 12]]))  # out of range, but integers: not a dtype fault
    outcome = dtype_census(live_context(exc))
    assert outcome.status == "refuted"
