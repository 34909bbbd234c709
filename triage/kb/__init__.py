"""The knowledge base: YAML rules, their validation, matching and self-tests. Never imports torch."""

from __future__ import annotations

from pathlib import Path

from .loader import KnowledgeBase, builtin_rules_dir, load_builtin, load_paths
from .matcher import diagnose
from .rule import CATEGORIES, Problem, Rule

__all__ = [
    "CATEGORIES", "KnowledgeBase", "Problem", "Rule", "builtin_rules_dir", "diagnose",
    "load_builtin", "load_knowledge_base", "load_paths",
]  # fmt: skip


def load_knowledge_base(extra: list[Path] | None = None) -> KnowledgeBase:
    """The built-in rules, then each extra path as a layer whose rules replace same-id rules before them."""
    kb = load_builtin()
    for path in extra or []:
        layer = load_paths([path], origin=str(path))
        kb.problems.extend(layer.problems)
        replaced = {rule.id for rule in layer.rules}
        kb.rules = [rule for rule in kb.rules if rule.id not in replaced] + layer.rules
    return kb
