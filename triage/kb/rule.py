"""A knowledge-base rule: its schema, its validation, and the compiled form the matcher uses."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any

import regex

from ..incident import KINDS
from ..probe_registry import FIX_TRIALS, PROBES, entry_point_probes, registered_probes
from . import templates
from .safe_regex import SafePattern, compile_pattern
from .yamlpos import LocatedDict, LocatedList, Position

CATEGORIES = (
    "shape", "device", "dtype", "index", "cuda-assert", "inplace", "autograd", "oom", "nan",
    "dataloader", "checkpoint", "distributed", "cuda-env", "compile", "learning", "python",
)  # fmt: skip

RULE_KEYS = {
    "id": "a dotted id that reads as the finding, e.g. shape.linear-in-features",
    "category": "one of the categories in DESIGN.md",
    "title": "what went wrong, in one line (a template)",
    "confidence": "how sure a match makes us, 0 to 1",
    "match": "how to recognise the failure",
    "hypothesis": "why it happened (a template)",
    "confirm": "how to confirm it (a template)",
    "fix": "what to change (a template)",
    "verify": "how to check the fix worked: what to run and what should change (a template)",
    "evidence": "extra evidence lines (templates)",
    "probes": "names of probes that test the hypothesis",
    "references": "links to docs or issues",
    "aliases": "old ids of this rule",
    "examples": "match / no_match log excerpts that test the rule",
    "causes": "the specific causes this rule's text serves, each chosen by the evidence (`when`)",
    "decide": "which fact would decide between the causes, and how to get it (a template)",
    "tables": "named lookup tables (mappings of plain values) every template of the rule can read by name",
}
CAUSE_KEYS = {
    "id": "a kebab-case slug; the cause id is '<rule id>/<slug>'",
    "when": "a template expression over the match's values and `probe`; undefined names make it false",
    "confidence": "how sure this cause makes us, 0 to 1 (default: the rule's)",
    "title": "the title when this cause is chosen (a template)",
    "hypothesis": "why it happened, stating the evidence that chose this cause (a template)",
    "confirm": "how to confirm it (a template; default: the rule's)",
    "verify": "how to check the fix worked (a template; default: the rule's)",
    "fix": "what to change (a template); its fix id is the cause's slug",
    "fixes": "candidate fixes in order, each with id, text and an optional trial",
    "base_rate": "{seen: N, of: M}: in N of M resolved public reports of this error the cause was this one; "
                 "chosen when no cause's `when` holds (the sample: corpus/priors/<rule id>.yaml)",
    "population_rate": "{population: SLUG, among: WORDS, where: CONDITION, seen: N, of: M}: the commonest cause in "
                       "resolved reports of this error from one population (`where`, a fact the log shows, that "
                       "narrows which reports it resembles without deciding the cause); chosen before the fallback "
                       "and the base rate (the sample: corpus/priors/<rule id>+<population>.yaml, or `sample`)",
}
POPULATION_KEYS = {"population", "among", "where", "seen", "of", "sample"}
FIX_KEYS = {"id": "a kebab-case slug", "text": "what to change (a template)", "trial": "a fix trial that applies it"}
MATCH_KEYS = {
    "exception": "exception type name(s), short or dotted",
    "message": "regex(es) searched in the exception message; any may match",
    "not_message": "regex(es) that must not match the message",
    "log": "regex(es) searched in the log lines around the failure",
    "not_log": "regex(es) that must not match the log lines",
    "frame": "regexes for a frame's file/function/code; any frame may match",
    "kind": "incident kind(s): exception, hard-crash, hang, nan, silent",
}
FRAME_KEYS = {"file", "function", "code", "user", "or_no_traceback"}
EXAMPLE_KEYS = {"match", "no_match"}
EXAMPLE_ITEM_KEYS = {"log", "vars", "cause"}
ID_PATTERN = re.compile(r"[a-z][a-z0-9-]*(?:\.[a-z0-9][a-z0-9-]*)+")
SLUG_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]*")
DEFAULT_CONFIDENCE = 0.8
# What `triage rules new` writes where the author must put real content; a rule holding one is refused.
PLACEHOLDER = "<<fill:"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a rule file, where it is, and a hint how to mend it."""

    path: str
    line: int
    col: int
    message: str
    hint: str = ""

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.message}"


