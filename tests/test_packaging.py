"""A non-editable install carries every rule file."""

import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import ROOT


def test_wheel_ships_every_rule_file(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    [wheel] = tmp_path.glob("torch_triage-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    rule_files = sorted(p.name for p in (ROOT / "knowledge_base").glob("*.yaml"))
    assert rule_files
    for name in rule_files:
        assert f"triage/knowledge_base/{name}" in names
    assert "triage/cli.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "triage = triage.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
