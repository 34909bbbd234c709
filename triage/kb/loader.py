"""Find and load rule files into a KnowledgeBase, with every problem reported as file:line:col."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .cache import cached
from .rule import Problem, Rule, build_rule
from .yamlpos import LocatedList, Position, YamlError, load_located

RULE_SUFFIXES = (".yaml", ".yml")


def builtin_rules_dir() -> Path:
    """The shipped knowledge base: inside the installed package, or beside it in a checkout."""
    package = Path(__file__).resolve().parent.parent
    installed = package / "knowledge_base"
    return installed if installed.is_dir() else package.parent / "knowledge_base"


@dataclass
class KnowledgeBase:
    """The rules in force, in load order, and the problems found while loading them."""

    rules: list[Rule] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def get(self, rule_id: str) -> Rule | None:
        for rule in self.rules:
            if rule.id == rule_id or rule_id in rule.aliases:
                return rule
        return None


def rule_files(path: Path) -> list[Path]:
    """The rule files under a path: the file itself, or every YAML file in a folder tree, sorted."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.suffix in RULE_SUFFIXES and p.is_file())


def load_rule_file(path: Path, display: str | None = None) -> tuple[list[Rule], list[Problem]]:
    """Load one YAML file holding a list of rules."""
    shown = display or str(path)
    try:
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
    rules: list[Rule] = []
    problems: list[Problem] = []
    for item, position in zip(data, data.item_positions):
        rule, found = build_rule(item, shown, position)
        problems.extend(found)
        if rule is not None:
            rules.append(rule)
    return rules, problems


def load_paths(paths: list[Path], origin: str = "built-in") -> KnowledgeBase:
    """Load every rule file under `paths` as one layer; a duplicated id is a problem."""
    files = [file for root in paths if root.exists() for file in rule_files(root)]
    return cached(files, f"{origin}\0{[str(p) for p in paths]}", lambda: _load_layer(paths, origin))


def _load_layer(paths: list[Path], origin: str) -> KnowledgeBase:
    kb = KnowledgeBase()
    seen: dict[str, Rule] = {}
    for root in paths:
        if not root.exists():
            kb.problems.append(Problem(str(root), 1, 1, "no such rule file or folder"))
            continue
        for file in rule_files(root):
            rules, problems = load_rule_file(file, _display(file))
            kb.problems.extend(problems)
            for rule in rules:
                rule.origin = origin
                if rule.id in seen:
                    first = seen[rule.id]
                    kb.problems.append(Problem(rule.path, rule.line, 1, f"duplicate rule id '{rule.id}'",
                                               f"first defined at {first.location}"))
                    continue
                seen[rule.id] = rule
                kb.rules.append(rule)
    return kb


def load_builtin() -> KnowledgeBase:
    return load_paths([builtin_rules_dir()])


def _display(path: Path) -> str:
    """A path as a person would type it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