@dataclass
class Example:
    """A log excerpt a rule must (or must not) match, with values it must extract."""

    log: str
    line: int
    vars: dict[str, Any] = field(default_factory=dict)
    col: int = 1
    cause: str | None = None  # the cause the log alone must choose (its slug)


@dataclass
class FixOption:
    """One candidate fix of a cause: its id, its text (a template) and the trial that can test it."""

    id: str
    text: str
    trial: str = ""


@dataclass
class PopulationRate:
    """In `seen` of `of` resolved reports of the error from `among` (the logs where `where` holds), the cause was
    this one. `sample` names the sample file (corpus/priors/<sample>.yaml)."""

    population: str
    among: str
    where: str
    seen: int
    of: int
    sample: str


@dataclass
class Cause:
    """A sub-hypothesis: one specific cause of the rule's failure, chosen when `when` holds (always, without one)."""

    id: str
    hypothesis: str
    when: str = ""
    confidence: float | None = None
    title: str = ""
    confirm: str = ""
    verify: str = ""
    fixes: list[FixOption] = field(default_factory=list)
    # (seen, of): the commonest cause in a sample of resolved public reports, the pick when no evidence decides.
    base_rate: tuple[int, int] | None = None
    # The commonest cause in one population of those reports (a segmentation loss, a small GPU).
    population_rate: PopulationRate | None = None


@dataclass
class Rule:
    """A validated rule, its patterns compiled and its templates checked."""

    id: str
    category: str
    title: str
    hypothesis: str
    fix: str
    confirm: str = ""
    verify: str = ""
    confidence: float = DEFAULT_CONFIDENCE
    exception_types: tuple[str, ...] = ()
    messages: list[SafePattern] = field(default_factory=list)
    not_messages: list[SafePattern] = field(default_factory=list)
    logs: list[SafePattern] = field(default_factory=list)
    not_logs: list[SafePattern] = field(default_factory=list)
    frame: dict[str, Any] = field(default_factory=dict)
    kinds: tuple[str, ...] = ()
    evidence: list[str] = field(default_factory=list)
    probes: list[str] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    aliases: list[str] = field(default_factory=list)
    matches: list[Example] = field(default_factory=list)
    no_matches: list[Example] = field(default_factory=list)
    causes: list[Cause] = field(default_factory=list)
    decide: str = ""
    # Data the templates look up (the release that added each API), written once instead of in each template.
    tables: dict[str, Any] = field(default_factory=dict)
    path: str = ""
    line: int = 0
    origin: str = "built-in"
    layer: int = 0  # position of its layer on the search path; later layers win ties

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def needs_exception(self) -> bool:
        return bool(self.exception_types or self.messages or self.not_messages or self.frame)

    @property
    def specificity(self) -> int:
        """How many conditions a match satisfied; the more, the more specific."""
        return (
            bool(self.exception_types) + len(self.messages[:1]) + len(self.logs[:1]) + bool(self.frame)
            + bool(self.not_messages) + bool(self.not_logs) + bool(self.kinds)
        )  # fmt: skip

    def template_fields(self) -> dict[str, str]:
        out = {"title": self.title, "hypothesis": self.hypothesis, "fix": self.fix}
        if self.confirm:
            out["confirm"] = self.confirm
        if self.verify:
            out["verify"] = self.verify
        out.update((f"evidence[{n}]", text) for n, text in enumerate(self.evidence))
        if self.decide:
            out["decide"] = self.decide
        return out

    def cause_fields(self) -> dict[str, str]:
        """Every template of the causes, named `causes[N].KEY` (`when` as the template `templates.condition` renders)."""
        out: dict[str, str] = {}
        for n, cause in enumerate(self.causes):
            for key in ("title", "hypothesis", "confirm", "verify"):
                if getattr(cause, key):
                    out[f"causes[{n}].{key}"] = getattr(cause, key)
            if cause.when:
                out[f"causes[{n}].when"] = templates.condition_source(cause.when)
            if cause.population_rate:
                out[f"causes[{n}].population_rate.where"] = templates.condition_source(cause.population_rate.where)
            for m, option in enumerate(cause.fixes):
                out[f"causes[{n}].fixes[{m}]"] = option.text
        return out


