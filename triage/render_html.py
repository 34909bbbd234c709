"""report.html: one self-contained page (no script, no network) with the diagnosis, the experiments and inline SVG charts.

The charts are drawn here from the report's plain data: the training-health
series (loss, gradient norm, memory per step, gradient flow per layer) that a
`silent` incident carries in `facts["health"]`, and the module-boundary shapes
of a shape_trace experiment. Rendering only formats: nothing is measured here.
"""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

import jinja2

from .diagnosis import Report

WIDTH, HEIGHT = 520, 220
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 16, 28, 36
BAR_HEIGHT, BAR_GAP, BAR_LABEL = 14, 6, 200
MAX_BARS = 40
LOG_SCALE_SPAN = 1000.0  # a series spanning more than this factor is drawn on a log axis
_TRACE_LINE = re.compile(r"^(?P<label>.+?) \((?P<cls>[\w.]+)\): (?P<inputs>.*?) -> (?P<outputs>.*)$")
_STATUS_COLOURS = {"confirmed": "#1a7f37", "refuted": "#8250df", "inconclusive": "#9a6700", "skipped": "#57606a",
                   "error": "#cf222e"}


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e5 or magnitude < 1e-3:
        return f"{value:.2g}"
    return f"{value:.4g}"


def _ticks(low: float, high: float, count: int = 4) -> list[float]:
    if high <= low:
        return [low]
    return [low + (high - low) * i / count for i in range(count + 1)]


def line_chart(points: Sequence[Sequence[float]], title: str, y_label: str, x_label: str = "step",
               scale: float = 1.0, css_class: str = "chart") -> str:
    """An SVG line chart of (x, y) points; a log y axis when the values span more than LOG_SCALE_SPAN."""
    finite = [(float(x), float(y) / scale) for x, y in points if math.isfinite(float(y))]
    if not finite:
        return ""
    xs, ys = [x for x, _ in finite], [y for _, y in finite]
    positive = all(y > 0 for y in ys)
    log = positive and max(ys) / min(ys) > LOG_SCALE_SPAN
    transform = (lambda v: math.log10(v)) if log else (lambda v: v)
    tys = [transform(y) for y in ys]
    x_low, x_high = min(xs), max(xs)
    y_low, y_high = min(tys), max(tys)
    if y_high == y_low:
        y_low, y_high = y_low - 1 if y_low == 0 else y_low * 0.95, y_high + 1 if y_high == 0 else y_high * 1.05
        y_low, y_high = min(y_low, y_high), max(y_low, y_high)
    if x_high == x_low:
        x_high = x_low + 1
    plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM

    def px(x: float) -> float:
        return MARGIN_LEFT + (x - x_low) / (x_high - x_low) * plot_w

    def py(y: float) -> float:
        return MARGIN_TOP + plot_h - (y - y_low) / (y_high - y_low) * plot_h

    path = " ".join(f"{'M' if i == 0 else 'L'}{px(x):.1f},{py(y):.1f}" for i, (x, y) in enumerate(zip(xs, tys)))
    parts = [f'<svg class="{css_class}" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{_escape(title)}">',
             f'<title>{_escape(title)}</title>',
             f'<text x="{MARGIN_LEFT}" y="16" class="chart-title">{_escape(title)}</text>',
             f'<rect x="{MARGIN_LEFT}" y="{MARGIN_TOP}" width="{plot_w}" height="{plot_h}" class="plot"/>']
    for tick in _ticks(y_low, y_high):
        label = _fmt(10 ** tick) if log else _fmt(tick)
        parts.append(f'<line x1="{MARGIN_LEFT}" x2="{WIDTH - MARGIN_RIGHT}" y1="{py(tick):.1f}" y2="{py(tick):.1f}" class="grid"/>')
        parts.append(f'<text x="{MARGIN_LEFT - 6}" y="{py(tick) + 4:.1f}" class="tick" text-anchor="end">{label}</text>')
    for tick in _ticks(x_low, x_high):
        parts.append(f'<text x="{px(tick):.1f}" y="{HEIGHT - MARGIN_BOTTOM + 16}" class="tick" text-anchor="middle">{tick:.0f}</text>')
    parts.append(f'<text x="{WIDTH - MARGIN_RIGHT}" y="{HEIGHT - 4}" class="axis" text-anchor="end">{_escape(x_label)}</text>')
    parts.append(f'<text x="4" y="{MARGIN_TOP - 8}" class="axis">{_escape(y_label)}{" (log)" if log else ""}</text>')
    parts.append(f'<path d="{path}" class="line"/>')
    if len(xs) <= 64:
        parts += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2" class="dot"/>' for x, y in zip(xs, tys)]
    parts.append("</svg>")
    return "".join(parts)


