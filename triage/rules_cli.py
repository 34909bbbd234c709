"""`triage rules list|show|test|lint|new`: inspect, test, lint and scaffold knowledge-base rules."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from .cli_common import EXIT_FAILED, EXIT_OK, Parser, UsageError, add_version


def main(argv: list[str]) -> int:
    parser = Parser(prog="triage rules", description="Inspect, test, lint and scaffold knowledge-base rules "
                    "(see docs/team-rules.md). Exit status 1 when `test` or `lint` finds a problem.")  # fmt: skip
    add_version(parser)
    parser.add_argument("--rules", action="append", default=[], metavar="PATH",
                        help="extra rule file or folder, after the search path (repeatable)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    sub.required = True
    sub.add_parser("list", help="every rule in force, where it comes from, and what is overridden or disabled")
    show = sub.add_parser("show", help="a rule's what / why / confirm / fix and its file:line")
    show.add_argument("id", metavar="ID", help="the rule's id, e.g. shape.linear-in-features")
    for name in ("test", "lint"):
        command = sub.add_parser(name, help="run rule examples" if name == "test" else "report every problem in rule files")
        command.add_argument("paths", nargs="*", type=Path, metavar="PATH",
                             help="rule files or folders to check (default: every rule in force)")
    new = sub.add_parser("new", help="scaffold a rule (or a copy of an existing rule, to override it)")
    new.add_argument("id", metavar="ID",
                     help="the new rule's id, e.g. team.fused-ln-dim; an existing id copies that rule")
    new.add_argument("--dir", type=Path, default=None, metavar="DIR",
                     help="rules folder to write into (default: the project's .triage/rules)")
    args = parser.parse_args(argv)
    return {"list": _list, "show": _show, "test": _test, "lint": _lint, "new": _new}[args.command](args)


@dataclass
class _Selection:
    """The knowledge base loaded for a command, the rules it checks and the loading problems it reports."""

    kb: object
    rules: list
    problems: list


def _select(args: argparse.Namespace) -> _Selection:
    """With PATHs: the built-in rules plus those paths, checking only the paths' rules. Otherwise the search path."""
    from .kb import load_knowledge_base, load_layers
    from .kb.loader import builtin_rules_dir, display_path
    from .kb.searchpath import Layer

    paths = list(getattr(args, "paths", None) or [])
    if not paths:
        kb = load_knowledge_base([Path(p) for p in args.rules])
        return _Selection(kb, kb.rules, kb.problems)
    builtin = builtin_rules_dir().resolve()
    given = [Layer("given", path, required=True) for path in paths]
    includes_builtin = any(path.resolve() == builtin for path in paths)
    kb = load_layers(given if includes_builtin else [Layer("built-in", builtin), *given])
    builtin_prefix = display_path(builtin)
    given_prefixes = [display_path(path.resolve()) for path in paths]
    # A built-in file's problems are the built-in layer's, left out unless that file (or folder) was given.
    problems = [p for p in kb.problems if includes_builtin or not _inside(p.path, builtin_prefix)
                or any(p.path == prefix or _inside(p.path, prefix) for prefix in given_prefixes)]
    problems = list(dict.fromkeys(problems))  # a given built-in file is loaded by both layers
    return _Selection(kb, [rule for rule in kb.rules if rule.origin == "given"], problems)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/\\") + "/") or path.startswith(folder + "\\")


