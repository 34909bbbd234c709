"""Render a Report as a terminal view, Markdown or the JSON contract. Formatting only."""

from __future__ import annotations

import json
import os
from typing import IO

from .diagnosis import Diagnosis, Report

MAX_ALTERNATIVES = 4


def to_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False, default=str) + "\n"


def _location(report: Report) -> str:
    exc = report.incident.exception
    if exc is None:
        return ""
    frame = exc.user_frame()
    return frame.where if frame else ""


def _observation(report: Report) -> str:
    incident = report.incident
    exc = incident.exception
    if exc is not None and exc.type:
        return exc.headline
    if incident.signal:
        return f"the process died of {incident.signal}"
    if incident.kind == "nan":
        return "the loss or gradients became NaN/Inf"
    if exc is not None:
        return "a traceback cut off before its exception line"
    return "no traceback or error line found"


def to_markdown(report: Report) -> str:
    lines = ["# triage report", ""]
    lines.append(f"**Observed:** `{_observation(report)}`")
    where = _location(report)
    if where:
        lines.append(f"**Where:** `{where}`")
    lines.append("")
    if not report.diagnoses:
        lines += ["No rule in the knowledge base matched this failure.", ""]
    for rank, diagnosis in enumerate(report.diagnoses, start=1):
        heading = "##" if rank == 1 else "###"
        lines.append(f"{heading} {rank}. {diagnosis.title}")
        lines.append("")
        lines.append(f"`{diagnosis.rule}` · {diagnosis.category} · confidence {diagnosis.confidence:.0%}")
        lines.append("")
        lines.append(f"**Hypothesis.** {diagnosis.hypothesis}")
        lines.append("")
        if diagnosis.evidence:
            lines.append("**Evidence**")
            lines += [f"- `{item}`" if "`" not in item else f"- {item}" for item in diagnosis.evidence]
            lines.append("")
        for probe in diagnosis.probes:
            lines.append(f"**Experiment `{probe.name}`: {probe.status}.** {probe.detail}")
            lines.append("")
        if diagnosis.confirm:
            lines += [f"**Confirm.** {diagnosis.confirm}", ""]
        lines += [f"**Fix.** {diagnosis.fix}", ""]
    for note in report.incident.notes + report.warnings:
        lines.append(f"> {note}")
    return "\n".join(lines).rstrip() + "\n"


def to_terminal(report: Report, file: IO[str], color: bool | None = None, width: int | None = None) -> None:
    """The concise view: the leading diagnosis with evidence and fix, alternatives after."""
    from rich.console import Console
    from rich.markup import escape

    if color is None:
        color = file.isatty() and "NO_COLOR" not in os.environ
    console = Console(
        file=file, width=width, color_system="auto" if color else None, force_terminal=color,
        highlight=False, emoji=False, no_color=not color, soft_wrap=not color,
    )  # fmt: skip
    out = console.print
    where = _location(report)
    out(f"[bold]triage[/]: {escape(_observation(report))}")
    if where:
        out(f"  at {escape(where)}")
    if not report.diagnoses:
        out("\nNo rule in the knowledge base matched this failure.")
        out("Run with --format json for the parsed incident; add a team rule with `triage rules new`.")
    else:
        _terminal_diagnosis(out, escape, report.diagnoses[0], lead=True)
        others = report.diagnoses[1 : 1 + MAX_ALTERNATIVES]
        if others:
            out("\n[bold]Other possibilities[/]")
            for number, diagnosis in enumerate(others, start=2):
                out(f"  {number}. {escape(diagnosis.title)}  [dim]{diagnosis.rule} · {diagnosis.confidence:.0%}[/]")
    for note in report.incident.notes + report.warnings:
        out(f"[dim]note: {escape(note)}[/]")


def _terminal_diagnosis(out, escape, diagnosis: Diagnosis, lead: bool) -> None:
    out(f"\n[bold red]●[/] [bold]{escape(diagnosis.title)}[/]  [dim]{diagnosis.category} · {diagnosis.rule} · {diagnosis.confidence:.0%}[/]")
    out(f"  {escape(diagnosis.hypothesis)}")
    if diagnosis.evidence:
        out("\n  [bold]Evidence[/]")
        for item in diagnosis.evidence:
            out(f"    - {escape(item)}")
    for probe in diagnosis.probes:
        style = {"confirmed": "green", "refuted": "red"}.get(probe.status, "yellow")
        out(f"\n  [bold]Experiment[/] {escape(probe.name)}: [{style}]{probe.status}[/]. {escape(probe.detail)}")
    if diagnosis.confirm:
        out(f"\n  [bold]Confirm[/]  {escape(diagnosis.confirm)}")
    out(f"\n  [bold]Fix[/]  {escape(diagnosis.fix)}")
