"""Write one incident's report folder: report.json (the DESIGN.md contract), report.md and raw artifacts.

The default folder is `./triage-reports/<time>-<script>/`, always a new one;
with `--report-dir DIR` the first incident of a run goes to DIR and any later
one of the same run (a thread's exception, then the main one) to `DIR-2`, ...
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from .capture.secrets import scrub_data, scrub_text
from .diagnosis import Report
from .incident import Frame
from .render import to_markdown
from .render_html import to_html

DEFAULT_ROOT = "triage-reports"
REPORT_DIR_ENV = "TRIAGE_REPORT_DIR"
MAX_FOLDERS = 1000
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def folder_name(label: str, when: float) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    return f"{stamp}-{_UNSAFE.sub('_', label).strip('_') or 'script'}"


def claim_folder(*, explicit: str | None, root: str, label: str, run_id: str, when: float | None = None) -> Path:
    """A folder no other incident of this run (nor, by default, any other run) writes into.

    `explicit` is --report-dir. Without it the folder goes under `root` (./triage-reports where the command
    started), or under $TRIAGE_REPORT_DIR when that is set (a relative one is taken from the same place).
    Every folder triage makes ignores itself in git (a `.gitignore` of `*`, as pytest's cache has): reports hold
    user data (batch.pt) and never belong in `git status`.
    """
    when = time.time() if when is None else when
    if explicit:
        base = Path(explicit)
        for number in range(1, MAX_FOLDERS):
            candidate = base if number == 1 else base.with_name(f"{base.name}-{number}")
            fresh = not candidate.exists()
            candidate.mkdir(parents=True, exist_ok=True)
            ours = fresh or any(candidate.glob(".triage-run-*")) or not any(candidate.iterdir())
            marker = candidate / f".triage-run-{run_id}"
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            except FileExistsError:
                continue
            for stale in candidate.glob(".triage-run-*"):
                if stale != marker:
                    stale.unlink(missing_ok=True)
            if ours:  # a folder the user already keeps other files in (`--report-dir .`) is left as it is
                _ignore_in_git(candidate)
            return candidate
        raise OSError(f"no free report folder next to {base}")
    moved = os.environ.get(REPORT_DIR_ENV)
    if moved:
        root = os.path.join(os.path.dirname(os.path.abspath(root)), os.path.expanduser(moved))
    base = Path(root) / folder_name(label, when)
    base.parent.mkdir(parents=True, exist_ok=True)
    for number in range(1, MAX_FOLDERS):
        candidate = base if number == 1 else base.with_name(f"{base.name}-{number}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        _ignore_in_git(candidate)
        return candidate
    raise OSError(f"no free report folder in {base.parent}")


class ReportWriter:
    """Writes one incident's folder, as often as its report changes.

    The `texts` (name -> content: stacks, crash dumps) are written once, with the
    first report; report.json and report.md each time, each replaced in one step
    so that a reader, or a triage killed mid-write, never sees half a file.
    `complete=False` marks a report whose experiments are still running.
    """

    def __init__(self, folder: Path, *, run: dict[str, Any] | None = None, texts: dict[str, str] | None = None,
                 json_copy: str | None = None) -> None:
        self.folder = Path(folder)
        self.run = run
        self.json_copy = json_copy
        self._texts = dict(texts or {})
        self._text_paths: dict[str, str] = {}

    def write(self, report: Report, *, timings: dict[str, float] | None = None, complete: bool = True) -> dict[str, str]:
        """Write report.json and report.md (and, the first time, the texts); returns the artifact paths."""
        for name, content in self._texts.items():
            path = self.folder / name
            path.write_text(scrub_text(content), encoding="utf-8", errors="replace")
            self._text_paths[name.rsplit(".", 1)[0]] = str(path)
        self._texts.clear()
        md_path = self.folder / "report.md"
        json_path = self.folder / "report.json"
        artifacts = {**probe_artifacts(report, self.folder), **report.artifacts, **self._text_paths}
        artifacts["report_md"] = str(md_path)
        artifacts["report_json"] = str(json_path)
        report.artifacts = artifacts
        note = "" if complete else INCOMPLETE_NOTE
        # Everything was scrubbed when it was captured; what a probe added since (a detail quoting a value)
        # goes through the same scrubber here, the last step before any byte reaches the disk.
        _replace(md_path, scrub_text(to_markdown(report) + note + live_state_markdown(report)))
        html_path = self.folder / "report.html"
        _replace(html_path, scrub_text(to_html(report)))
        artifacts["report_html"] = str(html_path)
        data = scrub_data(report.to_dict())
        data["complete"] = complete
        if self.run:
            data["run"] = scrub_data(self.run)
        if timings:
            data["timings"] = {name: round(value, 4) for name, value in timings.items()}
        text = json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n"
        _replace(json_path, text)
        if self.json_copy:
            Path(self.json_copy).parent.mkdir(parents=True, exist_ok=True)
            _replace(Path(self.json_copy), text)
        return artifacts


INCOMPLETE_NOTE = ("\n> Experiments were still running when this report was written: the probes listed are those "
                   "that had finished, and the ranking is the matcher's.\n")

def _ignore_in_git(folder: Path) -> None:
    gitignore = folder / ".gitignore"
    if not gitignore.exists():
        gitignore.write_text("# Created by triage: a report holds data (batch.pt) git should not track.\n*\n",
                             encoding="utf-8")


def write_report(
    report: Report,
    folder: Path,
    *,
    run: dict[str, Any] | None = None,
    timings: dict[str, float] | None = None,
    texts: dict[str, str] | None = None,
    json_copy: str | None = None,
) -> dict[str, str]:
    """Write report.json, report.md and `texts` (name -> content) into `folder` once; returns the artifact paths."""
    return ReportWriter(folder, run=run, texts=texts, json_copy=json_copy).write(report, timings=timings)


def probe_artifacts(report: Report, folder: Path) -> dict[str, str]:
    """Files the probes left in the report folder, by name without extension (batch.pt -> "batch")."""
    found: dict[str, str] = {}
    for diagnosis in report.diagnoses:
        for result in diagnosis.probes:
            for artifact in result.artifacts:
                path = Path(artifact)
                if path.is_file() and path.resolve().parent == folder.resolve():
                    found.setdefault(path.name.split(".", 1)[0], str(path))
    return found


def _replace(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file renamed over it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def live_state_markdown(report: Report) -> str:
    """What the live capture saw: progress, model, loader, optimizer, locals, stacks, environment."""
    incident = report.incident
    facts = incident.facts
    lines: list[str] = ["", "## Live state", ""]
    progress = facts.get("progress") or facts.get("last_state")
    if progress:
        lines.append("**Progress:** " + ", ".join(_state_item(key, value) for key, value in progress.items()))
    for key, label in (("model", "Model"), ("loader", "DataLoader"), ("optimizer", "Optimizer"), ("batch", "Last batch")):
        value = facts.get(key)
        if isinstance(value, dict) and value.get("text"):
            lines.append(f"**{label}:** `{value['text']}`")
    module = facts.get("module")
    if isinstance(module, dict):
        name = module.get("name")
        where = f"`{name}` ({module.get('class')})" if name else module.get("class")
        inputs = ", ".join(f"`{text}`" for text in module.get("inputs", []))
        lines.append(f"**Failing module:** {where}" + (f" called with {inputs}" if inputs else ""))
    for outlier in facts.get("device_outliers", []):
        lines.append(f"- {outlier}")
    for line in facts.get("hang_summary", []):
        lines.append(f"- {line}")
    if len(lines) == 3:
        lines.pop()
    frames_with_locals = [
        frame for exc in incident.exceptions for frame in exc.frames if frame.locals
    ]
    if frames_with_locals:
        lines += ["", "### Locals of your frames", ""]
        for frame in frames_with_locals:
            lines.append(f"`{frame.where}`")
            lines.append("")
            for name, summary in frame.locals.items():
                text = summary.get("text", "") if isinstance(summary, dict) else str(summary)
                lines.append(f"- `{name}`: `{text}`")
            lines.append("")
    if incident.kind in ("hang", "hard-crash"):
        lines += _stacks_markdown(incident.exceptions)
    if incident.log_lines:
        lines += ["", "### Log lines", "", "```"] + incident.log_lines[-40:] + ["```"]
    lines += ["", "### Environment", ""]
    env = report.environment or incident.environment
    versions = ", ".join(f"{key} {env[key]}" for key in ("python", "torch", "cuda", "cudnn", "numpy") if env.get(key))
    lines.append(f"- {versions or 'unknown'}")
    for gpu in env.get("gpus", []) or []:
        lines.append(f"- GPU {gpu.get('index')}: {gpu.get('name')} ({_gib(gpu.get('total_memory'))} total, {_gib(gpu.get('allocated'))} allocated)")
    for name, value in (env.get("env") or {}).items():
        lines.append(f"- `{name}={value}`")
    return "\n".join(lines).rstrip() + "\n"


def _stacks_markdown(exceptions) -> list[str]:
    """Each stack as a traceback ending in its `Hang:` / `Fatal Python error:` line, so a pasted report parses back."""
    lines = ["", "### Stacks", ""]
    for exc in exceptions:
        lines.append("```")
        lines.append("Traceback (most recent call last):")
        lines += [_frame_line(frame) for frame in exc.frames]
        lines.append(exc.headline if exc.type else "(no exception line)")
        lines.append("```")
        lines.append("")
    return lines


def _frame_line(frame: Frame) -> str:
    code = f"\n    {frame.code}" if frame.code else ""
    return f'  File "{frame.file}", line {frame.line}, in {frame.function}{code}'


def _state_item(key: str, value) -> str:
    if key.endswith("_bytes") and isinstance(value, (int, float)):
        return f"{key[:-6].replace('_', ' ')} {_gib(value)}"
    if key.startswith("seconds_") and isinstance(value, (int, float)):
        return f"{value:g} s {key[8:].replace('_', ' ')}"
    return f"{key.replace('_', ' ')} {value}"


def _gib(value) -> str:
    return f"{value / 2**30:.1f} GiB" if isinstance(value, (int, float)) else "?"


def shown_path(path: Path, start: str | None = None) -> str:
    """Relative to `start` (the working directory) when inside it, else absolute: the shortest path that works there."""
    try:
        relative = os.path.relpath(path, start)
    except ValueError:
        return str(path)
    return str(path) if relative.startswith("..") else relative