class _Builder:
    """Turns one rule mapping into a Rule, collecting every problem rather than the first."""

    def __init__(
        self, data: LocatedDict, path: str, probes: frozenset[str] | None = None, source_lines: list[str] | None = None
    ) -> None:
        self.data = data
        self.path = path
        self.probes = frozenset(PROBES) | frozenset(registered_probes() if probes is None else probes)
        self.lines = source_lines or []
        self.problems: list[Problem] = []
        self.broken_patterns = 0

    def problem(self, position: Position | None, message: str, hint: str = "") -> None:
        position = position or self.data.position
        self.problems.append(Problem(self.path, position.line, position.col, message, hint))

    def key_pos(self, mapping: Any, key: str) -> Position | None:
        return getattr(mapping, "key_positions", {}).get(key) or getattr(mapping, "position", None)

    def value_pos(self, mapping: Any, key: str) -> Position | None:
        return getattr(mapping, "value_positions", {}).get(key) or getattr(mapping, "position", None)

    def locate(self, start: Position | None, needle: str) -> Position | None:
        """Where `needle` is written in the value starting at `start` (a template spans lines)."""
        if start is None or not self.lines or not needle:
            return start
        first = start.line - 1
        indent = None
        for number in range(first, min(len(self.lines), first + 200)):
            text = self.lines[number]
            if number > first and text.strip():
                current = len(text) - len(text.lstrip())
                indent = current if indent is None else indent
                if current < indent:  # the value ended; the next key began
                    break
            col = text.find(needle, start.col - 1 if number == first else 0)
            if col >= 0:
                return Position(number + 1, col + 1)
        return start

    def pattern_error_pos(self, position: Position | None, source: str, offset: int | None) -> Position | None:
        """The column of a regex error, when the pattern is written on one line as it is parsed."""
        if position is None or offset is None or not self.lines or position.line > len(self.lines):
            return position
        text = self.lines[position.line - 1][position.col - 1 :]
        for opening in ("'", '"', ""):
            if text.startswith(opening + source):  # written verbatim: no YAML escapes shift the offset
                return Position(position.line, position.col + len(opening) + offset)
        return position

    def unknown_keys(self, mapping: LocatedDict, allowed: dict[str, str] | set[str], where: str) -> None:
        for key in mapping:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), list(allowed), n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"allowed keys: {', '.join(sorted(allowed))}"
                self.problem(self.key_pos(mapping, key), f"unknown key '{key}' in {where}", hint)

    def text(self, mapping: Any, key: str, required: bool) -> str:
        value = mapping.get(key) if isinstance(mapping, dict) else None
        if value is None:
            misspelt = isinstance(mapping, dict) and difflib.get_close_matches(key, [str(k) for k in mapping], n=1)
            if required and not misspelt:  # a misspelt key is reported once, as unknown, with did-you-mean
                self.problem(getattr(mapping, "position", None), f"missing required key '{key}'")
            return ""
        if not isinstance(value, str) or not value.strip():
            self.problem(self.value_pos(mapping, key), f"'{key}' must be non-empty text")
            return ""
        return value

    def string_list(self, mapping: Any, key: str) -> tuple[list[str], list[Position]]:
        value = mapping.get(key)
        if value is None:
            return [], []
        if isinstance(value, str):
            return [value], [self.value_pos(mapping, key)]
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            positions = list(getattr(value, "item_positions", [])) or [self.value_pos(mapping, key)] * len(value)
            return list(value), positions
        self.problem(self.value_pos(mapping, key), f"'{key}' must be text or a list of text")
        return [], []

    def patterns(self, mapping: Any, key: str) -> list[SafePattern]:
        sources, positions = self.string_list(mapping, key)
        compiled = []
        for source, position in zip(sources, positions):
            if PLACEHOLDER in source:
                continue  # reported once by check_placeholders
            try:
                pattern = compile_pattern(source)
                pattern.line, pattern.col = (position.line, position.col) if position else (0, 0)
                compiled.append(pattern)
            except regex.error as exc:
                self.broken_patterns += 1
                offset = getattr(exc, "pos", None)
                where = f" at position {offset}" if offset is not None else ""
                self.problem(self.pattern_error_pos(position, source, offset),
                             f"bad regex in '{key}': {exc.msg if hasattr(exc, 'msg') else exc}{where}",
                             "patterns use the `regex` package's syntax; escape ( ) [ ] . * + ? literally with \\")
        return compiled

    def check_placeholders(self, value: Any, position: Position | None) -> None:
        """Refuse what `triage rules new` left for the author to fill in, so a scaffold never passes."""
        if isinstance(value, str):
            if PLACEHOLDER in value:
                hint = value[value.index(PLACEHOLDER) + len(PLACEHOLDER) :].split(">>")[0].strip()
                self.problem(self.locate(position, PLACEHOLDER), "placeholder from `triage rules new` not filled in",
                             f"replace it: {hint}" if hint else "replace it with real content")
        elif isinstance(value, dict):
            for key, item in value.items():
                self.check_placeholders(item, self.value_pos(value, key))
        elif isinstance(value, list):
            positions = getattr(value, "item_positions", [position] * len(value))
            for item, item_position in zip(value, positions):
                self.check_placeholders(item, item_position)

    def build(self) -> Rule | None:
        data = self.data
        self.check_placeholders(data, data.position)
        self.unknown_keys(data, RULE_KEYS, "a rule")
        rule_id = self.text(data, "id", required=True)
        if rule_id and not ID_PATTERN.fullmatch(rule_id):
            self.problem(self.value_pos(data, "id"), f"rule id '{rule_id}' is not dotted lower-case words",
                         "use family.finding, e.g. shape.linear-in-features")
        category = self.text(data, "category", required=True)
        if category and category not in CATEGORIES and PLACEHOLDER not in category:
            close = difflib.get_close_matches(category, CATEGORIES, n=1)
            self.problem(self.value_pos(data, "category"), f"unknown category '{category}'",
                         f"did you mean '{close[0]}'?" if close else f"one of: {', '.join(CATEGORIES)}")
        rule = Rule(
            id=rule_id, category=category,
            title=self.text(data, "title", required=True),
            hypothesis=self.text(data, "hypothesis", required=True),
            fix=self.text(data, "fix", required=True),
            confirm=self.text(data, "confirm", required=False),
            verify=self.text(data, "verify", required=False),
            path=self.path, line=data.position.line,
        )  # fmt: skip
        confidence = data.get("confidence", DEFAULT_CONFIDENCE)
        if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence <= 1:
            self.problem(self.value_pos(data, "confidence"), "confidence must be a number in (0, 1]")
        else:
            rule.confidence = float(confidence)
        self.build_match(rule)
        rule.evidence = self.string_list(data, "evidence")[0]
        rule.probes = self.string_list(data, "probes")[0]
        for name, position in zip(rule.probes, self.string_list(data, "probes")[1]):
            if name not in self.probes and name not in entry_point_probes():  # installed ones, read only on a miss
                names = sorted(self.probes | set(entry_point_probes()))
                close = difflib.get_close_matches(name, names, n=1)
                self.problem(position, f"unknown probe '{name}'",
                             f"did you mean '{close[0]}'?" if close else
                             "known probes: " + (", ".join(names) or "none") +
                             "; custom probes are registered in a rules folder's triage.yaml or the "
                             "`triage.probes` entry-point group")
        rule.references = self.string_list(data, "references")[0]
        rule.aliases = self.string_list(data, "aliases")[0]
        rule.decide = self.text(data, "decide", required=False)
        rule.tables = self.tables(data)
        self.build_causes(rule)
        self.check_templates(rule)
        self.build_examples(rule)
        return None if self.problems else rule

    def tables(self, data: LocatedDict) -> dict[str, Any]:
        value = data.get("tables")
        if value is None:
            return {}
        names = [name for name in value if isinstance(name, str) and name.isidentifier()] if isinstance(value, dict) else []
        if not isinstance(value, dict) or len(names) != len(value) or not all(isinstance(t, dict) for t in value.values()):
            self.problem(self.value_pos(data, "tables"), "'tables' maps names to tables (mappings)",
                         "e.g. tables: {added: {'torch.compile': '2.0.0'}}")
            return {}
        for name in sorted(set(names) & templates.CONTEXT_NAMES):
            self.problem(self.key_pos(value, name), f"table name '{name}' hides the template context's '{name}'")
        return {name: _plain(table) for name, table in value.items()}

    def build_causes(self, rule: Rule) -> None:
        causes = self.data.get("causes")
        if causes is None:
            return
        if not isinstance(causes, list) or not causes:
            self.problem(self.value_pos(self.data, "causes"), "'causes' must be a non-empty list of causes",
                         "each cause: id, when, hypothesis, fix (or fixes)")
            return
        seen: set[str] = set()
        for item in causes:
            if not isinstance(item, dict):
                self.problem(getattr(item, "position", None) or self.value_pos(self.data, "causes"),
                             "a cause is a mapping with id, when, hypothesis and fix")
                continue
            self.unknown_keys(item, CAUSE_KEYS, "a cause")
            cause_id = self.slug(item, "id", seen, "cause")
            cause = Cause(
                id=cause_id, hypothesis=self.text(item, "hypothesis", required=True),
                when=self.text(item, "when", required=False), title=self.text(item, "title", required=False),
                confirm=self.text(item, "confirm", required=False), verify=self.text(item, "verify", required=False),
            )  # fmt: skip
            if "confidence" in item:
                value = item["confidence"]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                    self.problem(self.value_pos(item, "confidence"), "confidence must be a number in (0, 1]")
                else:
                    cause.confidence = float(value)
            if "base_rate" in item:
                cause.base_rate = self.base_rate(item)
            if "population_rate" in item:
                cause.population_rate = self.population_rate(item, rule.id)
            if "fix" in item and "fixes" in item:
                self.problem(self.key_pos(item, "fixes"), "a cause has 'fix' or 'fixes', not both")
            elif "fixes" in item:
                cause.fixes = self.fix_options(item)
            elif "fix" in item:
                cause.fixes = [FixOption(cause_id, self.text(item, "fix", required=True))]
            rule.causes.append(cause)
        fallbacks = [cause.id for cause in rule.causes if not cause.when and not cause.base_rate and not cause.population_rate]
        if len(fallbacks) > 1:
            self.problem(self.value_pos(self.data, "causes"), f"causes {', '.join(fallbacks)} have no 'when'",
                         "only one cause may be the fallback; give the others a condition")
        rated = [cause.id for cause in rule.causes if cause.base_rate]
        if len(rated) > 1:
            self.problem(self.value_pos(self.data, "causes"), f"causes {', '.join(rated)} each have a 'base_rate'",
                         "only the commonest cause of the sample is the pick when nothing decides")
        elif rated and fallbacks:
            self.problem(self.value_pos(self.data, "causes"),
                         f"cause {fallbacks[0]} has no 'when' and cause {rated[0]} has a 'base_rate'",
                         "a when-less fallback is always chosen, so the base rate would never be used")

    def base_rate(self, cause: LocatedDict) -> tuple[int, int] | None:
        value = cause.get("base_rate")
        counts = (value.get("seen"), value.get("of")) if isinstance(value, dict) and set(value) == {"seen", "of"} else None
        if (counts is None or not all(isinstance(n, int) and not isinstance(n, bool) for n in counts)
                or not 0 < counts[0] <= counts[1]):
            self.problem(self.value_pos(cause, "base_rate"), "'base_rate' must be {seen: N, of: M} with 0 < N <= M",
                         "N of the M resolved public reports in corpus/priors/<rule id>.yaml had this cause")
            return None
        return counts

    def population_rate(self, cause: LocatedDict, rule_id: str) -> PopulationRate | None:
        value = cause.get("population_rate")
        hint = ("N of the M resolved public reports from that population in corpus/priors/<rule id>+<population>.yaml "
                "had this cause")
        if not isinstance(value, dict) or not {"population", "among", "where", "seen", "of"} <= set(value) \
                or not set(value) <= POPULATION_KEYS:
            self.problem(self.value_pos(cause, "population_rate"),
                         "'population_rate' must be {population, among, where, seen, of} (and optionally sample)", hint)
            return None
        seen, of = value.get("seen"), value.get("of")
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (seen, of)) or not 0 < seen <= of:
            self.problem(self.value_pos(cause, "population_rate"), "population_rate: seen and of must be 0 < N <= M", hint)
            return None
        texts = {key: value.get(key) for key in ("population", "among", "where")}
        if not all(isinstance(text, str) and text.strip() for text in texts.values()) or not SLUG_PATTERN.fullmatch(texts["population"]):
            self.problem(self.value_pos(cause, "population_rate"),
                         "population_rate: population is a kebab-case slug; among and where are text")
            return None
        sample = value.get("sample") or f"{rule_id}+{texts['population']}"
        return PopulationRate(texts["population"], texts["among"].strip(), texts["where"].strip(), seen, of, str(sample))

    def fix_options(self, cause: LocatedDict) -> list[FixOption]:
        items = cause.get("fixes")
        if not isinstance(items, list) or not items:
            self.problem(self.value_pos(cause, "fixes"), "'fixes' must be a non-empty list of {id, text, trial}")
            return []
        options: list[FixOption] = []
        seen: set[str] = set()
        for item in items:
            if not isinstance(item, dict):
                self.problem(getattr(item, "position", None) or self.value_pos(cause, "fixes"),
                             "a fix is a mapping with id, text and an optional trial")
                continue
            self.unknown_keys(item, FIX_KEYS, "a fix")
            option = FixOption(self.slug(item, "id", seen, "fix"), self.text(item, "text", required=True),
                               self.text(item, "trial", required=False))
            if option.trial and option.trial not in FIX_TRIALS:
                close = difflib.get_close_matches(option.trial, sorted(FIX_TRIALS), n=1)
                self.problem(self.value_pos(item, "trial"), f"unknown fix trial '{option.trial}'",
                             f"did you mean '{close[0]}'?" if close else "known trials: " + ", ".join(sorted(FIX_TRIALS)))
            options.append(option)
        return options

    def slug(self, mapping: LocatedDict, key: str, seen: set[str], what: str) -> str:
        value = self.text(mapping, key, required=True)
        if value and not SLUG_PATTERN.fullmatch(value):
            self.problem(self.value_pos(mapping, key), f"{what} id '{value}' is not a kebab-case slug",
                         "lower-case words joined by '-', e.g. one-based-labels")
        elif value in seen:
            self.problem(self.value_pos(mapping, key), f"{what} id '{value}' is given twice")
        seen.add(value)
        return value

    def build_match(self, rule: Rule) -> None:
        match = self.data.get("match")
        if not isinstance(match, dict) or not match:
            self.problem(self.value_pos(self.data, "match") if "match" in self.data else None,
                         "missing or empty 'match'", "give at least one of: " + ", ".join(MATCH_KEYS))
            return
        self.unknown_keys(match, MATCH_KEYS, "'match'")
        rule.exception_types = tuple(self.string_list(match, "exception")[0])
        rule.messages = self.patterns(match, "message")
        rule.not_messages = self.patterns(match, "not_message")
        rule.logs = self.patterns(match, "log")
        rule.not_logs = self.patterns(match, "not_log")
        kinds, positions = self.string_list(match, "kind")
        for kind, position in zip(kinds, positions):
            if kind not in KINDS:
                self.problem(position, f"unknown incident kind '{kind}'", f"one of: {', '.join(KINDS)}")
        rule.kinds = tuple(kinds)
        frame = match.get("frame")
        if frame is not None:
            if not isinstance(frame, dict):
                self.problem(self.value_pos(match, "frame"), "'frame' must be a mapping of file/function/code regexes")
            else:
                self.unknown_keys(frame, FRAME_KEYS, "'frame'")
                for key in ("file", "function", "code"):
                    if key in frame:
                        found = self.patterns(frame, key)
                        if found:
                            rule.frame[key] = found[0]
                for key in ("user", "or_no_traceback"):
                    if key in frame:
                        if isinstance(frame[key], bool):
                            rule.frame[key] = frame[key]
                        else:
                            self.problem(self.value_pos(frame, key), f"'{key}' must be true or false")
        misspelt = any(key not in MATCH_KEYS for key in match)  # already reported, with a did-you-mean
        if not (rule.exception_types or rule.messages or rule.logs or rule.frame or rule.kinds
                or self.broken_patterns or misspelt):
            self.problem(self.value_pos(self.data, "match"), "'match' has no condition that can match",
                         "give exception, message, log, frame or kind")

    def captured_names(self, rule: Rule) -> set[str]:
        names: set[str] = set()
        for pattern in [*rule.messages, *rule.logs, *(p for p in rule.frame.values() if isinstance(p, SafePattern))]:
            names |= pattern.group_names
        return names

    def check_templates(self, rule: Rule) -> None:
        patterns_broken = any("bad regex" in p.message for p in self.problems)
        captured = self.captured_names(rule)
        for name in sorted(captured & set(rule.tables)):
            self.problem(self.value_pos(self.data, "tables"), f"table name '{name}' is also a (?P<{name}>...) group")
        known = captured | templates.CONTEXT_NAMES | set(rule.tables)
        evidence_positions = list(getattr(self.data.get("evidence"), "item_positions", []))
        for name, source in {**rule.template_fields(), **rule.cause_fields()}.items():
            key = name.split("[")[0]
            label = name if key == "causes" else key  # "causes[1].when": which cause, which key
            start = self.value_pos(self.data, key)
            if key == "evidence" and evidence_positions:
                start = evidence_positions[int(name[len("evidence[") : -1])]
            try:
                used = templates.check(source)
                unsafe = templates.unsafe_uses(source)
            except templates.TemplateError as exc:
                self.problem(start, f"'{label}': {exc}")
                continue
            for reach in sorted(unsafe, key=lambda text: source.find(text)):
                self.problem(self.locate(start, reach),
                             f"'{label}' reaches for '{reach}', which the template sandbox refuses",
                             "templates may use only this rule's (?P<name>...) groups and: "
                             + ", ".join(sorted(templates.CONTEXT_NAMES)))
            if patterns_broken:
                continue  # the names a broken pattern would capture are unknown; say nothing rather than guess
            for unknown in sorted(used - known - set(unsafe)):
                close = difflib.get_close_matches(unknown, sorted(known), n=1)
                self.problem(self.locate(start, unknown),
                             f"'{label}' uses '{unknown}', which no pattern of this rule captures",
                             f"did you mean '{close[0]}'?" if close else "name it in a (?P<name>...) group")

    def build_examples(self, rule: Rule) -> None:
        examples = self.data.get("examples")
        if not isinstance(examples, dict):
            self.problem(self.key_pos(self.data, "examples") if "examples" in self.data else None,
                         "missing 'examples' with 'match' and 'no_match' lists",
                         "every rule is tested: give real log excerpts it must and must not match")
            return
        self.unknown_keys(examples, EXAMPLE_KEYS, "'examples'")
        for key, target in (("match", rule.matches), ("no_match", rule.no_matches)):
            items = examples.get(key)
            if not isinstance(items, list) or not items:
                self.problem(self.value_pos(examples, key) if key in examples else examples.position,
                             f"'examples.{key}' must be a non-empty list")
                continue
            for item, position in zip(items, items.item_positions if isinstance(items, LocatedList) else []):
                if isinstance(item, str):
                    target.append(Example(item, position.line, col=position.col))
                elif isinstance(item, dict) and isinstance(item.get("log"), str):
                    self.unknown_keys(item, EXAMPLE_ITEM_KEYS, "an example")
                    values = item.get("vars") or {}
                    if not isinstance(values, dict):
                        self.problem(self.value_pos(item, "vars"), "'vars' must map names to expected values")
                        values = {}
                    cause = item.get("cause")
                    if cause is not None and cause not in {c.id for c in rule.causes}:
                        self.problem(self.value_pos(item, "cause"), f"example names cause '{cause}', which this rule "
                                     "does not have", "one of: " + (", ".join(c.id for c in rule.causes) or "none"))
                    target.append(Example(item["log"], position.line, dict(values), position.col, cause))
                else:
                    self.problem(position, "an example is a log excerpt, or a mapping with 'log' and 'vars'")


def build_rule(
    data: Any,
    path: str,
    position: Position,
    probes: frozenset[str] | None = None,
    source_lines: list[str] | None = None,
) -> tuple[Rule | None, list[Problem]]:
    """Validate one rule mapping; returns the rule (None if it has problems) and the problems.

    `probes` are the custom probe names a rule may list besides the built-in and installed
    ones (default: those registered in this process);
    `source_lines` (the file's text) let a problem point inside a template or a pattern.
    """
    if not isinstance(data, LocatedDict):
        return None, [Problem(path, position.line, position.col, "a rule must be a mapping with id, category, match, ...")]
    builder = _Builder(data, path, probes, source_lines)
    rule = builder.build()
    return rule, builder.problems


def _plain(value: Any) -> Any:
    """A table as plain dicts and lists (the loader's located containers carry file positions)."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value
