"""Match an Incident against the knowledge base and return ranked Diagnoses."""

from __future__ import annotations

import os
from typing import Any

from ..diagnosis import Diagnosis, Fix
from ..incident import ExceptionInfo, Frame, Incident
from ..logparse import progress_indices
from . import templates
from .loader import KnowledgeBase
from .rule import Cause, Rule
from .safe_regex import PatternTimeout

# How much a match on an exception other than the root cause counts.
WEIGHT_ROOT = 1.0
WEIGHT_OTHER = 0.85
WEIGHT_WRAPPER = 0.7
MAX_EVIDENCE_CHARS = 400
MAX_CONTEXT_FRAMES = 200  # the innermost frames `frames` keeps (a deep recursion prints thousands)
MAX_CONTEXT_LOG_LINES = 200


def diagnose(incident: Incident, kb: KnowledgeBase, warnings: list[str] | None = None) -> list[Diagnosis]:
    """Every rule that matches, best first; one diagnosis per rule."""
    warnings = warnings if warnings is not None else []
    log_text = "\n".join(incident.log_lines)
    best: dict[str, Diagnosis] = {}
    layers: dict[str, int] = {}
    for order, rule in enumerate(kb.rules):
        try:
            for diagnosis in _match_rule(rule, incident, log_text, warnings):
                diagnosis.specificity = rule.specificity * 1000 - order
                current = best.get(rule.id)
                if current is None or diagnosis.confidence > current.confidence:
                    best[rule.id] = diagnosis
                    layers[rule.id] = rule.layer
        except PatternTimeout as exc:
            warnings.append(f"rule {rule.id} ({rule.location}): {exc}")
        except templates.TemplateRefused as exc:
            best.pop(rule.id, None)
            warnings.append(f"rule {rule.id} ({rule.location}) skipped: {exc}")
        except Exception as exc:  # a rule must never take explain down with it
            if os.environ.get("TRIAGE_DEBUG"):
                raise
            warnings.append(f"rule {rule.id} ({rule.location}) skipped: internal error {type(exc).__name__}: {exc}")
    replaced = {override.by.id: override.replaced for override in getattr(kb, "overridden", [])}
    for diagnosis in best.values():
        if diagnosis.rule in replaced:
            diagnosis.overrides = f"{replaced[diagnosis.rule].origin} {replaced[diagnosis.rule].location}"
    # At equal confidence a team's rule (a later layer) goes first, then the more specific rule.
    return sorted(best.values(), key=lambda d: (-d.confidence, -layers[d.rule], -d.specificity))


def matches(rule: Rule, incident: Incident) -> list[dict[str, Any]]:
    """The values each match of one rule extracts (used by rule tests)."""
    return [d.values for d in _match_rule(rule, incident, "\n".join(incident.log_lines), [])]


def _match_rule(rule: Rule, incident: Incident, log_text: str, warnings: list[str]):
    if rule.kinds and incident.kind not in rule.kinds:
        return
    log_values = _match_log(rule, log_text)
    if log_values is None:
        return
    root = incident.exception
    if not rule.needs_exception:
        yield _diagnosis(rule, incident, root, None, log_values, WEIGHT_ROOT, warnings)
        return
    exceptions = incident.exceptions or ([root] if root else [])
    # A spawned child's EOFError is the echo of its parent's error: explained by that error, never on its own.
    echoes_only = all(exc.spawn_echo for exc in exceptions)
    for index, exc in enumerate(exceptions):
        if exc.spawn_echo and not echoes_only:
            continue
        values = _match_exception(rule, exc)
        if values is None:
            continue
        weight = WEIGHT_ROOT if exc is root else WEIGHT_WRAPPER if exc.wrapper else WEIGHT_OTHER
        yield _diagnosis(rule, incident, exc, index, {**log_values, **values}, weight, warnings)


def _type_matches(wanted: tuple[str, ...], exc: ExceptionInfo) -> bool:
    return any(name == exc.type or name.rsplit(".", 1)[-1] == exc.short_type for name in wanted)


def _match_exception(rule: Rule, exc: ExceptionInfo) -> dict[str, Any] | None:
    if rule.exception_types and not _type_matches(rule.exception_types, exc):
        return None
    values: dict[str, Any] = {}
    if rule.messages:
        found = _first_search(rule.messages, exc.message)
        if found is None:
            return None
        values.update(_groups(found))
    if any(pattern.search(exc.message) for pattern in rule.not_messages):
        return None
    if rule.frame and not (rule.frame.get("or_no_traceback") and not exc.frames):
        # (`or_no_traceback`: a message pasted without its traceback still matches, as its usual source)
        frame_values = _match_frames(rule, exc.frames)
        if frame_values is None:
            return None
        values.update(frame_values)
    return values


