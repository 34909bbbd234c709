"""Render a Report as a terminal view, Markdown or the JSON contract. Formatting only."""

from __future__ import annotations

import json
import os
import re
from typing import IO

from .diagnosis import Diagnosis, Fix, Report

MAX_ALTERNATIVES = 4
_BACKTICKS = re.compile(r"`+")


def to_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False, default=str) + "\n"


def _location(report: Report) -> str:
    exc = report.incident.exception
    if exc is None:
        return ""
    frame = exc.user_frame() or exc.side_user_frame()
    return frame.where if frame else ""


def _side_location(report: Report) -> tuple[str, str]:
    """The user's line in the stack printed beside the traceback, when the location does not already show it."""
    exc = report.incident.exception
    side = exc.side_user_frame() if exc is not None else None
    if side is None or exc.user_frame() is None:
        return "", ""
    return exc.side_label or "side stack", side.where


def _observation(report: Report) -> str:
    incident = report.incident
    exc = incident.exception
    if exc is not None and exc.type:
        return exc.headline
    if incident.signal:
        return f"the process died of {incident.signal}"
    if incident.kind == "nan":
        return "the loss or gradients became NaN/Inf"
    if incident.kind == "silent":
        return "the run finished, but the training-health checks found a problem"
    if exc is not None:
        return "a traceback cut off before its exception line"
    matched_line = report.leading.values.get("log_match", "").strip() if report.leading else ""
    if matched_line:
        return matched_line
    return "no traceback or error line found"


def code_span(text: str) -> str:
    """`text` as one Markdown code span, whatever backticks it holds (CommonMark: a longer backtick fence)."""
    if not text:
        return ""
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
    fence = "`" * (longest + 1)
    # A span that starts or ends with a backtick needs a space to part it from the fence; CommonMark strips one
    # space at each end when both are there, so a text already spaced at both ends gets one more to keep its own.
    spaced = text.startswith(" ") and text.endswith(" ") and bool(text.strip())
    pad = " " if text.startswith("`") or text.endswith("`") or spaced else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def code_block(text: str) -> list[str]:
    """`text` as a fenced Markdown block, the fence longer than any backtick run inside."""
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, text, fence]


def alternatives(report: Report) -> list[Diagnosis]:
    """The diagnoses after the leading one, most confident first (ties keep the ranking's order)."""
    return sorted(report.diagnoses[1:], key=lambda diagnosis: -diagnosis.confidence)


def to_markdown(report: Report) -> str:
    lines = ["# triage report", ""]
    lines.append(f"**Observed:** {code_span(_observation(report))}")
    where = _location(report)
    if where:
        lines.append(f"**Where:** {code_span(where)}")
    label, side_where = _side_location(report)
    if side_where:
        lines.append(f"**{label[0].upper()}{label[1:]}:** {code_span(side_where)}")
    lines.append("")
    if not report.diagnoses:
        lines += ["No rule in the knowledge base matched this failure.", ""]
    for rank, diagnosis in enumerate(report.diagnoses[:1] + alternatives(report), start=1):
        heading = "##" if rank == 1 else "###"
        lines.append(f"{heading} {rank}. {diagnosis.title}")
        lines.append("")
        provenance = f" · {diagnosis.provenance}" if diagnosis.provenance else ""
        lines.append(f"{code_span(diagnosis.rule)} · {diagnosis.category} · confidence {diagnosis.confidence:.0%}{provenance}")
        lines.append("")
        lines.append(f"**Hypothesis.** {diagnosis.hypothesis}")
        lines.append("")
        if diagnosis.evidence:
            lines.append("**Evidence**")
            lines += [f"- {code_span(item)}" for item in diagnosis.evidence]  # verbatim lines, shown as written
            lines.append("")
        for probe in diagnosis.probes:
            lines.append(f"**Experiment {code_span(probe.name)}: {probe.status}.** {probe.detail}")
            lines.append("")
        if diagnosis.confirm:
            lines += [f"**Confirm.** {diagnosis.confirm}", ""]
        if diagnosis.decide:
            lines += [f"**To decide between the causes.** {diagnosis.decide}", ""]
        lines += [f"**Fix.** {fix_text(diagnosis)}", ""]
        lines += [f"- {note}" for note in other_fixes(diagnosis)] + ([""] if other_fixes(diagnosis) else [])
        if diagnosis.verify:
            lines += [f"**Verify the fix.** {diagnosis.verify}", ""]
            for command, note in _rerun_lines(report.rerun) if rank == 1 else ():  # the same commands for all
                lines += [*code_block(command), f"{note[0].upper()}{note[1:]}.", ""]
    for note in report.incident.notes + report.warnings:
        lines.append(f"> {note}")
    return "\n".join(lines).rstrip() + "\n"


def fix_text(diagnosis: Diagnosis) -> str:
    """The leading fix, with what its trial found: "... (fix verified: with nn.Linear(400, 120) the step runs)"."""
    leading = diagnosis.leading_fix
    if leading is None:
        return diagnosis.fix
    verdict = _verdict_text(leading)
    return f"{leading.text} (fix {verdict})" if verdict else leading.text


def _verdict_text(fix: Fix) -> str:
    """What a fix's trial found: "verified: ...", "fails: now ...", "not tried: ..." ('' when none ran)."""
    if not fix.verdict or not fix.detail:
        return fix.verdict or ""
    detail = fix.detail
    if fix.verdict == "fails" and not detail.startswith("now"):
        detail = f"now {detail}"  # the detail is the new error
    return f"{fix.verdict}: {detail}"


