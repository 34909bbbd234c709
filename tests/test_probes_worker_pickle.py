"""worker_pickle on DataLoaders whose spawned workers cannot start: which part, and which of its members, fails."""

from __future__ import annotations

import io

import torch
from torch.utils.data import DataLoader, Dataset

from _probe_fixtures import isolated, live_context, raised
from triage.probes.worker_pickle import worker_pickle


class Numbers(Dataset):
    def __init__(self, transform=None, handle=None) -> None:
        self.values = torch.arange(64.0).reshape(16, 4)  # stood in for, never serialised
        self.transform = transform
        self.handle = handle

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: int):
        row = self.values[index]
        return self.transform(row) if self.transform else row


def _spawn_failure(loader: DataLoader) -> BaseException:
    exc = raised(lambda: next(iter(loader)))
    assert "pickle" in str(exc)
    return exc


def test_worker_pickle_names_a_lambda_collate_fn():
    loader = DataLoader(Numbers(), batch_size=4, num_workers=1, multiprocessing_context="spawn",
                        collate_fn=lambda rows: torch.stack(rows))
    outcome = isolated(worker_pickle, live_context(_spawn_failure(loader)))
    assert outcome.status == "confirmed"
    assert (outcome.facts["part"], outcome.facts["member"], outcome.facts["start_method"]) == \
        ("collate_fn", "collate_fn", "spawn")
    assert outcome.facts["parts"]["dataset"] == "pickles (test_probes_worker_pickle.Numbers)"
    assert outcome.detail.startswith("the collate_fn (function test_worker_pickle_names_a_lambda_collate_fn.<locals>."
                                     "<lambda>) cannot be pickled for a spawned worker: AttributeError: Can't pickle")


def test_worker_pickle_finds_the_lambda_inside_the_dataset():
    loader = DataLoader(Numbers(transform=lambda row: row * 2), batch_size=4, num_workers=1,
                        multiprocessing_context="spawn")
    outcome = isolated(worker_pickle, live_context(_spawn_failure(loader)))
    assert outcome.status == "confirmed"
    assert (outcome.facts["part"], outcome.facts["member"]) == ("dataset", "dataset.transform")


def test_worker_pickle_names_an_open_file_member():
    with open(__file__, "rb") as handle:
        loader = DataLoader(Numbers(handle=handle), batch_size=4, num_workers=1, multiprocessing_context="spawn")
        outcome = isolated(worker_pickle, live_context(_spawn_failure(loader)))
    assert outcome.status == "confirmed"
    assert (outcome.facts["member"], outcome.facts["member_type"]) == ("dataset.handle", "_io.BufferedReader")
    assert "its member `dataset.handle` (_io.BufferedReader) is what fails: TypeError: cannot pickle" in outcome.detail


def test_worker_pickle_refutes_when_every_part_pickles():
    loader = DataLoader(Numbers(handle=io.BytesIO(b"ids")), batch_size=4, num_workers=1)
    exc = raised(lambda: next(iter(loader))[99])  # fails after the workers started: not a pickling fault
    outcome = isolated(worker_pickle, live_context(exc, loader=loader))
    assert outcome.status == "refuted"
    assert outcome.detail.startswith("every part a spawned worker receives pickles: dataset")


def test_worker_pickle_skips_without_a_loader():
    outcome = isolated(worker_pickle, live_context(raised(lambda: 1 / 0)))
    assert outcome.status == "skipped"
