"""The corpus is the scoreboard: explain's accuracy on corpus/logs and corpus/logs-fresh never drops below the committed figures."""

import pytest
import yaml
from conftest import ROOT

from triage.evaluate import CaseResult, _probe_lines, evaluate_logs, format_table, score
from triage.kb import load_knowledge_base


@pytest.mark.parametrize(("section", "folder"), [("logs", "logs"), ("fresh", "logs-fresh")])
def test_log_accuracy_holds_the_committed_line(section, folder):
    floor = yaml.safe_load((ROOT / "corpus" / "scoreboard.yaml").read_text())[section]
    results = evaluate_logs(ROOT / "corpus" / folder, load_knowledge_base(env={}, cwd=ROOT))
    figures = score(results)
    table = format_table(results)
    assert figures.cases >= floor["min_cases"], table
    for name in ("top1", "top3", "rule_top1", "facts", "cause", "fix"):
        if name in floor:
            assert getattr(figures, name) >= floor[name] - 1e-9, f"{name}: {getattr(figures, name):.4f} < {floor[name]}\n{table}"
    assert figures.python_negatives_misread <= floor["python_negatives_misread"], table


def test_the_table_counts_the_experiments_that_confirmed_and_times_each_probe():
    results = [
        CaseResult("a.py", "script", "nan", "nan.x", probes=[("anomaly_rerun", "confirmed", "d", 0.5),
                                                              ("save_batch", "confirmed", "d", 0.1)]),
        CaseResult("b.py", "script", "nan", "nan.y", probes=[("anomaly_rerun", "skipped", "no frame", 1.5)]),
    ]
    lines = _probe_lines(results)
    assert lines[0] == "experiments named by the leading diagnosis: 2 of 3 confirmed (66.7%), in 2 scripts"
    assert lines[1] == "  b.py: anomaly_rerun skipped: no frame"
    assert lines[2] == "probe time, median / max seconds (runs): anomaly_rerun 1.00 / 1.50 (2), save_batch 0.10 / 0.10 (1)"


def test_gpu_scripts_run_one_at_a_time_beside_cpu_scripts(tmp_path, monkeypatch):
    """Two GPU scripts never share the card (an OOM script filling it fails the other for the wrong reason);
    CPU scripts still run beside them."""
    import threading
    import time

    from triage import evaluate

    folder = tmp_path / "scripts" / "gpu"
    folder.mkdir(parents=True)
    labels = {}
    for name, needs in [("a.py", "cuda"), ("b.py", "cuda"), ("c.py", None), ("d.py", "cuda")]:
        (folder / name).write_text("pass\n")
        labels[name] = {"category": None, "exit_code": 0} | ({"requires": needs} if needs else {})
    (folder / "expected.yaml").write_text(yaml.safe_dump(labels))
    monkeypatch.setattr(evaluate, "torch_here", lambda: {"cuda-build": True, "cuda": True})
    running, overlaps, lock = [], [], threading.Lock()

    def fake_run(path, expectation):
        with lock:
            running.append(path.name)
            overlaps.append(sorted(running))
        time.sleep(0.05)
        with lock:
            running.remove(path.name)
        return CaseResult(path=str(path), kind="script", expected_category=None, expected_rule=None)

    monkeypatch.setattr(evaluate, "_run_script", fake_run)
    evaluate.evaluate_scripts(tmp_path / "scripts", jobs=4)
    gpu_together = [names for names in overlaps if sum(n != "c.py" for n in names) > 1]
    assert gpu_together == [], gpu_together
    assert any("c.py" in names and len(names) > 1 for names in overlaps), overlaps
