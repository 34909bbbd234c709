"""The rule search path: which rules folders are in force, in which order, and what their triage.yaml says.

Layers, earliest first: the built-in knowledge base, the user's folder
($XDG_CONFIG_HOME/triage/rules, default ~/.config/triage/rules), the project's
.triage/rules (looked for from the script's folder, or the working directory,
up to the root of its repository and never above it), each entry of
TRIAGE_RULES (os.pathsep-separated), then each --rules option. A rule replaces
an earlier rule with the same id. A rules folder may hold a `triage.yaml`
that disables rules by id and registers custom probes by "module:function";
no code is imported to read it, and a probe it registers is imported only
once the user trusts that file (see kb/trust.py).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..probe_registry import PROBES, CustomProbe
from .rule import ID_PATTERN, Problem
from .yamlpos import MAX_RULE_FILE_BYTES, LocatedDict, LocatedList, Position, YamlError, load_located

CONFIG_NAME = "triage.yaml"
PROJECT_RULES = Path(".triage") / "rules"
ENV_VAR = "TRIAGE_RULES"
ORIGINS = ("built-in", "user", "project", ENV_VAR, "--rules")

CONFIG_KEYS = {
    "disable": "rule ids to take out of force, e.g. [shape.batchnorm-single-sample]",
    "probes": 'custom probes, name: "module:function", imported only when the probe runs',
    "python_path": "folders (relative to this file) to search for those probe modules",
}
PROBE_NAME = re.compile(r"[a-z_][a-z0-9_]*")
PROBE_TARGET = re.compile(r"[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*:[A-Za-z_]\w*")


@dataclass(frozen=True)
class Layer:
    """One place rules come from: a folder or file, and which part of the search path put it there."""

    origin: str
    path: Path
    required: bool = False  # a missing path is a problem (it was named explicitly) rather than skipped


@dataclass
class LayerConfig:
    """What a rules folder's triage.yaml says, with where each entry is written."""

    path: str
    disable: list[tuple[str, Position]] = field(default_factory=list)
    probes: dict[str, CustomProbe] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)


def builtin_rules_dir() -> Path:
    """The shipped knowledge base: inside the installed package, or beside it in a checkout."""
    package = Path(__file__).resolve().parent.parent
    installed = package / "knowledge_base"
    return installed if installed.is_dir() else package.parent / "knowledge_base"


def project_root(start: Path) -> Path | None:
    """The repository a folder belongs to: the nearest folder at or above `start` holding `.git`; None outside one."""
    start = Path(os.path.realpath(start))
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None


def user_rules_dir(env: Mapping[str, str] | None = None) -> Path:
    """$XDG_CONFIG_HOME/triage/rules, or ~/.config/triage/rules when XDG_CONFIG_HOME is unset or relative."""
    env = os.environ if env is None else env
    config_home = env.get("XDG_CONFIG_HOME", "")
    if not config_home or not os.path.isabs(config_home):  # the XDG spec says to ignore a relative value
        home = env.get("HOME") or str(Path.home())
        config_home = os.path.join(home, ".config")
    return Path(config_home) / "triage" / "rules"


def find_project_rules(cwd: Path | None = None) -> Path | None:
    """The nearest .triage/rules from `cwd` (the script's folder, or the working directory) up to its repository root.

    Outside a repository only `cwd` itself is looked at: a folder above it (/tmp on a shared
    machine, a home folder) is not the project.
    """
    start = (cwd or Path.cwd()).resolve()
    root = project_root(start)
    folders = [start] if root is None else [start, *start.parents[: len(start.parts) - len(root.parts)]]
    for folder in folders:
        candidate = folder / PROJECT_RULES
        if candidate.is_dir():
            return candidate
    return None


def search_path(
    extra: list[Path] | tuple[Path, ...] = (),
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    builtin: bool = True,
    project: Path | None = None,
) -> list[Layer]:
    """Every layer in force, earliest first; a folder that appears twice is kept at its first place.

    `project` is where the project's rules are looked for (the script's folder); default `cwd`.
    """
    env = os.environ if env is None else env
    layers: list[Layer] = [Layer("built-in", builtin_rules_dir())] if builtin else []
    user = user_rules_dir(env)
    if user.is_dir():
        layers.append(Layer("user", user))
    project_rules = find_project_rules(project or cwd)
    if project_rules is not None:
        layers.append(Layer("project", project_rules))
    base = (cwd or Path.cwd())
    for entry in env.get(ENV_VAR, "").split(os.pathsep):
        if entry.strip():
            layers.append(Layer(ENV_VAR, _absolute(Path(entry.strip()).expanduser(), base), required=True))
    layers.extend(Layer("--rules", _absolute(Path(path).expanduser(), base), required=True) for path in extra)
    unique: list[Layer] = []
    seen: set[Path] = set()
    for layer in layers:
        key = layer.path.resolve() if layer.path.exists() else layer.path
        if key not in seen:
            seen.add(key)
            unique.append(layer)
    return unique


