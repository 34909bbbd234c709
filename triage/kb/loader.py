"""Find and load rule files into a KnowledgeBase, with every problem reported as file:line:col.

Team layers load under one CPU-time budget (LOAD_BUDGET_S): validating a rule parses
its templates, so a 2 MB file of rules would otherwise cost tens of seconds. When the
budget runs out the rest is skipped with a problem at the first rule not loaded, and
the partial layer is not cached.
"""

from __future__ import annotations

import difflib
import gc
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..probe_registry import CustomProbe
from .cache import cached
from .rule import Problem, Rule, build_rule
from .searchpath import CONFIG_NAME, builtin_rules_dir, read_config
from .safe_regex import SafePattern
from .yamlpos import MAX_RULE_FILE_BYTES, LocatedList, Position, YamlError, load_located

RULE_SUFFIXES = (".yaml", ".yml")
LOAD_BUDGET_S = 2.0  # CPU seconds to load every team layer of one search path together


class _LoadBudget:
    """The CPU-time deadline for loading team layers; None while the built-in rules load."""

    deadline: float | None = None

    @classmethod
    def spent(cls) -> bool:
        return cls.deadline is not None and time.thread_time() > cls.deadline


class _BudgetSpent(Exception):
    """Raised out of a layer's loading when the load budget ran out, so the partial layer is not cached."""

    def __init__(self, kb: KnowledgeBase) -> None:
        super().__init__("load budget spent")
        self.kb = kb


def _budget_problem(path: str, line: int = 1, col: int = 1) -> Problem:
    return Problem(path, line, col, f"not loaded from here on: team rules took over {LOAD_BUDGET_S:g}s of CPU time "
                                    "to load; this rule, the rest of the file and later team files are skipped",
                   "split the rules over fewer, smaller files, or take out what is not needed")


@dataclass(frozen=True)
class Override:
    """A rule replaced by a later layer's rule with the same id."""

    replaced: Rule
    by: Rule


@dataclass(frozen=True)
class Disabled:
    """A rule taken out of force by a rules folder's triage.yaml, and where that is written."""

    rule: Rule
    at: str  # file:line of the `disable` entry
    origin: str  # the layer whose triage.yaml disabled it


@dataclass(frozen=True)
class LayerInfo:
    """One layer as loaded: where it is, which part of the search path, how many rules it gave."""

    origin: str
    path: str
    rules: int
    config: str | None = None


@dataclass
class KnowledgeBase:
    """The rules in force, in load order, and the problems found while loading them."""

    rules: list[Rule] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    layers: list[LayerInfo] = field(default_factory=list)
    overridden: list[Override] = field(default_factory=list)
    disabled: list[Disabled] = field(default_factory=list)
    probes: dict[str, CustomProbe] = field(default_factory=dict)

    def get(self, rule_id: str) -> Rule | None:
        for rule in self.rules:
            if rule.id == rule_id or rule_id in rule.aliases:
                return rule
        return None


def rule_files(path: Path) -> list[Path]:
    """The rule files under a path: the file itself, or every YAML file in a folder tree, sorted.

    A folder's own triage.yaml is its configuration, not rules; hidden files and folders are skipped.
    """
    if path.is_file():
        return [path]
    found = []
    for file in path.rglob("*"):
        relative = file.relative_to(path)
        if file.suffix not in RULE_SUFFIXES or any(part.startswith(".") for part in relative.parts):
            continue
        if relative == Path(CONFIG_NAME) or not file.is_file():
            continue
        found.append(file)
    return sorted(found)


def load_rule_file(
    path: Path, display: str | None = None, probes: frozenset[str] | None = None
) -> tuple[list[Rule], list[Problem]]:
    """Load one YAML file holding a list of rules; a mistake in it never raises, it is a Problem."""
    shown = display or str(path)
    try:
        return _load_rule_file(path, shown, probes)
    except Exception as exc:  # a bug of ours on a strange file: skip the file, keep the rest working
        if os.environ.get("TRIAGE_DEBUG"):
            raise
        message = f"internal error while loading this file ({type(exc).__name__}: {exc}); skipped"
        return [], [Problem(shown, 1, 1, message,
                            "set TRIAGE_DEBUG=1 for a traceback, and please report it")]


