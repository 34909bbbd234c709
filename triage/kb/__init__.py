"""The knowledge base: YAML rules, their validation, matching and self-tests. Never imports torch."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from .loader import KnowledgeBase, builtin_rules_dir, load_builtin, load_layers, load_paths
from .matcher import diagnose
from .rule import CATEGORIES, Problem, Rule

__all__ = [
    "CATEGORIES", "KnowledgeBase", "Problem", "Rule", "builtin_rules_dir", "diagnose",
    "load_builtin", "load_knowledge_base", "load_layers", "load_paths",
]  # fmt: skip


def load_knowledge_base(
    extra: list[Path] | tuple[Path, ...] | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    *,
    builtin: bool = True,
    project: Path | None = None,
) -> KnowledgeBase:
    """The rules in force for a command run in `cwd`: the one loader explain and the runner share.

    Layers, earliest first: built-in, the user's folder, the project's .triage/rules
    (looked for from `project`, the script's folder, or else `cwd`, up to the repository
    root), TRIAGE_RULES, then `extra` (the --rules options).
    A later rule with the same id replaces an earlier one; triage.yaml files disable
    rules and register custom probes, which are then known to this process by name.
    Never raises for a bad rule file: its problems are in `kb.problems`.
    """
    import os

    from ..probe_registry import register_probe
    from .searchpath import search_path

    try:
        kb = load_layers(search_path([Path(p) for p in extra or ()], cwd=cwd, env=env, builtin=builtin,
                                       project=project))
    except Exception as exc:  # never lose the built-in rules to a bug in reading the team's layers
        if os.environ.get("TRIAGE_DEBUG"):
            raise
        kb = load_builtin() if builtin else KnowledgeBase()
        kb.problems.append(Problem("<rule search path>", 1, 1, f"internal error while loading team rules "
                                   f"({type(exc).__name__}: {exc}); using the built-in rules only"))
    for probe in kb.probes.values():
        register_probe(probe)
    return kb
