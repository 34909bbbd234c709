"""workers0_rerun on real DataLoader failures, and save_batch with the replay loader."""

from __future__ import annotations

import random
import threading
import time
from collections import namedtuple

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from _probe_fixtures import StateGuard, live_context, raised
from triage.incident import Incident
from triage.probes import workers0_rerun as workers0_module
from triage.probes.context import ProbeContext
from triage.probes.save_batch import save_batch
from triage.probes.workers0_rerun import workers0_rerun
from triage.replay import ReplayError, feed_first, load_replay
from triage import tracking
from triage.tracking import Tracker
from triage.wrapper import track


class Labels(Dataset):
    """Looks labels up in a dict that lacks one key: index 13 fails."""

    def __init__(self, n: int = 32) -> None:
        self.n = n
        self.names = {i: i % 3 for i in range(n) if i != 13}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index):
        label = self.names[index]
        return torch.full((4,), float(index)), label


class Blocking(Dataset):
    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index):
        if index == 5:
            with self.lock:
                pass
        return torch.zeros(2)


class Big(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index):
        return torch.zeros(256, 256)  # 256 KiB per sample


def test_workers0_rerun_surfaces_the_worker_exception_with_its_index_and_line():
    loader = DataLoader(Labels(), batch_size=4, num_workers=2)
    tracker = Tracker()
    exc = raised(lambda: [None for _ in track(loader, tracker)])
    assert "Caught KeyError in DataLoader worker process" in str(exc)
    ctx = live_context(exc, tracker=tracker)
    assert ctx.loader is loader and ctx.batch_index == 2
    guard = StateGuard()
    outcome = workers0_rerun(ctx)
    guard.assert_unchanged()
    assert outcome.status == "confirmed"
    assert "with num_workers=0, fetching index 13 of Labels raises KeyError: 13" in outcome.detail
    assert "in __getitem__: `label = self.names[index]`" in outcome.detail
    assert outcome.facts["first_batch"] == 3


def test_workers0_rerun_reports_where_a_fetch_blocks():
    lock = threading.Lock()
    lock.acquire()
    try:
        loader = DataLoader(Blocking(lock), batch_size=2, num_workers=2)
        ctx = ProbeContext(incident=Incident(kind="hang", source="run"), loader=loader, time_limit_s=2.0)
        outcome = workers0_rerun(ctx)
    finally:
        lock.release()
    assert outcome.status == "confirmed"
    assert "index 5 of Blocking has not returned after" in outcome.detail
    assert "in __getitem__: `with self.lock:`" in outcome.detail


def test_workers0_rerun_refutes_a_data_bug_when_the_main_process_fetches_cleanly():
    loader = DataLoader(Big(), batch_size=2, num_workers=2)
    info_message = "Caught OSError in DataLoader worker process 1.\nOriginal Traceback (most recent call last):"
    from triage.incident import ExceptionInfo

    info = ExceptionInfo("OSError", info_message)
    ctx = ProbeContext(incident=Incident(source="run", exception=info, exceptions=[info]), loader=loader)
    outcome = workers0_rerun(ctx)
    assert outcome.status == "refuted"
    assert "fetched 4 batches (8 samples) of Big without error" in outcome.detail


def test_workers0_rerun_estimates_shared_memory_for_a_bus_error(monkeypatch):
    class TinyShm:
        f_blocks, f_bavail, f_frsize = 256, 256, 4096  # 1 MiB of /dev/shm

    monkeypatch.setattr(workers0_module.os, "statvfs", lambda path: TinyShm)
    loader = DataLoader(Big(), batch_size=2, num_workers=2, prefetch_factor=4)
    incident = Incident(source="run", log_lines=[
        "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm)."])
    outcome = workers0_rerun(ProbeContext(incident=incident, loader=loader))
    assert outcome.status == "confirmed"
    assert "each batch is 0.5 MB; 2 workers × prefetch_factor 4 keep 4.0 MB in shared memory; /dev/shm has 1.0 MB" \
        in outcome.detail


class SlowRead(Dataset):
    """Index 3 stalls for longer than the DataLoader's timeout."""

    def __len__(self):
        return 6

    def __getitem__(self, index):
        if index == 3:
            time.sleep(0.6)
        return torch.tensor([float(index)])


def _timeout_incident(seconds: int) -> Incident:
    from triage.incident import ExceptionInfo

    info = ExceptionInfo("RuntimeError", f"DataLoader timed out after {seconds} seconds")
    return Incident(source="run", exception=info, exceptions=[info])


def test_workers0_rerun_times_each_batch_against_the_loaders_timeout():
    loader = DataLoader(SlowRead(), batch_size=2, num_workers=2, timeout=0.3)  # torch says "after 0 seconds"
    outcome = workers0_rerun(ProbeContext(incident=_timeout_incident(0), loader=loader, time_limit_s=5.0))
    assert outcome.status == "confirmed", outcome.detail
    assert "the batch of indices [2, 3] of SlowRead takes 0.6" in outcome.detail
    assert "over the DataLoader's timeout=0.3; past the timeout it was at" in outcome.detail
    assert "in __getitem__: `time.sleep(0.6)`" in outcome.detail

    patient = DataLoader(SlowRead(), batch_size=2, num_workers=2, timeout=5)
    outcome = workers0_rerun(ProbeContext(incident=_timeout_incident(5), loader=patient, time_limit_s=5.0))
    assert outcome.status == "refuted", outcome.detail
    assert "the slowest in 0.6" in outcome.detail and "under the DataLoader's timeout=5" in outcome.detail


