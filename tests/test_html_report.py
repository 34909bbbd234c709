"""report.html: the page and its SVG charts from a report's data, and a real render in headless Chromium.

The Chromium test needs the `chromium` binary (Debian: `apt-get install -y chromium`); without it the test is
skipped with that reason.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from triage.diagnosis import Diagnosis, ProbeResult, Report
from triage.incident import Incident
from triage.kb import diagnose, load_knowledge_base
from triage.report_dir import write_report
from triage.render_html import gradient_flow_chart, line_chart, to_html

CHART_IDS = ("loss", "grad_norm", "memory", "gradient_flow")


def _silent_report() -> Report:
    line = ("triage: silent: memory-growing: process memory (RSS) grew 120.0 MiB over 100 steps (1.200 MiB per step, "
            "linear fit R2=1.00; watched 120 steps; threshold: 32 MiB and R2 >= 0.9); held by: `val_history`, a list of "
            "120 tensors with grad_fn (each keeps its step's autograd graph alive)")
    health = {
        "findings": [{"check": "memory-growing", "line": line}],
        "loss": [[step, 1.0 / step + 0.1] for step in range(1, 121)],
        "grad_norm": [[step, 2.0 / step] for step in range(8, 121, 8)],
        "memory": [[step, (300 + 1.2 * step) * 2**20] for step in range(1, 121)],
        "memory_kind": "rss",
        "gradient_flow": [{"name": "model.0.weight", "mean": 1e-3, "max": 2e-2, "has_grad": True},
                          {"name": "model.0.bias", "mean": 0.0, "max": 0.0, "has_grad": True},
                          {"name": "encoder.weight", "mean": 0.0, "max": 0.0, "has_grad": False}],
    }
    incident = Incident(kind="silent", source="run", log_lines=[line], facts={"health": health})
    return Report(source="run", incident=incident, diagnoses=diagnose(incident, load_knowledge_base([])))


def test_the_page_holds_the_diagnosis_and_every_chart_and_nothing_from_the_network():
    page = to_html(_silent_report())
    assert "learning.memory-held-by-graphs" in page and "val_history" in page
    for chart in CHART_IDS:
        assert f'id="chart-{chart}"' in page
    assert page.count("<svg") == len(CHART_IDS)
    assert not re.search(r'(?:src|href)\s*=\s*"(?:https?:)?//', page) and "<script" not in page


def test_user_text_is_escaped():
    report = _silent_report()
    report.diagnoses[0].title = "<img src=x onerror=alert(1)>"
    assert "<img src=x" not in to_html(report)


def test_line_chart_switches_to_a_log_axis_for_a_diverging_loss():
    svg = line_chart([[step, 10.0 ** step] for step in range(1, 20)], "Loss per step", "loss")
    assert "loss (log)" in svg and "<path" in svg
    assert "(log)" not in line_chart([[1, 0.5], [2, 0.4], [3, 0.3]], "Loss per step", "loss")


def test_gradient_flow_marks_exactly_zero_and_missing_gradients():
    svg = gradient_flow_chart(_silent_report().incident.facts["health"]["gradient_flow"])
    assert svg.count('class="bar-mean"') == 1
    assert "0 (exactly)" in svg and "no gradient" in svg


def test_a_shape_error_report_draws_the_module_boundaries():
    trace = ["features.0 (Conv2d): [8, 3, 32, 32] -> [8, 16, 30, 30]",
             "features.1 (ReLU): [8, 16, 30, 30] -> [8, 16, 30, 30]",
             "fc1 (Linear): [8, 14400] -> raised"]
    diagnosis = Diagnosis(rule="shape.linear-in-features", category="shape", confidence=0.9, title="t", hypothesis="h",
                          fix="f", probes=[ProbeResult("shape_trace", "confirmed", "d", facts={"trace": trace})])
    page = to_html(Report(source="run", incident=Incident(), diagnoses=[diagnosis]))
    assert 'id="chart-shapes"' in page and "[8, 14400]" in page and 'class="module failed"' in page


def _screenshot(page: Path, shot: Path) -> int:
    """Render `page` in headless Chromium into `shot`; returns the PNG's size in bytes."""
    subprocess.run([*CHROMIUM, f"--screenshot={shot}", "--window-size=1200,1600", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return shot.stat().st_size


CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="needs the chromium binary (Debian/Ubuntu: apt-get install -y chromium)")
def test_headless_chromium_renders_every_chart(tmp_path):
    page = Path(write_report(_silent_report(), tmp_path)["report_html"])  # the one writer lays it out
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>", encoding="utf-8")
    # A page that failed to render is as blank as an empty one, whose PNG compresses to almost nothing.
    assert _screenshot(page, tmp_path / "report.png") > 5 * _screenshot(blank, tmp_path / "blank.png")
    dom = subprocess.run([*CHROMIUM, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    for chart in CHART_IDS:
        assert re.search(rf'<figure id="chart-{chart}"><svg[^>]*class="chart', dom), chart
    assert dom.count("<path") >= 3 and "learning.memory-held-by-graphs" in dom