def _match_frames(rule: Rule, frames: list[Frame]) -> dict[str, Any] | None:
    for frame in reversed(frames):
        if "user" in rule.frame and frame.user != rule.frame["user"]:
            continue
        values: dict[str, Any] = {}
        for key in ("file", "function", "code"):
            pattern = rule.frame.get(key)
            if pattern is None:
                continue
            found = pattern.search(getattr(frame, key) or "")
            if found is None:
                break
            values.update(_groups(found))
        else:
            values["_frame"] = frame
            return values
    return None


def _match_log(rule: Rule, log_text: str) -> dict[str, Any] | None:
    values: dict[str, Any] = {}
    if rule.logs:
        found = _first_search(rule.logs, log_text)
        if found is None:
            return None
        values.update(_groups(found))
        start = log_text.rfind("\n", 0, found.start()) + 1
        end = log_text.find("\n", found.end())
        values["log_match"] = log_text[start : end if end >= 0 else len(log_text)]
    if any(pattern.search(log_text) for pattern in rule.not_logs):
        return None
    return values


def _first_search(patterns, text: str):
    for pattern in patterns:
        found = pattern.search(text)
        if found is not None:
            return found
    return None


def _groups(found) -> dict[str, Any]:
    return {name: value for name, value in found.groupdict().items() if value is not None}


def _diagnosis(
    rule: Rule,
    incident: Incident,
    exc: ExceptionInfo | None,
    index: int | None,
    values: dict[str, Any],
    weight: float,
    warnings: list[str],
) -> Diagnosis:
    matched_frame = values.pop("_frame", None)
    # A rule that recognises a library frame (torch's worker loop, collate) still reports the user's line.
    if matched_frame is not None and not matched_frame.user and exc is not None and exc.user_frame() is not None:
        matched_frame = exc.user_frame()
    frame = matched_frame or (exc.user_frame() if exc else None)
    if frame is None and exc is not None:
        # All of the traceback is library code (a compile error raised inside Dynamo): the side stack has the user's line.
        frame = exc.side_user_frame()
    if frame is None and exc is not None:
        frame = _user_frame_later_in_chain(incident, exc)
    if frame is None and incident.exception is not None:
        frame = incident.exception.user_frame()
    context = template_context(incident, exc, frame, {**rule.tables, **values})
    diagnosis = Diagnosis(
        rule=rule.id,
        category=rule.category,
        confidence=rule.confidence * weight,
        title="",
        hypothesis="",
        fix="",
        probe_names=list(rule.probes),
        values=values,
        exception_index=index,
        rule_location=rule.location,
        origin=rule.origin,
        context=context,
        weight=weight,
    )
    _render(diagnosis, rule, incident, exc, frame, warnings)
    diagnosis.evidence = _evidence(incident, exc, frame, values) + diagnosis.evidence
    return diagnosis


def _user_frame_later_in_chain(incident: Incident, exc: ExceptionInfo) -> Frame | None:
    """The user's line in an exception that `exc` led to ("The above exception was the direct cause of the following
    exception"): an error raised in a signal handler or a library (a killed DataLoader worker) has no user frame of its
    own, and the traceback printed after it shows the user's line that was running."""
    chain = incident.exceptions
    start = next((index for index, other in enumerate(chain) if other is exc), None)
    if start is None:
        return None
    for later in chain[start + 1 :]:
        if later.link is None:
            return None  # a separate traceback, not a consequence of this one
        if later.user_frame() is not None:
            return later.user_frame()
    return None


def choose_cause(rule: Rule, context: dict[str, Any]) -> tuple[Cause | None, str, str]:
    """The cause the context chooses, on what it was chosen ("evidence", "base_rate" or "" for none), and, for a
    population's base rate, the words naming that population.

    In order: the first cause whose `when` holds; the cause commonest in the population the log shows (its
    `population_rate`); the fallback (the one without `when`); the cause with the rule's base rate."""
    fallback = by_base_rate = None
    for cause in rule.causes:
        if cause.when and templates.condition(cause.when, context):
            return cause, "evidence", ""
    for cause in rule.causes:
        rate = cause.population_rate
        if rate and templates.condition(rate.where, context):
            return cause, "base_rate", rate.among
    for cause in rule.causes:
        if cause.base_rate:
            by_base_rate = cause
        elif not cause.when and not cause.population_rate:
            fallback = fallback or cause
    if fallback is not None:
        return fallback, "evidence", ""
    return by_base_rate, "base_rate" if by_base_rate else "", ""