def gradient_flow_chart(rows: Sequence[dict[str, Any]], title: str = "Gradient flow: mean and max |grad| per parameter") -> str:
    """Horizontal bars on a log axis, one pair per parameter (max light, mean dark); exactly-zero gradients in red."""
    rows = list(rows)[:MAX_BARS]
    if not rows:
        return ""
    values = [v for row in rows for v in (row.get("mean", 0.0), row.get("max", 0.0)) if v and v > 0 and math.isfinite(v)]
    low = math.floor(math.log10(min(values))) if values else -8
    high = math.ceil(math.log10(max(values))) if values else 0
    high = max(high, low + 1)
    plot_w = WIDTH - BAR_LABEL - MARGIN_RIGHT
    height = MARGIN_TOP + len(rows) * (BAR_HEIGHT + BAR_GAP) + MARGIN_BOTTOM

    def bar(value: float) -> float:
        if not value or value <= 0 or not math.isfinite(value):
            return 0.0
        return max(1.0, (math.log10(value) - low) / (high - low) * plot_w)

    parts = [f'<svg class="chart gradient-flow" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{_escape(title)}">',
             f'<title>{_escape(title)}</title>',
             f'<text x="4" y="16" class="chart-title">{_escape(title)}</text>']
    for exponent in range(low, high + 1):
        x = BAR_LABEL + (exponent - low) / (high - low) * plot_w
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{MARGIN_TOP - 4}" y2="{height - MARGIN_BOTTOM}" class="grid"/>')
        parts.append(f'<text x="{x:.1f}" y="{height - MARGIN_BOTTOM + 14}" class="tick" text-anchor="middle">1e{exponent}</text>')
    for index, row in enumerate(rows):
        y = MARGIN_TOP + index * (BAR_HEIGHT + BAR_GAP)
        name = str(row.get("name", "?"))
        dead = not row.get("max")
        parts.append(f'<text x="{BAR_LABEL - 6}" y="{y + BAR_HEIGHT - 3}" class="label{" dead" if dead else ""}" '
                     f'text-anchor="end">{_escape(name[-32:])}</text>')
        if dead:
            parts.append(f'<text x="{BAR_LABEL + 4}" y="{y + BAR_HEIGHT - 3}" class="label dead">'
                         f'{"no gradient" if not row.get("has_grad", True) else "0 (exactly)"}</text>')
            continue
        parts.append(f'<rect x="{BAR_LABEL}" y="{y}" width="{bar(row["max"]):.1f}" height="{BAR_HEIGHT}" class="bar-max">'
                     f'<title>{_escape(name)} max |grad| {_fmt(row["max"])}</title></rect>')
        parts.append(f'<rect x="{BAR_LABEL}" y="{y + 3}" width="{bar(row["mean"]):.1f}" height="{BAR_HEIGHT - 6}" class="bar-mean">'
                     f'<title>{_escape(name)} mean |grad| {_fmt(row["mean"])}</title></rect>')
    parts.append(f'<text x="{WIDTH - MARGIN_RIGHT}" y="{height - 4}" class="axis" text-anchor="end">|grad| (log): '
                 f'mean dark, max light</text>')
    parts.append("</svg>")
    return "".join(parts)


