"""checkpoint_diff on real load failures: keys compared as strings, shapes compared, files read (never unpickled)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from _probe_fixtures import diagnosis, isolated, live_context, raised
from triage.probes.checkpoint_diff import checkpoint_diff


def _net(classes: int = 3) -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, classes))


def _probe(exc, rule: str, tmp_path=None):
    ctx = live_context(exc, report_dir=tmp_path)
    d = dataclasses.replace(diagnosis("checkpoint", "checkpoint_diff"), rule=rule)
    return isolated(checkpoint_diff, dataclasses.replace(ctx, diagnosis=d))


def test_a_dataparallel_prefix_on_every_key_is_found_by_comparing_the_keys():
    state = {f"module.{k}": v for k, v in _net().state_dict().items()}
    outcome = _probe(raised(_net().load_state_dict, state), "checkpoint.key-prefix")
    assert outcome.status == "confirmed", outcome.detail
    assert outcome.facts["checkpoint_prefix"] == "module."
    assert "'module.0.bias' against '0.bias'" in outcome.detail


def test_keys_stripped_of_a_prefix_they_never_had_are_seen_as_cut_not_as_another_architecture():
    net = nn.Sequential()
    net.add_module("encoder", nn.Linear(4, 4))
    state = {k[7:]: v for k, v in net.state_dict().items()}  # 'encoder.weight' -> '.weight': k[7:] meant for 'module.'
    exc = raised(net.load_state_dict, state)
    outcome = _probe(exc, "checkpoint.missing-unexpected-keys")
    assert outcome.facts["keys_cut_by"] == 7, outcome.detail
    assert "without its first 7 characters" in outcome.detail


def test_shapes_that_differ_are_named_with_both_shapes_and_refute_a_prefix_claim():
    exc = raised(_net(3).load_state_dict, _net(10).state_dict())
    outcome = _probe(exc, "checkpoint.size-mismatch")
    assert outcome.status == "confirmed"
    assert outcome.facts["shape_mismatches"][0] == {"key": "2.bias", "checkpoint": [10], "model": [3]}
    assert "2.weight: checkpoint [10, 16], model [3, 16]" in outcome.detail
    assert _probe(exc, "checkpoint.key-prefix").status == "refuted"


def test_a_whole_training_checkpoint_given_to_load_state_dict_is_recognised():
    checkpoint = {"epoch": 3, "model_state_dict": _net().state_dict(), "optimizer": {}}
    outcome = _probe(raised(_net().load_state_dict, checkpoint), "checkpoint.whole-checkpoint-dict")
    assert outcome.status == "confirmed", outcome.detail
    assert outcome.facts["nested_state_dicts"] == ["model_state_dict"]
    assert "4 of 4 model keys are in 'model_state_dict'" in outcome.detail


def test_a_truncated_file_is_read_as_a_zip_cut_short(tmp_path):
    path = tmp_path / "last.pt"
    torch.save(_net().state_dict(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    outcome = _probe(raised(torch.load, str(path)), "checkpoint.corrupted-file", tmp_path)
    assert outcome.status == "confirmed", outcome.detail
    assert outcome.facts["truncated"] is True and "cut short" in outcome.detail


@dataclass
class TrainConfig:
    lr: float = 0.1


def test_a_weights_only_refusal_lists_the_globals_the_file_needs(tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.save({"model": _net().state_dict(), "config": TrainConfig()}, path)
    outcome = _probe(raised(torch.load, str(path), weights_only=True), "checkpoint.weights-only-global", tmp_path)
    assert outcome.status == "confirmed", outcome.detail
    assert any(name.endswith("TrainConfig") for name in outcome.facts["globals"])


def test_map_location_cuda_on_a_machine_without_one_is_named(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: map_location='cuda:0' loads")
    path = tmp_path / "ckpt.pt"
    torch.save(_net().state_dict(), path)
    outcome = _probe(raised(torch.load, str(path), map_location="cuda:0"), "device.cuda-checkpoint-on-cpu", tmp_path)
    assert outcome.status == "confirmed", outcome.detail
    assert outcome.facts["map_location"] == "cuda:0" and outcome.facts["saved_on"] == ["cpu"]


def test_the_probe_never_unpickles_the_file(tmp_path):
    path = tmp_path / "ckpt.pt"
    marker = tmp_path / "ran"
    torch.save({"x": _Bomb(str(marker))}, path)
    os.remove(marker) if marker.exists() else None
    _probe(raised(torch.load, str(path), weights_only=True), "checkpoint.weights-only-global", tmp_path)
    assert not marker.exists()


class _Bomb:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))
