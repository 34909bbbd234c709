"""Replay a saved failing batch: `python -m triage --replay REPORT_DIR script.py` feeds it to the script first.

`load_replay(dir)` reads `<dir>/batch.pt` (written by the save_batch probe)
with weights_only=True. `feed_first(replay)` makes the first batch any
DataLoader iterator yields in this process the saved one (then the loader goes
on as usual) and, at that moment, puts back the RNG states saved at the
failure, so dropout and augmentation draw what they drew then.
"""

from __future__ import annotations

import os
import random
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


class ReplayError(Exception):
    """Raised when a report folder has no usable saved batch; the message says why."""


@dataclass
class Replay:
    """A saved batch with where it came from and the RNG states at the failure."""

    batch: Any
    batch_index: int | None
    step: int | None
    rng: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    def restore_rng(self) -> None:
        """Put back the Python, NumPy, torch (and CUDA, when saved and present) RNG states."""
        import torch

        if "python" in self.rng:
            version, internal, gauss = self.rng["python"]
            random.setstate((version, tuple(internal), gauss))
        if "torch" in self.rng:
            torch.set_rng_state(self.rng["torch"])
        numpy = sys.modules.get("numpy")
        if numpy is not None and "numpy" in self.rng:
            name, keys, pos, has_gauss, cached = self.rng["numpy"]
            numpy.random.set_state((name, keys.numpy().astype("uint32"), pos, has_gauss, cached))
        if "cuda" in self.rng and torch.cuda.is_available():
            states = self.rng["cuda"]
            if len(states) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(states)


def load_replay(directory: str | Path) -> Replay:
    """The saved batch of a report folder (or of a batch.pt file given directly)."""
    import torch

    from .probes.save_batch import FILENAME, FORMAT, INPUTS_FILENAME

    path = Path(directory)
    if path.is_dir():
        path = path / FILENAME
    if not path.is_file():
        if (path.parent / INPUTS_FILENAME).is_file():
            raise ReplayError(f"{path.parent} holds the failing step's inputs ({INPUTS_FILENAME}), not a DataLoader's "
                              f"batch: there is nothing to feed them to")
        raise ReplayError(f"{path}: no saved batch (the save_batch probe writes it when a run fails with a batch)")
    try:
        payload = torch.load(path, weights_only=True)
    except Exception as exc:
        raise ReplayError(f"{path}: cannot be read: {type(exc).__name__}: {exc}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ReplayError(f"{path}: not a triage batch file (expected format {FORMAT})")
    return Replay(payload.get("batch"), payload.get("batch_index"), payload.get("step"),
                  dict(payload.get("rng") or {}), path)


def feed_first(replay: Replay) -> Callable[[], None]:
    """Make the next DataLoader batch in this process the saved one; returns a function that undoes it."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    original = _BaseDataLoaderIter.__next__
    pending = [True]

    def __next__(self):
        if pending and pending.pop():
            replay.restore_rng()
            return replay.batch
        return original(self)

    __next__._triage_replay = True  # type: ignore[attr-defined]
    _BaseDataLoaderIter.__next__ = __next__

    def undo() -> None:
        pending.clear()
        if _BaseDataLoaderIter.__next__ is __next__:
            _BaseDataLoaderIter.__next__ = original

    return undo


def rerun_commands(
    target: str | None,
    args: list[str],
    *,
    module: bool = False,
    report_dir: str | os.PathLike | None = None,
    cwd: str | None = None,
) -> dict[str, str | None] | None:
    """The commands that re-run a failed script under triage, to check a fix.

    `command` re-runs the whole script: it checks any fix, one to the data included.
    `replay` (when the folder holds the failing batch) feeds that batch first, so a
    fix to the model or the training step is checked at the first step; it cannot
    check a fix to the data, which the saved batch predates. Paths are shown from
    `cwd` (where the run was started) and secret-named options are scrubbed, since
    the commands go into the report. None when there is no script to name (an
    interactive session, `python -c`).
    """
    from .capture.secrets import scrub_argv
    from .report_dir import shown_path

    cwd = cwd or os.getcwd()
    if not target or target in ("-c", "-"):
        return None
    if not module and not os.path.isfile(os.path.join(cwd, target)):
        return None
    script = ["-m", target] if module else [shown_path(Path(cwd, target), cwd)]
    script += scrub_argv(list(args))
    replay = None
    if report_dir is not None and (Path(cwd, report_dir) / "batch.pt").is_file():
        replay = shlex.join(["python", "-m", "triage", "--replay", shown_path(Path(cwd, report_dir), cwd), *script])
    return {"command": shlex.join(["python", "-m", "triage", *script]), "replay": replay}