def _list(args: argparse.Namespace) -> int:
    from .kb.searchpath import user_rules_dir

    kb = _select(args).kb
    print("rule search path (earliest first; a later rule replaces an earlier one with the same id):")
    origins = {layer.origin for layer in kb.layers}
    rows = [(layer.origin, layer.path, f"{layer.rules} rules" + (f", config {layer.config}" if layer.config else ""))
            for layer in kb.layers]  # fmt: skip
    if "user" not in origins:
        rows.insert(1, ("user", str(user_rules_dir()), "absent"))
    if "project" not in origins:
        rows.insert(2, ("project", ".triage/rules", "none found upward from the working directory"))
    for origin, path, note in rows:
        print(f"  {origin:<13} {path}  ({note})")
    overrides = {o.by.id: o.replaced for o in kb.overridden}
    width = max((len(rule.id) for rule in [*kb.rules, *(d.rule for d in kb.disabled)]), default=10)
    print()
    for rule in kb.rules:
        note = ""
        if rule.id in overrides:
            replaced = overrides[rule.id]
            note = f"  (overrides {replaced.origin} {replaced.location})"
        print(f"{rule.id:<{width}}  {rule.category:<12} {rule.origin:<13} {rule.location}{note}")
    if kb.disabled:
        print("\ndisabled:")
        for item in kb.disabled:
            rule = item.rule
            print(f"{rule.id:<{width}}  {rule.category:<12} {rule.origin:<13} {rule.location}  (disabled by {item.at})")
    if kb.probes:
        print("\ncustom probes:")
        for probe in kb.probes.values():
            print(f"  {probe.name}  {probe.target}  ({probe.origin})")
    summary = f"{len(kb.rules)} rules in force, {len(kb.overridden)} overridden, {len(kb.disabled)} disabled"
    print(summary, file=sys.stderr)
    _warn(kb.problems)
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    kb = _select(args).kb
    rule = kb.get(args.id)
    disabled = next((d for d in kb.disabled if d.rule.id == args.id), None)
    if rule is None and disabled is not None:
        rule = disabled.rule
    if rule is None:
        from difflib import get_close_matches

        close = get_close_matches(args.id, [r.id for r in kb.rules], n=1)
        raise UsageError(f"no rule '{args.id}'" + (f"; did you mean '{close[0]}'?" if close else ""))
    print(f"{rule.id}  ({rule.category}, confidence {rule.confidence:.2f})")
    print(f"defined at {rule.location}  [{rule.origin}]")
    for override in kb.overridden:
        if override.by is rule:
            print(f"overrides {override.replaced.location}  [{override.replaced.origin}]")
    if disabled is not None:
        print(f"DISABLED by {disabled.at}  [{disabled.origin}]")
    for heading, text in (("What", rule.title), ("Why", rule.hypothesis), ("Confirm", rule.confirm), ("Fix", rule.fix),
                          ("Verify", rule.verify)):
        if text:
            print(f"\n{heading}\n  " + text.strip().replace("\n", "\n  "))
    if rule.causes:
        print("\nCauses (the first whose `when` holds is chosen)")
        for cause in rule.causes:
            rated = cause.base_rate or cause.population_rate
            chosen = [f"when: {cause.when}"] if cause.when else [] if rated else ["when: (fallback: no other holds)"]
            if cause.population_rate:
                rate = cause.population_rate
                chosen.append(f"population rate: {rate.seen} of {rate.of} public reports from {rate.among}, chosen when "
                              f"nothing decides and {rate.where}")
            if cause.base_rate:
                chosen.append(f"base rate: {cause.base_rate[0]} of {cause.base_rate[1]} public reports, chosen when nothing decides")
            print(f"  {rule.id}/{cause.id}  " + "; ".join(chosen))
            fixes = ", ".join(f"{f.id}" + (f" [trial {f.trial}]" if f.trial else "") for f in cause.fixes)
            if fixes:
                print(f"    fixes: {fixes}")
        if rule.decide:
            print("  undecided: " + rule.decide.strip().replace("\n", "\n  "))
    print("\nMatches")
    if rule.exception_types:
        print(f"  exception: {', '.join(rule.exception_types)}")
    for label, patterns in (("message", rule.messages), ("not message", rule.not_messages), ("log", rule.logs), ("not log", rule.not_logs)):
        for pattern in patterns:
            print(f"  {label}: {pattern.source}")
    if rule.probes:
        print(f"\nProbes\n  {', '.join(rule.probes)}")
    print(f"\nExamples: {len(rule.matches)} match, {len(rule.no_matches)} no_match")
    return EXIT_OK


def _test(args: argparse.Namespace) -> int:
    from .kb.selftest import test_rules

    selection = _select(args)
    _warn(selection.problems)
    count, failures = test_rules(selection.kb, selection.rules)
    for failure in failures:
        print(failure)
    passed = count - len(failures)
    print(f"{passed} passed, {len(failures)} failed ({len(selection.rules)} rules)")
    return EXIT_FAILED if failures or selection.problems else EXIT_OK


def _lint(args: argparse.Namespace) -> int:
    from .kb.lint import format_problem, lint

    selection = _select(args)
    problems = lint(selection.kb, selection.rules, selection.problems)
    for problem in problems:
        print(format_problem(problem) + "\n")
    files = len({rule.path for rule in selection.rules})
    print(f"{len(selection.rules)} rules in {files} files, {len(problems)} problem(s)", file=sys.stderr)
    return EXIT_FAILED if problems else EXIT_OK


def _new(args: argparse.Namespace) -> int:
    from .kb import load_knowledge_base
    from .kb.rule import ID_PATTERN
    from .kb.scaffold import ScaffoldError, write_rule
    from .kb.searchpath import PROJECT_RULES, find_project_rules

    if not ID_PATTERN.fullmatch(args.id):
        raise UsageError(f"'{args.id}' is not a rule id: use dotted lower-case words, e.g. team.fused-ln-dim")
    folder = args.dir or find_project_rules() or Path.cwd() / PROJECT_RULES
    try:
        written = write_rule(args.id, folder, load_knowledge_base([Path(p) for p in args.rules]))
    except ScaffoldError as exc:
        raise UsageError(str(exc)) from None
    print(written.message)
    return EXIT_OK


def _warn(problems) -> None:
    for problem in problems:
        print(f"triage: warning: {problem}", file=sys.stderr)
