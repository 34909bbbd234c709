"""The `the failing layer is ...` note: only for a real layer's forward call, never for other module methods,
the model's own top-level code, a loss, or with a non-tensor argument's repr."""

from __future__ import annotations

import torch
from torch import nn

from triage.capture.live import capture_exception
from triage.tracking import Tracker


def notes_of(function) -> list[str]:
    try:
        function()
    except Exception as exc:  # the real failure under test
        return capture_exception(exc, tracker=Tracker()).incident.notes
    raise AssertionError("expected the call to fail")


def layer_notes(function) -> list[str]:
    return [note for note in notes_of(function) if note.startswith("the failing layer is")]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten())
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(self.features(x))


class Reshaping(nn.Module):
    """Fails in its own forward code, between its layers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 6)

    def forward(self, x):
        return self.fc(x).view(-1, 4)


class Gate(nn.Module):
    """A layer called with a tensor and a plain string."""

    def forward(self, x, mode):
        return x @ torch.ones(3, 3) if mode == "mix" else x


def test_a_layer_inside_the_model_is_named_with_its_tensor_input():
    model = Net()
    images = torch.randn(2, 3, 8, 8)
    notes = layer_notes(lambda: model(images))
    assert len(notes) == 1
    assert notes[0].startswith("the failing layer is fc (Linear), called with tensor[2, 144] float32")


def test_a_leaf_layer_called_alone_is_a_layer():
    layer = nn.Linear(4, 2)
    assert layer_notes(lambda: layer(torch.randn(3, 5)))[0].startswith("the failing layer is Linear, called with "
                                                                      "tensor[3, 5]")


def test_load_state_dict_is_not_a_layer():
    model = Net()
    state = dict(Net().state_dict())
    state["fc.weight"] = torch.zeros(10, 65)
    assert layer_notes(lambda: model.load_state_dict(state)) == []


def test_module_to_is_not_a_layer_and_its_arguments_are_not_shown():
    model = Net()
    notes = notes_of(lambda: model.to("cuda:7"))
    assert not any("failing layer" in note or "cuda:7" in note for note in notes)


def test_an_attribute_typo_in_forward_is_not_a_layer():
    class Typo(Net):
        def forward(self, x):
            return self.fc2(self.features(x))

    assert layer_notes(lambda: Typo()(torch.randn(1, 3, 8, 8))) == []


def test_the_models_own_forward_code_is_not_a_layer():
    assert layer_notes(lambda: Reshaping()(torch.randn(3, 4))) == []


def test_a_loss_is_not_a_layer():
    loss_fn = nn.CrossEntropyLoss()
    assert layer_notes(lambda: loss_fn(torch.randn(4, 3), torch.tensor([0, 1, 2, 3]))) == []


def test_a_layers_non_tensor_argument_is_never_shown():
    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = Gate()

        def forward(self, x):
            return self.gate(x, "mix")

    notes = layer_notes(lambda: Wrapper()(torch.randn(2, 4)))
    assert len(notes) == 1 and notes[0].startswith("the failing layer is gate (Gate), called with tensor[2, 4]")
    assert "mix" not in notes[0]
