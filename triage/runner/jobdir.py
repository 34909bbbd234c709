"""The shared folder of one torchrun job, where each rank's supervisor leaves a small record of how the rank ended.

A rank writes its record before anything slow (the first thing on an
incident, the stacks on the agent's SIGTERM, its exit status last), so a rank
the launcher stops mid-report still leaves its part. The folder is the one
`python -m triage torchrun ...` created (TRIAGE_JOB_DIR), or, under
`torchrun ... -m triage train.py`, one keyed by TORCHELASTIC_RUN_ID and the
agent's pid, which all ranks of the node find alone. Standard library only.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

JOB_DIR_ENV = "TRIAGE_JOB_DIR"
JOB_PARENT_ENV = "TRIAGE_JOB_PARENT"  # set when `python -m triage torchrun` writes the job's report itself


def job_dir(environ: dict[str, str] | None = None) -> Path | None:
    """This rank's job folder, or None when it is not a rank of a torchrun job."""
    environ = os.environ if environ is None else environ
    if environ.get(JOB_DIR_ENV):
        return Path(environ[JOB_DIR_ENV])
    run_id = environ.get("TORCHELASTIC_RUN_ID")
    if not run_id or not environ.get("RANK", "").isdigit():
        return None
    # The default run id is "none" on every job: the agent's pid tells this node's jobs apart.
    key = "".join(c if c.isalnum() or c in "-_" else "_" for c in f"{run_id}-{os.getppid()}")
    return Path(tempfile.gettempdir()) / f"triage-job-{key}"


def rank_of(environ: dict[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    value = environ.get("RANK", "")
    return int(value) if value.isdigit() else 0


def record_path(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.json"


def update_record(folder: Path, rank: int, create: bool = True, **fields: Any) -> None:
    """Merge `fields` into this rank's record, atomically (a reader never sees half a file). Without `create`, a
    folder already removed (the job's report written, the records in it) stays removed and the fields are dropped."""
    if create:
        folder.mkdir(parents=True, exist_ok=True)
    elif not folder.is_dir():
        return
    path = record_path(folder, rank)
    record = read_record(path) or {"rank": rank, "pid": os.getpid()}
    incidents = record.get("incidents", [])
    if "incident" in fields:
        incidents.append(fields.pop("incident"))
    record.update(fields)
    record["incidents"] = incidents
    temporary = path.with_suffix(f".tmp{os.getpid()}")
    try:
        temporary.write_text(json.dumps(record, default=str), encoding="utf-8")
        os.replace(temporary, path)
    except FileNotFoundError:
        if create:
            raise  # removed while this rank wrote: only a late write (create=False) may lose its fields


def record_incident(folder: Path, rank: int, incident_dict: dict[str, Any]) -> None:
    """The rank's incident, written before it is diagnosed: the launcher may stop the rank at any moment now."""
    update_record(folder, rank, incident={"at": time.time(), "incident": incident_dict})


def read_record(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_records(folder: Path) -> list[dict[str, Any]]:
    records = [read_record(path) for path in sorted(folder.glob("rank*.json"))]
    return [record for record in records if record]