def rechoose(diagnosis: Diagnosis, rule: Rule, warnings: list[str]) -> None:
    """Choose the cause again and re-render, now that the experiments' facts (`probe.<name>.<fact>`) are known."""
    if not diagnosis.context:
        return
    probe: dict[str, dict[str, Any]] = {}
    for result in diagnosis.probes:
        probe[result.name] = {**result.facts, "status": result.status}
    diagnosis.context = {**diagnosis.context, "probe": probe}
    evidence = list(diagnosis.evidence)
    try:
        _render(diagnosis, rule, None, None, None, warnings)
    except templates.TemplateRefused as exc:
        warnings.append(f"rule {rule.id} ({rule.location}): {exc}")
    diagnosis.evidence = evidence  # the match's evidence stands; the experiments are shown as such


def _render(diagnosis: Diagnosis, rule: Rule, incident: Incident | None, exc: ExceptionInfo | None,
            frame: Frame | None, warnings: list[str]) -> None:
    """Fill the diagnosis's texts, cause and fixes from the rule and the cause its context chooses."""
    cause, basis, among = choose_cause(rule, diagnosis.context)
    context = diagnosis.context = {**diagnosis.context, "cause_basis": basis}

    def render(name: str, source: str, strict: bool = False) -> str:
        try:
            return templates.render(source, context)
        except templates.TemplateRefused:
            raise  # the whole diagnosis is refused, not shown with a raw template
        except templates.TemplateError as exc_:
            warnings.append(f"rule {rule.id} ({rule.location}): {name}: {exc_}")
            if strict:
                raise
            return source.strip()

    rendered = {name: render(name, source) for name, source in rule.template_fields().items()}
    fixes = [Fix(rule.id, rendered["fix"])]
    if cause is not None:
        n = rule.causes.index(cause)
        try:
            # A cause whose texts cannot be rendered (a fact its templates use is missing) is not shown: the
            # rule's own text stands, rather than a raw template.
            chosen = {key: render(f"causes[{n}].{key}", getattr(cause, key), strict=True)
                      for key in ("title", "hypothesis", "confirm", "verify") if getattr(cause, key)}
            fixes = [Fix(option.id, render(f"causes[{n}].fixes[{m}]", option.text, strict=True), option.trial)
                     for m, option in enumerate(cause.fixes)] or [Fix(cause.id, rendered["fix"])]
            rendered.update(chosen)
        except templates.TemplateError:
            cause, fixes = None, [Fix(rule.id, rendered["fix"])]
    basis = basis if cause is not None else ""
    diagnosis.cause = f"{rule.id}/{cause.id}" if cause is not None else rule.id
    diagnosis.cause_basis = basis
    # A cause picked for its base rate says nothing the evidence did not: the rule's own confidence stands.
    own = cause.confidence if cause is not None and basis == "evidence" else None
    diagnosis.confidence = (own or rule.confidence) * diagnosis.weight
    diagnosis.title = rendered["title"]
    diagnosis.hypothesis = rendered["hypothesis"]
    if basis == "base_rate":
        where = "the log" if context.get("source") == "log" else "the run's traceback or experiments"
        if among:
            rate = cause.population_rate
            diagnosis.hypothesis = (f"Nothing in {where} decides between this error's causes; it comes from {among}, "
                                    f"and the commonest cause in resolved public reports of it from there ({rate.seen} of "
                                    f"{rate.of}) is this one. {diagnosis.hypothesis}")
        else:
            seen, of = cause.base_rate
            diagnosis.hypothesis = (f"Nothing in {where} decides between this error's causes; the commonest in resolved "
                                    f"public reports of it ({seen} of {of}) is this one. {diagnosis.hypothesis}")
    diagnosis.confirm = rendered.get("confirm", "")
    diagnosis.decide = rendered.get("decide", "") if rule.causes and basis != "evidence" else ""
    diagnosis.fixes = fixes
    diagnosis.fix = fixes[0].text
    if incident is not None:
        diagnosis.verify = rendered.get("verify") or _default_verify(incident, exc, frame)
        # (an evidence line whose template renders empty, under an `{% if %}`, is left out)
        diagnosis.evidence = [line for n in range(len(rule.evidence)) if (line := rendered[f"evidence[{n}]"].strip())]
    elif rendered.get("verify"):
        diagnosis.verify = rendered["verify"]