def _load_rule_file(path: Path, shown: str, probes: frozenset[str] | None) -> tuple[list[Rule], list[Problem]]:
    try:
        size = path.stat().st_size
        if size > MAX_RULE_FILE_BYTES:  # refused before reading it into memory
            return [], [Problem(shown, 1, 1, f"file is {size / 2**20:.1f} MB, over the {MAX_RULE_FILE_BYTES >> 20} MB "
                                             "limit for a rule file; refused", "split it into one file per family")]
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return [], [Problem(shown, 1, 1, "not UTF-8 text")]
    except OSError as exc:
        return [], [Problem(shown, 1, 1, f"cannot read ({exc.strerror or exc})")]
    try:
        data = load_located(text)
    except YamlError as exc:
        position = exc.position or Position(1, 1)
        return [], [Problem(shown, position.line, position.col, exc.message)]
    if data is None:
        return [], []
    if not isinstance(data, LocatedList):
        return [], [Problem(shown, 1, 1, "a rule file is a YAML list of rules (each item starts with '- id:')")]
    lines = text.splitlines()
    rules: list[Rule] = []
    problems: list[Problem] = []
    for item, position in zip(data, data.item_positions):
        if _LoadBudget.spent():
            problems.append(_budget_problem(shown, position.line, position.col))
            break
        rule, found = build_rule(item, shown, position, probes, lines)
        problems.extend(found)
        if rule is not None:
            rules.append(rule)
    return rules, problems


def load_paths(paths: list[Path], origin: str = "built-in", probes: frozenset[str] | None = None) -> KnowledgeBase:
    """Load every rule file under `paths` as one layer; an id defined twice in it is a problem."""
    files = [file for root in paths if root.exists() for file in rule_files(root)]
    salt = f"{origin}\0{[str(p) for p in paths]}\0{sorted(probes) if probes is not None else None}"
    try:
        return cached(files, salt, lambda: _load_layer(paths, origin, probes))
    except _BudgetSpent as spent:
        return spent.kb


def _load_layer(paths: list[Path], origin: str, probes: frozenset[str] | None) -> KnowledgeBase:
    kb = KnowledgeBase()
    seen: dict[str, Rule] = {}
    for root in paths:
        if not root.exists():
            kb.problems.append(Problem(display_path(root), 1, 1, "no such rule file or folder"))
            continue
        for file in rule_files(root):
            if _LoadBudget.spent():
                kb.problems.append(_budget_problem(display_path(file)))
                raise _BudgetSpent(kb)
            rules, problems = load_rule_file(file, display_path(file), probes)
            kb.problems.extend(problems)
            for rule in rules:
                rule.origin = origin
                if origin != "built-in":
                    _charge_searches_to(rule, rule.path)
                first = seen.get(rule.id)
                if first is not None:
                    kb.problems.append(Problem(rule.path, rule.line, 1,
                                               f"rule id '{rule.id}' is defined twice: here and at {first.location}",
                                               "ids are unique within a rules folder; rename one, or put an override "
                                               "of a built-in rule in one place only"))
                    continue
                seen[rule.id] = rule
                kb.rules.append(rule)
            if _LoadBudget.spent():
                raise _BudgetSpent(kb)
    return kb


def _charge_searches_to(rule: Rule, owner: str) -> None:
    """A team rule's searches draw on its file's time budget (and all team files' budget), see safe_regex."""
    frame_patterns = [pattern for pattern in rule.frame.values() if isinstance(pattern, SafePattern)]
    for pattern in [*rule.messages, *rule.not_messages, *rule.logs, *rule.not_logs, *frame_patterns]:
        pattern.owner = owner


