"""The runner's side of the pipeline, for child and parent: the rules, the report folder and the run it names."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import IO, Any

from ..incident import Incident


class Reporter:
    """Turns Incidents into report folders for one run; the knowledge base is loaded once, on first use."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self._kb = None
        self.folders: list[str] = []

    def knowledge_base(self):
        if self._kb is None:
            from ..kb import load_knowledge_base

            cwd = self.config.get("cwd")  # where the command ran: the script may have changed directory since
            self._kb = load_knowledge_base([Path(p) for p in self.config.get("rules") or []],
                                           cwd=Path(cwd) if cwd else None, project=self.script_folder())
        return self._kb

    def script_folder(self) -> Path | None:
        """The script's own folder (the project's rules are looked for from there); None for a module or stdin."""
        target, cwd = self.config.get("target"), self.config.get("cwd") or os.getcwd()
        if not target or self.config.get("module") or target in ("-", "-c"):
            return None
        path = Path(os.path.realpath(os.path.join(cwd, target)))
        return path if path.is_dir() else path.parent

    def handle(
        self,
        incident: Incident,
        *,
        live: Any = None,
        exception: BaseException | None = None,
        tracker: Any = None,
        stream: IO[str] | None = None,
        texts: dict[str, str] | None = None,
        lead_in: str | None = None,
        timings: dict[str, float] | None = None,
    ) -> Path:
        """Diagnose, run probes (live incidents), write the folder, print the summary; returns the folder."""
        from ..pipeline import LiveContext, print_summary, rule_warnings, triage_incident
        from ..replay import rerun_commands
        from ..report_dir import ReportWriter, claim_folder

        timings = dict(timings or {})
        if self.config.get("job_dir"):  # a torchrun rank: its part of the job's report first, before anything slow
            from .jobdir import record_incident

            record_incident(Path(self.config["job_dir"]), int(self.config.get("rank", 0)), incident.to_dict())
        started = time.monotonic()
        kb = self.knowledge_base()
        timings["rules_s"] = time.monotonic() - started  # loading and validating the rules, unless cached
        folder = claim_folder(
            explicit=self.config.get("report_dir"),
            root=self.config.get("report_root") or os.path.join(os.getcwd(), "triage-reports"),
            label=self.config.get("label") or "script",
            run_id=self.config.get("run_id") or str(os.getpid()),
        )
        script, args = self.config.get("target"), list(self.config.get("args") or [])
        experiments = None
        if (live is not None or tracker is not None) and self.config.get("probes", True):
            experiments = LiveContext(exception=exception, captured=live, tracker=tracker, script=script, script_args=args)
        report = triage_incident(
            incident, kb, source="run", live=experiments,
            writer=ReportWriter(folder, run=self.run_info(), texts=texts, json_copy=self.config.get("json")),
            rerun=lambda: rerun_commands(script, args, module=bool(self.config.get("module")), report_dir=folder,
                                         cwd=self.config.get("cwd")),
            warnings=rule_warnings(kb), timings=timings,
        )  # fmt: skip
        self.folders.append(str(folder))
        if not self.config.get("quiet"):  # a torchrun rank's summary is the job's report
            print_summary(report, stream or sys.stderr, folder=folder, lead_in=lead_in, color=self.config.get("color"))
        return folder

    def run_info(self) -> dict[str, Any]:
        from ..capture.secrets import scrub_argv

        return {
            "target": self.config.get("target"),
            "module": bool(self.config.get("module")),
            "argv": scrub_argv(list(self.config.get("args") or [])),
            "cwd": self.config.get("cwd"),
            "pid": self.config.get("child_pid") or os.getpid(),
            "python": sys.executable,
        }
