"""Diagnoses and reports: what the matcher and probes produce and the renderers format."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .incident import Incident

PROBE_STATUSES = ("confirmed", "refuted", "inconclusive", "skipped", "error")
SCHEMA = "triage.report/1"


@dataclass
class ProbeResult:
    """The outcome of one experiment run to test a hypothesis."""

    name: str
    status: str
    detail: str
    facts: dict[str, Any] = field(default_factory=dict)
    artifacts: list[str] = field(default_factory=list)
    seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "status": self.status, "detail": self.detail, "artifacts": self.artifacts}
        if self.facts:
            out["facts"] = self.facts
        if self.seconds is not None:
            out["seconds"] = round(self.seconds, 3)
        return out


FIX_VERDICTS = ("verified", "fails", "not tried")


@dataclass
class Fix:
    """One candidate fix of the chosen cause, and what a fix trial found when one ran."""

    id: str
    text: str
    trial: str = ""
    verdict: str | None = None  # one of FIX_VERDICTS once a trial was attempted
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "text": self.text, "trial": self.trial or None, "verdict": self.verdict,
                "detail": self.detail}


@dataclass
class Diagnosis:
    """A rule's explanation of an incident, rendered with the values its match extracted."""

    rule: str
    category: str
    confidence: float
    title: str
    hypothesis: str
    fix: str
    confirm: str = ""
    verify: str = ""
    evidence: list[str] = field(default_factory=list)
    probe_names: list[str] = field(default_factory=list)
    probes: list[ProbeResult] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    exception_index: int | None = None
    rule_location: str = ""
    specificity: int = 0
    # Where the rule came from: built-in, user, project, TRIAGE_RULES or --rules (searchpath.ORIGINS).
    origin: str = "built-in"
    overrides: str = ""  # "ORIGIN FILE:LINE" of the rule this one replaced (same id, earlier layer), if any
    # The specific cause: "<rule id>/<cause>" when the evidence chose one of the rule's causes, else the rule id.
    cause: str = ""
    fixes: list[Fix] = field(default_factory=list)  # the chosen cause's candidate fixes, in order
    decide: str = ""  # which fact would decide between the rule's causes, when the evidence chose none
    # What chose the cause: "evidence" (a `when`, or the only fallback), "base_rate" (nothing decided; the commonest
    # cause in public reports), "" (no cause chosen).
    cause_basis: str = ""
    # What the matcher rendered from, kept to choose the cause again once the experiments have run.
    context: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    weight: float = field(default=1.0, repr=False, compare=False)

    @property
    def leading_fix(self) -> Fix | None:
        """The fix the report leads with: the first a trial verified, else the first not shown to fail."""
        for wanted in (lambda f: f.verdict == "verified", lambda f: f.verdict != "fails", lambda f: True):
            for option in self.fixes:
                if wanted(option):
                    return option
        return None

    @property
    def fix_id(self) -> str:
        leading = self.leading_fix
        return leading.id if leading is not None else self.rule

    @property
    def provenance(self) -> str:
        """'' for a built-in rule; else where it comes from, and what it replaced: 'project rule, overrides built-in ...'."""
        if self.origin == "built-in" and not self.overrides:
            return ""
        text = f"{self.origin} rule"
        return text + (f", overrides {self.overrides}" if self.overrides else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "category": self.category,
            "confidence": round(self.confidence, 3),
            "title": self.title,
            "hypothesis": self.hypothesis,
            "evidence": self.evidence,
            "fix": self.fix,
            "confirm": self.confirm,
            "verify": self.verify,
            "probes": [p.to_dict() for p in self.probes],
            "values": {k: v for k, v in self.values.items() if isinstance(v, (str, int, float, bool))},
            "rule_location": self.rule_location,
            "origin": self.origin,
            "overrides": self.overrides or None,
            "cause": self.cause or self.rule,
            "fix_id": self.fix_id,
            "fixes": [f.to_dict() for f in self.fixes],
            "decide": self.decide or None,
            "cause_basis": self.cause_basis or None,
        }


@dataclass
class Report:
    """An incident with its ranked diagnoses; renderers only format this."""

    source: str
    incident: Incident
    diagnoses: list[Diagnosis] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # How to re-run the failed script to check a fix: {"command": ..., "replay": ... or None}; None for a log.
    rerun: dict[str, str | None] | None = None
    # A multi-rank job's ranks, root and secondary (DESIGN.md, contract — multi-rank jobs); None for one process.
    ranks: list[dict[str, Any]] | None = None

    @property
    def leading(self) -> Diagnosis | None:
        return self.diagnoses[0] if self.diagnoses else None

    def to_dict(self) -> dict[str, Any]:
        environment = {"python": None, "torch": None, "cuda": None}
        environment.update(self.environment)
        out = {
            "schema": SCHEMA,
            "source": self.source,
            "incident": self.incident.to_dict(),
            "diagnoses": [d.to_dict() for d in self.diagnoses],
            "environment": environment,
            "artifacts": self.artifacts,
            "rerun": self.rerun,
            "warnings": self.warnings,
        }
        if self.ranks is not None:
            out["ranks"] = self.ranks
        return out