def shape_flow_chart(trace: Sequence[str], title: str = "Shapes at each module boundary") -> str:
    """The shape_trace experiment's records as a column of boxes, input -> output; the layer that raised in red."""
    records = [m.groupdict() for m in (_TRACE_LINE.match(line) for line in trace) if m]
    if not records:
        return ""
    box_h, gap = 30, 10
    height = MARGIN_TOP + len(records) * (box_h + gap)
    parts = [f'<svg class="chart shape-flow" xmlns="http://www.w3.org/2000/svg" width="{WIDTH + 120}" height="{height}" '
             f'viewBox="0 0 {WIDTH + 120} {height}" role="img" aria-label="{_escape(title)}">',
             f'<title>{_escape(title)}</title>', f'<text x="4" y="16" class="chart-title">{_escape(title)}</text>']
    for index, record in enumerate(records):
        y = MARGIN_TOP + index * (box_h + gap)
        failed = record["outputs"] == "raised"
        parts.append(f'<rect x="200" y="{y}" width="240" height="{box_h}" rx="4" class="module{" failed" if failed else ""}"/>')
        parts.append(f'<text x="320" y="{y + 19}" class="label" text-anchor="middle">'
                     f'{_escape(record["label"][-24:])} ({_escape(record["cls"])})</text>')
        parts.append(f'<text x="192" y="{y + 19}" class="tick" text-anchor="end">{_escape(record["inputs"][:30])}</text>')
        parts.append(f'<text x="448" y="{y + 19}" class="tick{" dead" if failed else ""}">{_escape(record["outputs"][:34])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _escape(text: Any) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def charts(report: Report) -> list[dict[str, str]]:
    """Each chart the report's data supports, as {"id", "svg"}."""
    out: list[dict[str, str]] = []
    health = report.incident.facts.get("health") if isinstance(report.incident.facts, dict) else None
    if isinstance(health, dict):
        for key, title, label, scale in (("loss", "Loss per step", "loss", 1.0),
                                         ("grad_norm", "Gradient norm (all parameters)", "norm", 1.0),
                                         ("memory", "Memory per step" + (" (CUDA allocated)" if health.get("memory_kind") == "cuda_allocated" else " (process RSS)"),
                                          "MiB", 2.0 ** 20)):
            svg = line_chart(health.get(key) or [], title, label, scale=scale)
            if svg:
                out.append({"id": key, "svg": svg})
        svg = gradient_flow_chart(health.get("gradient_flow") or [])
        if svg:
            out.append({"id": "gradient_flow", "svg": svg})
    for diagnosis in report.diagnoses:
        for probe in diagnosis.probes:
            trace = probe.facts.get("trace") if isinstance(probe.facts, dict) else None
            if probe.name == "shape_trace" and trace:
                svg = shape_flow_chart(trace)
                if svg:
                    out.append({"id": "shapes", "svg": svg})
                return out
    return out


_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>triage report: {{ observed }}</title>
<style>
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1100px; color: #1f2328; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 24px 0 8px; border-bottom: 1px solid #d0d7de; }
code, pre { font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; background: #f6f8fa; }
pre { padding: 8px; overflow-x: auto; white-space: pre-wrap; }
.diagnosis { border: 1px solid #d0d7de; border-radius: 6px; padding: 10px 14px; margin: 10px 0; }
.diagnosis.lead { border-color: #0969da; border-width: 2px; }
.meta { color: #57606a; font-size: 12px; } .status { font-weight: 600; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; } .charts figure { margin: 0; }
.chart { background: #fff; border: 1px solid #d0d7de; border-radius: 6px; }
.chart-title { font: 600 13px system-ui, sans-serif; fill: #1f2328; }
.plot { fill: #fbfcfd; stroke: #d0d7de; } .grid { stroke: #eaeef2; } .tick, .axis { font: 11px system-ui, sans-serif; fill: #57606a; }
.line { fill: none; stroke: #0969da; stroke-width: 2; } .dot { fill: #0969da; }
.bar-max { fill: #a5d6ff; } .bar-mean { fill: #0969da; } .label { font: 11px ui-monospace, monospace; fill: #1f2328; }
.dead { fill: #cf222e; } .module { fill: #ddf4ff; stroke: #0969da; } .module.failed { fill: #ffebe9; stroke: #cf222e; }
</style></head>
<body>
<h1>triage report</h1>
<p class="meta">{{ source }} · incident kind <code>{{ kind }}</code>{% if environment %} · {{ environment }}{% endif %}</p>
<p><strong>Observed:</strong> <code>{{ observed }}</code></p>
{% if location %}<p><strong>Where:</strong> <code>{{ location }}</code></p>{% endif %}
<h2>Diagnosis</h2>
{% for d in diagnoses %}
<div class="diagnosis{% if loop.first %} lead{% endif %}">
<p><strong>{{ d.title }}</strong> <span class="meta">{{ d.category }} · {{ d.rule }} · {{ "%.0f"|format(d.confidence * 100) }}%</span></p>
<p>{{ d.hypothesis }}</p>
{% if d.evidence %}<ul>{% for e in d.evidence %}<li><code>{{ e }}</code></li>{% endfor %}</ul>{% endif %}
{% for p in d.probes %}<p>Experiment <code>{{ p.name }}</code>: <span class="status" style="color: {{ colours.get(p.status, '#1f2328') }}">{{ p.status }}</span>. {{ p.detail }}</p>{% endfor %}
{% if d.decide %}<p><strong>To decide</strong> {{ d.decide }}</p>{% endif %}
<p><strong>Fix</strong> {{ fix_text(d) }}</p>
{% for note in other_fixes(d) %}<p class="meta">{{ note }}</p>{% endfor %}
{% if d.verify %}<p><strong>Verify</strong> {{ d.verify }}</p>{% endif %}
</div>
{% else %}
<p>No rule in the knowledge base matched this incident.</p>
{% endfor %}
{% if charts %}
<h2>Charts</h2>
<div class="charts">{% for c in charts %}<figure id="chart-{{ c.id }}">{{ c.svg | safe }}</figure>{% endfor %}</div>
{% endif %}
{% if findings %}
<h2>Training-health checks</h2>
<ul>{% for f in findings %}<li><code>{{ f }}</code></li>{% endfor %}</ul>
{% elif log_lines %}
<h2>Log lines</h2>
<pre>{{ log_lines | join("\\n") }}</pre>
{% endif %}
</body></html>
"""


def to_html(report: Report) -> str:
    """The whole page, escaped by Jinja2's autoescape; the SVG charts are built here and marked safe."""
    from .render import _location, _observation, fix_text, other_fixes

    environment = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    template = environment.from_string(_TEMPLATE)
    incident = report.incident
    env = report.environment or incident.environment or {}
    versions = ", ".join(f"{key} {env[key]}" for key in ("python", "torch", "cuda") if env.get(key))
    health = incident.facts.get("health") if isinstance(incident.facts, dict) else None
    findings = [f.get("line", "") for f in health.get("findings", [])] if isinstance(health, dict) else []
    return template.render(
        source=report.source, kind=incident.kind, environment=versions, observed=_observation(report),
        location=_location(report), diagnoses=report.diagnoses, charts=charts(report), findings=findings,
        log_lines=incident.log_lines[-40:], colours=_STATUS_COLOURS, fix_text=fix_text, other_fixes=other_fixes,
    )
