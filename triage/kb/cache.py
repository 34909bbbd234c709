"""A cache of validated rule layers, so that start-up does not re-validate unchanged rule files.

Validation parses every template to check the names it uses, which costs far more than
matching; the result depends only on the rule files and on this engine, so it is keyed
by their paths, sizes and modification times. Any failure to read or write the cache
falls back to loading the files. The cache keeps the MAX_ENTRIES entries used last
(a hit refreshes an entry's time) and prunes the rest whenever it writes a new one.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")
MAX_ENTRIES = 32  # a few hundred kB each: every project folder and rule layer has its own
STALE_TEMP_S = 3600.0  # a temporary file this old was left by a process that died mid-write
_ENGINE_FILES = ("rule.py", "loader.py", "yamlpos.py", "templates.py", "safe_regex.py", "cache.py")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "triage"


def cached(files: list[Path], salt: str, build: Callable[[], T]) -> T:
    """`build()`, or its stored result from an earlier run with the same files and engine."""
    if os.environ.get("TRIAGE_NO_CACHE"):
        return build()
    key = _key(files, salt)
    if key is None:
        return build()
    path = cache_dir() / f"kb-{key}.pickle"
    try:
        with open(path, "rb") as handle:
            value = pickle.load(handle)
        _touch(path)
        return value
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, TypeError, ValueError):
        pass
    value = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        import tempfile  # only on a cache miss

        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as handle:
            pickle.dump(value, handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(handle.name, path)
    except OSError:
        return value  # a read-only home is no reason to fail
    prune(path.parent, keep=path)
    return value


def prune(folder: Path, keep: Path | None = None, max_entries: int = MAX_ENTRIES) -> None:
    """Delete all but the `max_entries` most recently used entries (never `keep`), and stale temporary files."""
    import time

    entries = []
    for path in folder.glob("kb-*.pickle"):
        try:
            entries.append((path.stat().st_mtime, path))
        except OSError:
            continue
    entries.sort(reverse=True)
    doomed = [path for _, path in entries[max_entries:] if path != keep]
    now = time.time()
    for path in folder.glob("*.tmp"):
        try:
            if now - path.stat().st_mtime > STALE_TEMP_S:
                doomed.append(path)
        except OSError:
            continue
    for path in doomed:
        try:
            path.unlink()
        except OSError:
            pass  # another process pruned it first, or the folder is read-only


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def _key(files: list[Path], salt: str) -> str | None:
    from ..probe_registry import PROBES
    from ..probe_registry import registered_probes
    from ..version import __version__

    engine = Path(__file__).resolve().parent
    # Probes installed through entry points change validation too, but scanning every installed
    # distribution costs more than the cache saves; installing or removing a package changes
    # its site folder's modification time instead, so those times stand in for the scan.
    probes = sorted(PROBES) + sorted(registered_probes())
    digest = hashlib.sha256(f"{__version__}\0{salt}\0{probes}\0{Path.cwd()}".encode())
    digest.update(f"{sys.path}\0".encode())  # a folder added to the path may bring entry points
    for folder in sys.path:
        if "-packages" not in folder:
            continue  # the script's own folder changes whenever it writes a checkpoint; only package folders count
        try:
            digest.update(f"{folder}\0{os.stat(folder or '.').st_mtime_ns}\0".encode())
        except OSError:
            continue
    try:
        for path in [*files, *(engine / name for name in _ENGINE_FILES)]:
            info = path.stat()
            digest.update(f"{path.resolve()}\0{info.st_size}\0{info.st_mtime_ns}\0".encode())
    except OSError:
        return None
    return digest.hexdigest()[:32]