def other_fixes(diagnosis: Diagnosis) -> list[str]:
    """The cause's other candidate fixes, each with its trial's verdict where one ran."""
    leading = diagnosis.leading_fix
    notes = []
    for option in diagnosis.fixes:
        if option is leading:
            continue
        verdict = f" ({_verdict_text(option)})" if option.verdict else ""
        notes.append(f"tried: {option.text}{verdict}" if option.verdict == "fails" else f"{option.text}{verdict}")
    return notes


Line = list[tuple[str, str]]  # (text, rich style or "") pieces of one line


def terminal_lines(report: Report) -> list[Line]:
    """The concise view as styled lines: the leading diagnosis with evidence and fix, alternatives after."""
    lines: list[Line] = [[("triage", "bold"), (f": {_observation(report)}", "")]]
    where = _location(report)
    if where:
        lines.append([(f"  at {where}", "")])
    label, side_where = _side_location(report)
    if side_where:
        lines.append([(f"  {label} at {side_where}", "")])
    if not report.diagnoses:
        lines += [[("", "")], [("No rule in the knowledge base matched this failure.", "")]]
        lines.append([(f"{_incident_hint(report)}; add a team rule with `triage rules new`.", "")])
    else:
        lines += _diagnosis_lines(report.diagnoses[0], report.rerun)
        others = alternatives(report)[:MAX_ALTERNATIVES]
        if others:
            lines += [[("", "")], [("Other possibilities", "bold")]]
            for number, diagnosis in enumerate(others, start=2):
                provenance = f" · {diagnosis.provenance}" if diagnosis.provenance else ""
                lines.append([(f"  {number}. {diagnosis.title}  ", ""),
                              (f"{diagnosis.rule} · {diagnosis.confidence:.0%}{provenance}", "dim")])
    for note in report.incident.notes + report.warnings:
        lines.append([(f"note: {note}", "dim")])
    return lines


def _incident_hint(report: Report) -> str:
    """Where the parsed incident can be read, in the terms of the command that made this report."""
    if report.source == "log":
        return "`triage explain --format json` (or `--json FILE`) prints the parsed incident"
    return "The captured incident is in the report folder's report.json"


def _rerun_lines(rerun: dict[str, str | None] | None) -> list[tuple[str, str]]:
    """The commands that check a fix, each with what it checks."""
    if not rerun or not rerun.get("command"):
        return []
    if not rerun.get("replay"):
        return [(rerun["command"], "re-runs the whole script")]
    return [
        (rerun["replay"], "feeds the failing batch first: checks a fix to the model or the step at once"),
        (rerun["command"], "the whole run: checks a fix to the data, which the saved batch predates"),
    ]


def _diagnosis_lines(diagnosis: Diagnosis, rerun: dict[str, str | None] | None) -> list[Line]:
    lines: list[Line] = [[("", "")]]
    lines.append([("● ", "bold red"), (diagnosis.title, "bold"),
                  (f"  {diagnosis.category} · {diagnosis.rule} · {diagnosis.confidence:.0%}", "dim")])
    if diagnosis.provenance:
        lines.append([(f"  from a {diagnosis.provenance}: {diagnosis.rule_location}", "dim")])
    lines.append([(f"  {diagnosis.hypothesis}", "")])
    if diagnosis.evidence:
        lines += [[("", "")], [("  Evidence", "bold")]]
        lines += [[(f"    - {item}", "")] for item in diagnosis.evidence]
    for probe in diagnosis.probes:
        style = {"confirmed": "green", "refuted": "red"}.get(probe.status, "yellow")
        lines += [[("", "")], [("  Experiment ", "bold"), (f"{probe.name}: ", ""), (probe.status, style), (f". {probe.detail}", "")]]
    if diagnosis.confirm:
        lines += [[("", "")], [("  Confirm  ", "bold"), (diagnosis.confirm, "")]]
    if diagnosis.decide:
        lines += [[("", "")], [("  To decide  ", "bold"), (diagnosis.decide, "")]]
    lines += [[("", "")], [("  Fix  ", "bold"), (fix_text(diagnosis), "")]]
    lines += [[(f"    - {note}", "")] for note in other_fixes(diagnosis)]
    if diagnosis.verify:
        lines += [[("", "")], [("  Verify  ", "bold"), (diagnosis.verify, "")]]
        for command, note in _rerun_lines(rerun):
            lines += [[("    $ ", "dim"), (command, "bold")], [(f"      {note}", "dim")]]
    return lines


def to_terminal(report: Report, file: IO[str], color: bool | str | None = "auto", width: int | None = None) -> None:
    """Write the concise view. `color`: "always", "never", or "auto" (None): rich decides from whether `file` is a
    terminal and from NO_COLOR, FORCE_COLOR and TERM."""
    choice = {True: "always", False: "never", None: "auto"}.get(color, color)  # type: ignore[arg-type]
    lines = terminal_lines(report)
    if choice == "never" or (choice == "auto" and not _may_be_coloured(file)):
        file.write("".join("".join(text for text, _style in line) + "\n" for line in lines))
        return
    from rich.console import Console
    from rich.text import Text

    console = Console(file=file, width=width, force_terminal=True if choice == "always" else None,
                      force_jupyter=False, highlight=False, emoji=False, markup=False)  # fmt: skip
    soft_wrap = not _isatty(file)  # a log file or pipe keeps whole lines; a terminal gets rich's word wrap
    for line in lines:
        console.print(Text.assemble(*((text, style) for text, style in line)), soft_wrap=soft_wrap)


def _may_be_coloured(file: IO[str]) -> bool:
    """False only where rich would print no colour anyway (not a terminal, and nothing in the environment forces
    one): plain text then needs no rich import, which keeps `triage explain ... | less` fast."""
    return _isatty(file) or "FORCE_COLOR" in os.environ or "TTY_COMPATIBLE" in os.environ


def _isatty(file: IO[str]) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError):  # no such method, or a closed file
        return False