def template_context(incident: Incident, exc: ExceptionInfo | None, frame: Frame | None, values: dict[str, Any]) -> dict[str, Any]:
    """What a rule's templates can see: its captured values and plain fields of the incident."""
    side = exc.side_user_frame() if exc else None
    log_lines = incident.log_lines[-MAX_CONTEXT_LOG_LINES:]
    context: dict[str, Any] = {
        "exception": {"type": exc.type, "message": exc.message, "headline": exc.headline} if exc else None,
        "frame": _frame_values(frame) if frame else None,
        # Every frame of the exception, outermost first: the library line that failed (a loss in a package, a
        # summary() helper, DataParallel's parallel_apply) is evidence too when the user frame alone does not show it.
        "frames": _context_frames(incident, exc),
        # The innermost user frame of the stack printed beside the traceback: anomaly mode's forward
        # line (label "forward call") or the line Dynamo was tracing (label "user code").
        "side_frame": {**_frame_values(side), "label": exc.side_label} if side and exc else None,
        "location": frame.where if frame else "",
        "rank": exc.rank if exc and exc.rank is not None else incident.rank,
        "worker": exc.worker if exc and exc.worker is not None else incident.worker,
        "kind": incident.kind,
        # "log" for a pasted log (no batch was saved, nothing can be replayed), "run" or "wrapper" for a live one.
        "source": incident.source,
        "signal": incident.signal,
        "exit_code": incident.exit_code,
        "facts": incident.facts,
        "log_match": values.get("log_match", ""),
        # The log's lines outside the tracebacks (progress lines, warnings, prose around a paste): a cause's `when`
        # reads evidence there, e.g. a "Using DataParallel" line. The last ones only, to bound template work.
        "log_lines": log_lines,
        # The step/batch/iteration numbers those lines show, in order: all 0 means it failed in the first step.
        "log_steps": progress_indices(log_lines),
    }
    context.update(values)
    context["probe"] = {}  # the experiments' facts, once they have run (rechoose)
    return context


def _context_frames(incident: Incident, exc: ExceptionInfo | None) -> list[dict[str, Any]]:
    """The matched exception's frames (`frames[-1]` is the line that raised); when it has none (a paste that cut the
    traceback off from its error line), every frame the log shows, across its tracebacks."""
    if exc is not None and exc.frames:
        frames = exc.frames
    else:
        exceptions = incident.exceptions or ([incident.exception] if incident.exception else [])
        frames = [frame for other in exceptions for frame in other.frames]
    return [_frame_values(frame) for frame in frames[-MAX_CONTEXT_FRAMES:]]


def _frame_values(frame: Frame) -> dict[str, Any]:
    return {"file": frame.file, "line": frame.line, "function": frame.function, "code": frame.code or "", "where": frame.where,
            "user": frame.user}


def _evidence(incident: Incident, exc: ExceptionInfo | None, frame: Frame | None, values: dict[str, Any]) -> list[str]:
    evidence = []
    if exc is not None and exc.type:
        evidence.append(_clip(exc.headline))
    side = exc.side_user_frame() if exc is not None else None
    if frame is not None and frame is not side:
        code = f": {frame.code}" if frame.code else ""
        evidence.append(_clip(f"raised at {frame.where}{code}"))
    if side is not None and exc is not None:
        code = f": {side.code}" if side.code else ""
        evidence.append(_clip(f"{exc.side_label or 'side stack'} at {side.where}{code}"))
    log_match = values.get("log_match", "").strip()
    if log_match and not (exc is not None and exc.type and log_match == exc.headline.strip()):
        # (a log line that is the exception's own headline is already the first line of the evidence)
        evidence.append(_clip(f"log: {log_match}"))
    worker = exc.worker if exc and exc.worker is not None else incident.worker
    rank = exc.rank if exc and exc.rank is not None else incident.rank
    if worker is not None:
        evidence.append(f"in DataLoader worker {worker}")
    if rank is not None:
        evidence.append(f"on rank {rank}")
    if incident.signal:
        evidence.append(f"process died of {incident.signal}" + (f" (exit code {incident.exit_code})" if incident.exit_code is not None else ""))
    return evidence


def _default_verify(incident: Incident, exc: ExceptionInfo | None, frame: Frame | None) -> str:
    """What a fix must change, for a rule that does not say: the failure this incident shows is gone."""
    if exc is not None and exc.type:
        where = f" at {frame.where}" if frame else ""
        return f"Re-run after the fix: the run should get past the step that failed{where} without {exc.type}."
    if incident.kind == "hang":
        return "Re-run after the fix: the run should keep making progress where it hung."
    if incident.kind == "nan":
        nan = incident.facts.get("nan") if isinstance(incident.facts, dict) else None
        step = nan.get("step") if isinstance(nan, dict) else None
        past = f" past step {step}" if step is not None else ""
        return f"Re-run after the fix: the loss and gradients should stay finite{past}."
    if incident.signal:
        return f"Re-run after the fix: the process should no longer die of {incident.signal}."
    return "Re-run after the fix: the error this report shows should not appear again."


def _clip(text: str) -> str:
    return text if len(text) <= MAX_EVIDENCE_CHARS else text[: MAX_EVIDENCE_CHARS - 1] + "…"