def _absolute(path: Path, base: Path) -> Path:
    return path if path.is_absolute() else base / path


def read_config(folder: Path, display: str) -> LayerConfig | None:
    """Read `folder/triage.yaml`, if there is one; every mistake in it becomes a Problem."""
    path = folder / CONFIG_NAME
    if not folder.is_dir() or not path.is_file():
        return None
    config = LayerConfig(display)

    def problem(position: Position | None, message: str, hint: str = "") -> None:
        position = position or Position(1, 1)
        config.problems.append(Problem(display, position.line, position.col, message, hint))

    try:
        if path.stat().st_size > MAX_RULE_FILE_BYTES:
            problem(None, f"file is over the {MAX_RULE_FILE_BYTES >> 20} MB limit; refused")
            return config
        data = load_located(path.read_text(encoding="utf-8"))
    except YamlError as exc:
        problem(exc.position, exc.message)
        return config
    except (OSError, UnicodeDecodeError) as exc:
        problem(None, f"cannot read ({exc})")
        return config
    if data is None:
        return config
    if not isinstance(data, LocatedDict):
        problem(getattr(data, "position", None), f"{CONFIG_NAME} is a mapping with keys: {', '.join(CONFIG_KEYS)}")
        return config
    for key in data:
        if key not in CONFIG_KEYS:
            close = difflib.get_close_matches(str(key), list(CONFIG_KEYS), n=1)
            problem(data.key_positions[key], f"unknown key '{key}' in {CONFIG_NAME}",
                    f"did you mean '{close[0]}'?" if close else f"allowed keys: {', '.join(CONFIG_KEYS)}")
    _read_disable(data, problem, config)
    python_path = _read_python_path(data, folder, problem)
    _read_probes(data, python_path, display, problem, config, folder)
    return config


def _read_disable(data: LocatedDict, problem, config: LayerConfig) -> None:
    value = data.get("disable")
    if value is None:
        return
    if isinstance(value, str):
        value = [value]
        positions = [data.value_positions["disable"]]
    elif isinstance(value, LocatedList):
        positions = value.item_positions
    else:
        problem(data.value_positions["disable"], "'disable' must be a list of rule ids")
        return
    for rule_id, position in zip(value, positions):
        if not isinstance(rule_id, str) or not ID_PATTERN.fullmatch(rule_id):
            problem(position, f"'{rule_id}' is not a rule id",
                    "rule ids look like family.finding, e.g. shape.view-invalid")
        else:
            config.disable.append((rule_id, position))


def _read_python_path(data: LocatedDict, folder: Path, problem) -> tuple[str, ...]:
    value = data.get("python_path")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if isinstance(value, str):
        positions = [data.value_positions["python_path"]]
    else:
        positions = getattr(value, "item_positions", [])
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        problem(data.value_positions["python_path"], "'python_path' must be a folder or a list of folders")
        return ()
    folders = []
    for item, position in zip(items, positions):
        resolved = (folder / Path(item).expanduser()).resolve()
        if not resolved.is_dir():
            problem(position, f"python_path folder '{item}' does not exist (resolved to {resolved})")
        else:
            folders.append(str(resolved))
    return tuple(folders)


def _read_probes(data: LocatedDict, python_path: tuple[str, ...], display: str, problem, config: LayerConfig,
                 folder: Path) -> None:
    value = data.get("probes")
    if value is None:
        return
    if not isinstance(value, LocatedDict):
        problem(data.value_positions["probes"], "'probes' maps probe names to \"module:function\"")
        return
    for name, target in value.items():
        key_pos, value_pos = value.key_positions[name], value.value_positions[name]
        if not isinstance(name, str) or not PROBE_NAME.fullmatch(name):
            problem(key_pos, f"probe name '{name}' must be lower-case letters, digits and _")
        elif name in PROBES:
            problem(key_pos, f"probe name '{name}' is built in", "give the custom probe its own name")
        elif not isinstance(target, str) or not PROBE_TARGET.fullmatch(target):
            problem(value_pos, f"probe '{name}' must name \"module:function\", got {target!r}",
                    "e.g. team_probes.fused_ln:check_build")
        else:
            config.probes[name] = CustomProbe(name, target, f"{display}:{key_pos.line}", python_path,
                                              config=os.path.realpath(folder / CONFIG_NAME))