def load_layers(layers: list) -> KnowledgeBase:
    """Load the layers of a search path (searchpath.Layer) into the rules in force.

    All triage.yaml files are read first, so a probe registered in any of them
    validates in every layer; then each layer's rules replace same-id rules of
    earlier layers (in place, keeping their rank); then disabled ids are removed.
    """
    # Validation allocates many small objects: in a process with a large heap (a notebook, a training script
    # calling install()) the cyclic collector's full passes would cost more than the loading itself, and count
    # against the load budget. Nothing built here forms cycles that must be freed before it returns.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _load_layers(layers)
    finally:
        if collecting:
            gc.enable()


def _load_layers(layers: list) -> KnowledgeBase:
    from . import safe_regex, templates

    safe_regex.reset_budgets()  # the rules in force now start with whole time budgets
    templates.reset_allowance()
    kb = KnowledgeBase()
    configs = {}
    for layer in layers:
        if layer.origin != "built-in" and layer.path.is_dir():
            shown = display_path(layer.path / CONFIG_NAME)
            config = _contained(lambda: read_config(layer.path, shown), shown, None, kb.problems)
            if config is not None:
                configs[layer] = config
                kb.problems.extend(config.problems)
                kb.probes.update(config.probes)
    probe_names = frozenset(kb.probes)
    in_force: dict[str, Rule] = {}
    try:
        for index, layer in enumerate(layers):
            if layer.origin != "built-in" and _LoadBudget.deadline is None:
                _LoadBudget.deadline = time.thread_time() + LOAD_BUDGET_S
            if not layer.path.exists():
                if layer.required:
                    kb.problems.append(Problem(display_path(layer.path), 1, 1,
                                               f"no such rule file or folder (from {layer.origin})"))
                continue
            loaded = _contained(lambda: load_paths([layer.path], origin=layer.origin, probes=probe_names),
                                display_path(layer.path), KnowledgeBase(), kb.problems)
            kb.problems.extend(loaded.problems)
            for rule in loaded.rules:
                rule.layer = index
                previous = in_force.get(rule.id)
                if previous is not None:
                    kb.overridden.append(Override(previous, rule))
                in_force[rule.id] = rule  # a replaced key keeps its place in the dict's order
            config = configs.get(layer)
            config_path = config.path if config else None
            kb.layers.append(LayerInfo(layer.origin, display_path(layer.path), len(loaded.rules), config_path))
    finally:
        _LoadBudget.deadline = None
    for layer, config in configs.items():
        for rule_id, position in config.disable:
            rule = in_force.pop(rule_id, None) or _pop_alias(in_force, rule_id)
            if rule is not None:
                kb.disabled.append(Disabled(rule, f"{config.path}:{position.line}", layer.origin))
            elif not any(d.rule.id == rule_id for d in kb.disabled):
                known = sorted(in_force)
                close = difflib.get_close_matches(rule_id, known, n=1)
                kb.problems.append(Problem(config.path, position.line, position.col,
                                           f"disables '{rule_id}', which no rules folder on the search path defines",
                                           f"did you mean '{close[0]}'?" if close else "see `triage rules list`"))
    kb.rules = list(in_force.values())
    return kb


def _contained(load, shown: str, fallback, problems: list[Problem]):
    """Run one loading step; a bug of ours on a strange folder costs that folder, not the run."""
    try:
        return load()
    except Exception as exc:
        if os.environ.get("TRIAGE_DEBUG"):
            raise
        problems.append(Problem(shown, 1, 1, f"internal error while loading ({type(exc).__name__}: {exc}); skipped",
                                "set TRIAGE_DEBUG=1 for a traceback, and please report it"))
        return fallback


def _pop_alias(in_force: dict[str, Rule], rule_id: str) -> Rule | None:
    for key, rule in in_force.items():
        if rule_id in rule.aliases:
            return in_force.pop(key)
    return None


def load_builtin() -> KnowledgeBase:
    return load_paths([builtin_rules_dir()])


def display_path(path: Path) -> str:
    """A path as a person would type it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


_display = display_path  # the name earlier code used
