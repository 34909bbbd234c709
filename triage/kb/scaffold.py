"""`triage rules new`: write a rule skeleton whose placeholders lint refuses until they are filled in.

For an id already in force (a built-in rule, say) it copies that rule's YAML
instead, so overriding a rule starts from the rule itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .loader import KnowledgeBase, display_path
from .rule import CATEGORIES, PLACEHOLDER, Rule
from .yamlpos import LocatedList, YamlError, load_located


class ScaffoldError(Exception):
    """Raised when the rule cannot be written: the id exists in that folder, or the file is not a rule list."""


@dataclass(frozen=True)
class Written:
    """Where the new rule went, and what to tell the author."""

    path: Path
    line: int
    message: str


SKELETON = """\
# Scaffolded by `triage rules new`: replace every {mark} ...>> placeholder with real text
# (lint and explain refuse this rule until you do), then run `triage rules lint {folder}`.
- id: {rule_id}
  category: {category}
  title: '{mark} what went wrong, in one line; it may use the values your groups capture>>'
  confidence: 0.9
  match:
    exception: RuntimeError     # short or dotted type name(s); remove to match any exception
    message: '{mark} a regex for the error message, with (?P<name>...) groups for its numbers>>'
  hypothesis: >
    {mark} why it happens, naming the captured values and where (the location value)>>
  confirm: >
    {mark} how the user confirms it, e.g. what to print and what it will show>>
  fix: >
    {mark} what to change, concretely>>
  verify: >
    {mark} how to check the fix worked: what to re-run and what should change>>
  examples:
    match:
      - |
        {mark} paste a real traceback or log excerpt this rule must match>>
    no_match:
      - '{mark} paste a real, similar message this rule must not match>>'
"""


def write_rule(rule_id: str, folder: Path, kb: KnowledgeBase) -> Written:
    """Append a skeleton (or a copy of the rule in force with this id) to `folder/<family>.yaml`."""
    folder = Path(folder)
    target = folder / f"{rule_id.split('.')[0]}.yaml"
    folder_key = str(folder.resolve())
    existing = kb.get(rule_id) or next((d.rule for d in kb.disabled if d.rule.id == rule_id), None)
    if existing is not None and str(Path(existing.path).resolve()).startswith(folder_key):
        raise ScaffoldError(f"rule '{rule_id}' is already defined in this folder, at {existing.location}")
    if existing is not None:
        block = _source_block(existing)
        if block is None:
            raise ScaffoldError(f"cannot read the source of '{rule_id}' at {existing.location}")
        text = f"# Overrides {rule_id} from {existing.location} ({existing.origin}); edit it here.\n{block}"
        what = f"copied rule '{rule_id}' from {existing.location} to override it"
    else:
        family = rule_id.split(".")[0]
        category = family if family in CATEGORIES else f"'{PLACEHOLDER} one of {', '.join(CATEGORIES)}>>'"
        text = SKELETON.format(mark=PLACEHOLDER, rule_id=rule_id, category=category, folder=display_path(folder))
        what = f"wrote a skeleton for '{rule_id}'; fill in every {PLACEHOLDER} ...>> placeholder"
    old = target.read_text(encoding="utf-8") if target.is_file() else ""
    separator = "" if not old else ("\n" if old.endswith("\n") else "\n\n")
    new = old + separator + text
    try:
        parsed = load_located(new)
    except YamlError as exc:
        raise ScaffoldError(f"{display_path(target)} is not valid YAML now ({exc.message}); fix it first") from None
    if not isinstance(parsed, LocatedList):
        raise ScaffoldError(f"{display_path(target)} is not a YAML list of rules; cannot append to it")
    folder.mkdir(parents=True, exist_ok=True)
    target.write_text(new, encoding="utf-8")
    line = parsed.item_positions[-1].line
    shown = display_path(target)
    return Written(target, line, f"{what}: {shown}:{line}\nnext: triage rules lint {display_path(folder)}")


def _source_block(rule: Rule) -> str | None:
    """The YAML text of one rule in its file, from its `- id:` line to the next rule, dedented."""
    try:
        lines = Path(rule.path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    start = rule.line - 1
    if not 0 <= start < len(lines):
        return None
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines):
        text = lines[end]
        if text.strip() and not text.lstrip().startswith("#") and len(text) - len(text.lstrip()) <= indent:
            break
        end += 1
    block = lines[start:end]
    while block and (not block[-1].strip() or block[-1].lstrip().startswith("#")):
        block.pop()
    return "\n".join(line[indent:] for line in block) + "\n"
