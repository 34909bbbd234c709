"""Load YAML safely, keeping the line and column of every mapping key and list item.

Rule files are data written by people: a mistake must be reported at its
`file:line:col`, and a hostile file (alias bomb, deep nesting, huge size)
refused with a message rather than exhausting memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

MAX_RULE_FILE_BYTES = 2 * 1024 * 1024
MAX_DEPTH = 24
MAX_NODES = 200_000
# Explicit tags beyond plain data (e.g. !!python/object) are refused, never constructed or ignored.
ALLOWED_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "map", "seq", "timestamp")
)

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_STR_TAG = "tag:yaml.org,2002:str"


@dataclass(frozen=True)
class Position:
    """A 1-based line and column in a file."""

    line: int
    col: int


class LocatedDict(dict):
    """A mapping that remembers where it, each key and each value stand in the file."""

    position: Position
    key_positions: dict[Any, Position]
    value_positions: dict[Any, Position]


class LocatedList(list):
    """A list that remembers where it and each item stand in the file."""

    position: Position
    item_positions: list[Position]


class YamlError(Exception):
    """Raised when a rule file is not usable YAML; carries the position of the problem."""

    def __init__(self, message: str, position: Position | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.position = position


def load_located(text: str) -> Any:
    """Parse one YAML document into plain data made of LocatedDict/LocatedList and scalars."""
    if len(text.encode("utf-8", errors="replace")) > MAX_RULE_FILE_BYTES:
        raise YamlError(f"file is larger than {MAX_RULE_FILE_BYTES >> 20} MB; split it into families")
    try:
        _check_depth(text)
        node = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        position = Position(mark.line + 1, mark.column + 1) if mark else None
        raise YamlError(f"{exc.problem or exc.context or 'invalid YAML'}", position) from None
    except yaml.YAMLError as exc:
        raise YamlError(f"invalid YAML ({exc})") from None
    if node is None:
        return None
    if _expanded_size(node, {}) > MAX_NODES:
        raise YamlError(f"more than {MAX_NODES} YAML nodes once aliases are expanded (an alias bomb?); refused",
                        _position(node))
    return _Converter().convert(node, 0)


def _check_depth(text: str) -> None:
    """Refuse deep nesting from the event stream, before composing: libyaml's composer
    recurses once per level and crashes the interpreter (SIGSEGV) near 100,000 levels."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    mark = event.start_mark
                    position = Position(mark.line + 1, mark.column + 1)
                    raise YamlError(f"nested deeper than {MAX_DEPTH} levels; refused", position)
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.MarkedYAMLError as exc:
        # Newer libyaml (PyYAML 6.0.4) refuses deep nesting while scanning, before our count sees it:
        # the same refusal, in our words.
        if "depth" not in str(exc.problem or ""):
            raise
        mark = exc.problem_mark
        raise YamlError(f"nested deeper than {MAX_DEPTH} levels; refused",
                        Position(mark.line + 1, mark.column + 1) if mark else None) from None


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many nodes the document has with every alias expanded, counted once per shared node."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    size = 1
    if isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, sizes) + _expanded_size(v, sizes) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(item, sizes) for item in node.value)
    sizes[id(node)] = size
    return size


def _position(node: yaml.Node) -> Position:
    return Position(node.start_mark.line + 1, node.start_mark.column + 1)


class _Converter:
    def __init__(self) -> None:
        self.nodes = 0
        self.constructor = yaml.constructor.SafeConstructor()

    def convert(self, node: yaml.Node, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise YamlError(f"more than {MAX_NODES} YAML nodes (an alias bomb?); refused", _position(node))
        if depth > MAX_DEPTH:
            raise YamlError(f"nested deeper than {MAX_DEPTH} levels; refused", _position(node))
        if node.tag not in ALLOWED_TAGS and node.tag != "tag:yaml.org,2002:merge":
            raise YamlError(f"YAML tag {node.tag!r} is not allowed in rule files; refused", _position(node))
        if isinstance(node, yaml.MappingNode):
            out = LocatedDict()
            out.position, out.key_positions, out.value_positions = _position(node), {}, {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise YamlError("merge keys (<<) are not supported in rule files", _position(key_node))
                key = self.convert(key_node, depth + 1)
                if not isinstance(key, (str, int, float, bool)) or key is None:
                    raise YamlError("mapping keys must be plain scalars", _position(key_node))
                if key in out:
                    raise YamlError(f"duplicate key {key!r}", _position(key_node))
                out[key] = self.convert(value_node, depth + 1)
                out.key_positions[key] = _position(key_node)
                out.value_positions[key] = _position(value_node)
            return out
        if isinstance(node, yaml.SequenceNode):
            items = LocatedList()
            items.position, items.item_positions = _position(node), []
            for item in node.value:
                items.append(self.convert(item, depth + 1))
                items.item_positions.append(_position(item))
            return items
        if node.tag == _STR_TAG:
            return node.value  # the common case, without the constructor's machinery
        try:
            return self.constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            raise YamlError(f"bad scalar ({getattr(exc, 'problem', exc)})", _position(node)) from None
