"""The rule cache: private to the test session, bounded, pruned by least recent use."""

from __future__ import annotations

import os
import time
from pathlib import Path

from triage.kb import cache


def test_the_suite_never_writes_the_users_cache(tmp_path):
    home_cache = Path(os.path.expanduser("~")) / ".cache"
    assert cache.cache_dir() != home_cache / "triage"
    assert Path(os.environ["XDG_CACHE_HOME"]).is_dir()


def _entries(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.glob("kb-*.pickle"))


def test_a_new_entry_prunes_the_least_recently_used(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = cache.cache_dir()
    folder.mkdir(parents=True)
    old = time.time() - 1000
    for number in range(cache.MAX_ENTRIES + 5):
        path = folder / f"kb-old{number:03d}.pickle"
        path.write_bytes(b"")
        os.utime(path, (old + number, old + number))  # old000 is the least recently used
    stale_temp = folder / "abandoned.tmp"
    stale_temp.write_bytes(b"")
    os.utime(stale_temp, (old - cache.STALE_TEMP_S, old - cache.STALE_TEMP_S))
    rules = tmp_path / "rules.yaml"
    rules.write_text("[]\n")

    assert cache.cached([rules], "salt", lambda: {"built": True}) == {"built": True}
    kept = _entries(folder)
    assert len(kept) == cache.MAX_ENTRIES
    assert "kb-old000.pickle" not in kept and "kb-old005.pickle" not in kept
    assert f"kb-old{cache.MAX_ENTRIES + 4:03d}.pickle" in kept
    assert not stale_temp.exists()
    assert cache.cached([rules], "salt", lambda: {"built": "again"}) == {"built": True}  # the new entry is a hit


def test_a_hit_counts_as_use(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    rules = tmp_path / "rules.yaml"
    rules.write_text("[]\n")
    cache.cached([rules], "salt", lambda: 1)
    [entry] = cache.cache_dir().glob("kb-*.pickle")
    long_ago = time.time() - 10_000
    os.utime(entry, (long_ago, long_ago))
    assert cache.cached([rules], "salt", lambda: 2) == 1
    assert entry.stat().st_mtime > long_ago + 9_000
