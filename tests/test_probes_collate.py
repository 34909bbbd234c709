"""collate_fields on real collate failures: which field of the samples is ragged, and by how much."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from _probe_fixtures import isolated, live_context, raised
from triage.probes.collate_fields import collate_fields

SAMPLES = [{"input_ids": [1, 2, 3], "label": 0}, {"input_ids": [4, 5, 6, 7, 8], "label": 1},
           {"input_ids": [9, 10, 11], "label": 1}]


def to_tensors(features):
    return {key: torch.tensor([f[key] for f in features]) for key in features[0]}


def test_collate_fields_names_the_ragged_field_with_its_lengths():
    loader = DataLoader(SAMPLES, batch_size=3, collate_fn=to_tensors)
    exc = raised(lambda: next(iter(loader)))
    assert "expected sequence of length 3 at dim 1 (got 5)" in str(exc)
    outcome = isolated(collate_fields, live_context(exc))
    assert outcome.status == "confirmed"
    assert outcome.facts["ragged"] == [{"field": "input_ids", "sizes": "3 (2 samples), 5 (1)", "min": 3, "max": 5}]
    assert outcome.detail == ("of the 3 samples given to the collate_fn, `input_ids` has sizes 3 (2 samples), 5 (1) "
                              "(from 3 to 5); `label` is uniform")


def test_collate_fields_reads_tensor_shapes_in_tuples():
    pairs = [(torch.zeros(3, 8), 0), (torch.zeros(3, 6), 1)]
    loader = DataLoader(pairs, batch_size=2)
    exc = raised(lambda: next(iter(loader)))
    outcome = isolated(collate_fields, live_context(exc))
    assert outcome.status == "confirmed" and outcome.facts["ragged"][0]["field"] == "[0]"
    assert outcome.facts["ragged"][0]["sizes"] == "3x8 (1 sample), 3x6 (1)"


def test_collate_fields_refutes_when_every_field_has_one_size():
    def bad_collate(features):
        return {key: torch.tensor([f[key] for f in features], dtype=torch.float32) + "x" for key in features[0]}

    loader = DataLoader([{"input_ids": [1, 2], "label": 0}] * 4, batch_size=4, collate_fn=bad_collate)
    outcome = isolated(collate_fields, live_context(raised(lambda: next(iter(loader)))))
    assert outcome.status == "refuted"
    assert outcome.detail.startswith("every field has one size in all 4 samples (input_ids: 2 (4 samples)")


def test_collate_fields_skips_without_a_dataloader():
    outcome = isolated(collate_fields, live_context(raised(lambda: torch.tensor([[1, 2], [3]]))))
    assert outcome.status == "skipped"
