"""The incident pipeline shared by child and parent: match → probes → report folder → short summary on stderr."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import IO, Any

from ..diagnosis import Report
from ..incident import Incident

PROBE_RUNNER = "triage.probes.runner"


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
            self._kb = load_knowledge_base([Path(p) for p in self.config.get("rules") or []], cwd=Path(cwd) if cwd else None)
        return self._kb

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
        from ..kb import diagnose
        from ..replay import rerun_commands
        from ..report_dir import claim_folder, write_report

        timings = dict(timings or {})
        if self.config.get("job_dir"):  # a torchrun rank: its part of the job's report first, before anything slow
            from .jobdir import record_incident

            record_incident(Path(self.config["job_dir"]), int(self.config.get("rank", 0)), incident.to_dict())
        started = time.monotonic()
        kb = self.knowledge_base()
        timings["rules_s"] = time.monotonic() - started  # loading and validating the rules, unless cached
        warnings = [f"rule skipped: {problem}" for problem in kb.problems]
        diagnoses = diagnose(incident, kb, warnings)
        if diagnoses and diagnoses[0].exception_index is not None:
            # The exception the leading diagnosis explains is the root cause the report shows.
            chosen = incident.exceptions[diagnoses[0].exception_index]
            incident.exception = chosen
            incident.worker = chosen.worker if chosen.worker is not None else incident.worker
            incident.rank = chosen.rank if chosen.rank is not None else incident.rank
        timings["diagnose_s"] = time.monotonic() - started
        report = Report(source="run", incident=incident, diagnoses=diagnoses, environment=incident.environment, warnings=warnings)
        folder = claim_folder(
            explicit=self.config.get("report_dir"),
            root=self.config.get("report_root") or os.path.join(os.getcwd(), "triage-reports"),
            label=self.config.get("label") or "script",
            run_id=self.config.get("run_id") or str(os.getpid()),
        )
        if (live is not None or tracker is not None) and self.config.get("probes", True):
            started = time.monotonic()
            self._run_probes(report, folder, live, exception, tracker)
            timings["probes_s"] = time.monotonic() - started
        report.rerun = rerun_commands(self.config.get("target"), list(self.config.get("args") or []),
                                     module=bool(self.config.get("module")), report_dir=folder,
                                     cwd=self.config.get("cwd"))
        started = time.monotonic()
        write_report(
            report, folder, run=self.run_info(), timings=timings, texts=texts, json_copy=self.config.get("json"),
        )  # fmt: skip
        timings["report_s"] = time.monotonic() - started
        self.folders.append(str(folder))
        if not self.config.get("quiet"):  # a torchrun rank's summary is the job's report
            self.print_summary(report, folder, stream or sys.stderr, lead_in)
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

    def _run_probes(self, report: Report, folder: Path, live: Any, exception: BaseException | None, tracker: Any) -> None:
        """The probes the diagnoses name, on the live objects; they re-rank the diagnoses in place."""
        if importlib.util.find_spec(PROBE_RUNNER) is None:
            return
        from ..probes import runner as probe_runner

        script, args = self.config.get("target"), list(self.config.get("args") or [])
        # The probes' own reading of the failing calls (model and loss arguments as called) and the Tracker...
        context = probe_runner.context_from_failure(
            report.incident, exception, folder, tracker=tracker, script=script, script_args=args,
        )  # fmt: skip
        # ...and what only the capture saw: a failure before the first optimizer step (in the first
        # backward, say) leaves the Tracker without a model, but the script's locals have it.
        for name in _CAPTURED_FOR_PROBES:
            if getattr(context, name) is None and getattr(live, name, None) is not None:
                setattr(context, name, getattr(live, name))
        try:
            ranked = probe_runner.run_probes(report.diagnoses, context)
        except Exception as exc:
            if os.environ.get("TRIAGE_DEBUG"):
                raise
            report.warnings.append(f"probes failed: {type(exc).__name__}: {exc}")
            return
        if isinstance(ranked, list):
            report.diagnoses = ranked

    def print_summary(self, report: Report, folder: Path, stream: IO[str], lead_in: str | None) -> None:
        from ..render import to_terminal
        from ..report_dir import shown_path

        try:
            stream.flush()
        except (OSError, ValueError):
            pass
        stream.write("\n")
        if lead_in:
            stream.write(lead_in.rstrip("\n") + "\n")
        to_terminal(report, stream)
        stream.write(f"triage: report written to {shown_path(folder / 'report.md')}\n")
        stream.flush()


_CAPTURED_FOR_PROBES = ("model", "module", "optimizer", "loader", "loss_fn", "batch", "batch_index", "step")