def test_workers0_rerun_skips_without_a_loader():
    assert workers0_rerun(ProbeContext(incident=Incident())).status == "skipped"


Pair = namedtuple("Pair", "image label")


def test_save_batch_writes_a_weights_only_file_that_replays(tmp_path):
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    batch = {"image": torch.randn(2, 3), "meta": [torch.tensor([1, 2]), ("a", 7)], "pair": Pair(torch.ones(1), 4),
             "opaque": object()}
    ctx = ProbeContext(incident=Incident(source="run"), report_dir=tmp_path, batch=batch, batch_index=12, step=11)
    guard = StateGuard(allowed=tmp_path, folder=tmp_path.parent)
    outcome = save_batch(ctx)
    guard.assert_unchanged()
    assert outcome.status == "confirmed"
    path = tmp_path / "batch.pt"
    assert outcome.artifacts == [str(path)]
    assert "saved batch 12 (step 11)" in outcome.detail and "replay with `python -m triage --replay" in outcome.detail
    assert "batch['opaque']: object not saved" in outcome.detail
    payload = torch.load(path, weights_only=True)
    assert torch.equal(payload["batch"]["image"], batch["image"])
    assert payload["batch"]["pair"][1] == 4 and payload["batch"]["meta"][1] == ("a", 7)

    replay = load_replay(tmp_path)
    assert replay.batch_index == 12 and replay.step == 11
    expected_next = torch.rand(3)  # what the RNG gives after the state saved at the failure
    torch.manual_seed(99)
    loader = DataLoader(torch.arange(6.0), batch_size=3)
    undo = feed_first(replay)
    try:
        batches = list(loader)
    finally:
        undo()
    assert torch.equal(batches[0]["image"], batch["image"])  # the saved batch comes first
    assert [b.tolist() for b in batches[1:]] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    replay.restore_rng()
    assert torch.equal(torch.rand(3), expected_next)
    assert len(list(loader)) == 2  # undone: the loader is itself again


def test_save_batch_falls_back_to_the_failing_calls_arguments(tmp_path):
    ctx = ProbeContext(incident=Incident(source="run"), report_dir=tmp_path, model_args=(torch.ones(2, 2),))
    outcome = save_batch(ctx)
    assert outcome.status == "confirmed"
    assert "saved the failing call's arguments" in outcome.detail
    saved = torch.load(tmp_path / "step_inputs.pt", weights_only=True)
    assert torch.equal(saved["batch"]["args"][0], torch.ones(2, 2))
    with pytest.raises(ReplayError, match="not a DataLoader's batch"):  # no DataLoader to feed them to
        load_replay(tmp_path)


def test_save_batch_saves_sparse_arguments(tmp_path):
    # A GCN's features and adjacency matrix are sparse COO tensors: they have no storage to measure or share.
    features = torch.eye(3).to_sparse()
    ctx = ProbeContext(incident=Incident(source="run"), report_dir=tmp_path, model_args=(features,))
    outcome = save_batch(ctx)
    assert outcome.status == "confirmed", outcome.detail
    saved = torch.load(tmp_path / "step_inputs.pt", weights_only=True)
    assert torch.equal(saved["batch"]["args"][0].to_dense(), torch.eye(3))


def test_save_batch_skips_without_a_batch_or_a_folder(tmp_path, monkeypatch):
    assert save_batch(ProbeContext(incident=Incident(), batch=torch.ones(1))).status == "skipped"
    skipped = save_batch(ProbeContext(incident=Incident(), report_dir=tmp_path))
    assert skipped.status == "skipped" and "use `triage.track(loader)`" in skipped.detail
    monkeypatch.setattr(tracking, "capture_owner", "runner")  # the runner follows every DataLoader itself
    skipped = save_batch(ProbeContext(incident=Incident(), report_dir=tmp_path))
    assert skipped.detail == ("no batch known, and no model call failed: no DataLoader yielded a batch in this run; "
                              "no live frame of the user's code to read the failing loop from")
    with pytest.raises(ReplayError, match="no saved batch"):
        load_replay(tmp_path)


def test_workers0_rerun_does_not_refetch_what_killed_a_worker():
    """Fetching a SIGKILLed worker's samples again in this process could kill the report with it."""
    loader = DataLoader(Big(), batch_size=2, num_workers=2)
    incident = Incident(source="run", log_lines=["RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed."])
    outcome = workers0_rerun(ProbeContext(incident=incident, loader=loader))
    assert outcome.status == "skipped"
    assert "killed by signal" in outcome.detail


def test_save_batch_keeps_a_batch_over_its_budget_to_its_first_rows(tmp_path, monkeypatch):
    from triage.probes import save_batch as save_batch_module

    monkeypatch.setattr(save_batch_module, "SAVE_LIMIT_BYTES", 1000)
    inputs, labels = torch.randn(100, 10), torch.arange(100)  # 4000 + 800 bytes: a fifth of the rows fit
    ctx = ProbeContext(incident=Incident(source="run"), report_dir=tmp_path, batch=(inputs, labels), batch_index=2)
    outcome = save_batch(ctx)
    assert outcome.status == "confirmed", outcome.detail
    assert "cut to its first 20 of 100 rows" in outcome.detail
    saved = torch.load(tmp_path / "batch.pt", weights_only=True)["batch"]
    assert torch.equal(saved[0], inputs[:20]) and torch.equal(saved[1], labels[:20])  # the rows still belong together
    assert saved[0].untyped_storage().nbytes() == 20 * 10 * 4  # the slice, not the storage it is a view of
