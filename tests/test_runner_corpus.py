"""Every script in corpus/scripts/ under `python -m triage`: its exit status and its leading diagnosis.

The scripts run two at a time in one fixture (each imports torch); the
parametrised tests then check one script each. Set TRIAGE_CORPUS_PLAIN=1 to
also run each under plain python and check the recorded exit status.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from triage.evaluate import REQUIREMENTS, expectation_here

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "corpus" / "scripts"
# Every script by its path under corpus/scripts/, from the expected.yaml beside it.
EXPECTED: dict = {
    (listing.parent / name).relative_to(SCRIPTS).as_posix(): spec
    for listing in sorted(SCRIPTS.rglob("expected.yaml"))
    for name, spec in (yaml.safe_load(listing.read_text()) or {}).items()
}
TIMEOUT = 120


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS")}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TRIAGE_DEBUG"] = "1"
    return env


def _run(name: str, spec: dict, folder: Path, cwd: Path) -> dict:
    # --json holds the report of what ended the run, as `triage eval` reads it (an earlier NaN check's report has
    # its own folder, report-2 after it).
    command = [sys.executable, "-m", "triage", *spec.get("options", []), "--report-dir", str(folder / "report"),
               "--json", str(folder / "report.json"), str(SCRIPTS / name), *spec.get("args", [])]  # fmt: skip
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT, env=_env())
    outcome = {"code": result.returncode, "stdout": result.stdout, "stderr": result.stderr}
    if os.environ.get("TRIAGE_CORPUS_PLAIN") and "options" not in spec:
        plain = subprocess.run([sys.executable, str(SCRIPTS / name), *spec.get("args", [])], cwd=cwd,
                               capture_output=True, text=True, timeout=TIMEOUT, env=_env())  # fmt: skip
        outcome["plain"] = {"code": plain.returncode, "stdout": plain.stdout, "stderr": plain.stderr}
    return outcome


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[dict, Path]]:
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("corpus")
    # Each script runs from its own folder, as a user would run it (and as `triage eval` does); the reports go
    # elsewhere so the corpus stays clean.
    folders = {name: root / name.removesuffix(".py") for name, spec in EXPECTED.items()
               if expectation_here(spec) is not None}
    for folder in folders.values():
        folder.mkdir(parents=True)
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(_run, name, spec, folders[name], (SCRIPTS / name).parent)
                   for name, spec in EXPECTED.items() if name in folders}
        return {name: (future.result(), folders[name]) for name, future in futures.items()}


def test_every_script_is_listed() -> None:
    # corpus/scripts/distributed/ holds torchrun jobs, listed in corpus/logs/distributed-jobs/labels.yaml.
    scripts = {path.relative_to(SCRIPTS).as_posix() for path in SCRIPTS.rglob("*.py") if path.parent.name != "distributed"}
    assert scripts == set(EXPECTED), "corpus/scripts/*.py and expected.yaml disagree"
    assert len([s for s in EXPECTED.values() if s.get("category")]) >= 60
    for name, spec in EXPECTED.items():
        assert "exit_code" in spec and "category" in spec, name
        assert spec.get("requires", "cuda") in REQUIREMENTS and ("otherwise" not in spec or "requires" in spec), name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_script(outcomes, name: str) -> None:
    spec = expectation_here(EXPECTED[name])
    if spec is None:
        pytest.skip("labelled for no machine like this one (a CPU-only script, a CUDA build without a GPU)")
    outcome, folder = outcomes[name]
    failing_here = spec.get("category") is not None
    expected_code = spec["exit_code"]
    assert outcome["code"] == expected_code, outcome["stderr"][-3000:]
    if "plain" in outcome:
        assert outcome["plain"]["code"] == expected_code
        assert outcome["plain"]["stdout"] == outcome["stdout"]
    report_json = folder / "report.json"
    if not failing_here:
        assert not (folder / "report").exists() and "triage:" not in outcome["stderr"], outcome["stderr"][-2000:]
        return
    report = json.loads(report_json.read_text())
    assert report["schema"] == "triage.report/1" and report["source"] == "run"
    assert "triage: report written to" in outcome["stderr"]
    assert report["diagnoses"], f"no rule matched {name}"
    leading = report["diagnoses"][0]
    verified = {fix["id"] for fix in leading["fixes"] if fix["verdict"] == "verified"}
    # What the diagnosis states, as `triage eval` reads it: its texts and its experiments' results.
    text = " ".join([leading["title"], leading["hypothesis"], leading["fix"], *leading["evidence"],
                     *(probe["detail"] for probe in leading["probes"])])
    as_labelled = (leading["category"] == spec["category"] and leading["rule"] == spec.get("rule", leading["rule"])
                   and leading["cause"] == spec.get("cause_id", leading["cause"])
                   and spec.get("fix_id", leading["fix_id"]) in {leading["fix_id"], *verified}
                   and all(fact in text for fact in spec.get("facts", [])))
    if spec.get("known_issue") and not as_labelled:
        pytest.xfail(spec["known_issue"])
    assert leading["category"] == spec["category"]
    if spec.get("rule"):
        assert leading["rule"] == spec["rule"]
    if spec.get("cause_id"):
        assert leading["cause"] == spec["cause_id"], leading["hypothesis"]
    if spec.get("fix_id"):
        assert spec["fix_id"] in {leading["fix_id"], *verified}, leading["fixes"]
    for fact in spec.get("facts", []):
        assert fact in text, f"{fact!r} not in the leading diagnosis of {name}"


@pytest.mark.parametrize(("here", "gpu_script", "cpu_build_script"), [
    ({"cuda-build": False, "cuda": False}, "otherwise", "labelled"),  # CI: a CPU build
    ({"cuda-build": True, "cuda": True}, "labelled", "succeeds"),  # a GPU machine
    ({"cuda-build": True, "cuda": False}, "otherwise", None),  # a CUDA build without a GPU
])
def test_a_scripts_expectation_follows_the_machine(monkeypatch, here, gpu_script, cpu_build_script) -> None:
    from triage import evaluate

    monkeypatch.setattr(evaluate, "torch_here", lambda: here)
    labelled = {"category": "cuda-assert", "rule": "cuda-assert.device-side-assert", "exit_code": 1}
    otherwise = {"category": "index", "exit_code": 1}
    kinds = {"labelled": labelled, "otherwise": otherwise, "succeeds": {"category": None, "exit_code": 0}, None: None}
    for spec, want in (({**labelled, "requires": "cuda", "otherwise": otherwise}, gpu_script),
                       ({**labelled, "requires": "cpu-build"}, cpu_build_script)):
        got = expectation_here(spec)
        if kinds[want] is None:
            assert got is None
        else:
            assert {key: got[key] for key in kinds[want]} == kinds[want], (spec, here)
