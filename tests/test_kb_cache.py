"""The rule cache: a hit returns the stored layers, and the folder stays bounded."""

from __future__ import annotations

import os

from triage.kb import cache


def test_a_second_call_with_the_same_files_is_served_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("TRIAGE_NO_CACHE", raising=False)
    rule_file = tmp_path / "team.yaml"
    rule_file.write_text("[]\n")
    builds = []
    first = cache.cached([rule_file], "salt", lambda: builds.append(1) or {"rules": 1})
    second = cache.cached([rule_file], "salt", lambda: builds.append(1) or {"rules": 2})
    assert first == second == {"rules": 1}
    assert builds == [1]


def test_the_cache_keeps_only_the_most_recently_used_entries(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("TRIAGE_NO_CACHE", raising=False)
    rule_file = tmp_path / "team.yaml"
    rule_file.write_text("[]\n")
    cache.cached([rule_file], "salt-0", lambda: 0)
    folder = cache.cache_dir()
    [oldest] = folder.glob("kb-*.pickle")
    os.utime(oldest, (1, 1))  # long unused, then used again: a hit makes it recent
    assert cache.cached([rule_file], "salt-0", lambda: "rebuilt") == 0
    for number in range(1, cache.MAX_ENTRIES + 10):
        cache.cached([rule_file], f"salt-{number}", lambda number=number: number)
    entries = list(folder.glob("kb-*.pickle"))
    assert len(entries) == cache.MAX_ENTRIES
    assert cache.cached([rule_file], f"salt-{cache.MAX_ENTRIES + 9}", lambda: "rebuilt") == cache.MAX_ENTRIES + 9
    assert cache.cached([rule_file], "salt-1", lambda: "rebuilt") == "rebuilt"  # pruned long ago
