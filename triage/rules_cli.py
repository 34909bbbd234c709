"""`triage rules list|show|test|lint`: inspect and test the knowledge base."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cli import EXIT_FAILED, EXIT_OK, UsageError, _Parser


def main(argv: list[str]) -> int:
    parser = _Parser(prog="triage rules", description="Inspect, test and lint knowledge-base rules.")
    parser.add_argument("--rules", action="append", default=[], metavar="PATH", help="extra rule file or folder (repeatable)")
    sub = parser.add_subparsers(dest="command", metavar="list|show|test|lint")
    sub.required = True
    sub.add_parser("list", help="every rule in force and where it comes from")
    show = sub.add_parser("show", help="a rule's what / why / confirm / fix and its file:line")
    show.add_argument("id")
    for name in ("test", "lint"):
        command = sub.add_parser(name, help="run rule examples" if name == "test" else "report every problem in rule files")
        command.add_argument("paths", nargs="*", type=Path, help="rule files or folders (default: the rules in force)")
    args = parser.parse_args(argv)
    return {"list": _list, "show": _show, "test": _test, "lint": _lint}[args.command](args)


def _kb(args: argparse.Namespace):
    from .kb import load_knowledge_base, load_paths

    if getattr(args, "paths", None):
        return load_paths(args.paths, origin="given")
    return load_knowledge_base([Path(p) for p in args.rules])


def _list(args: argparse.Namespace) -> int:
    kb = _kb(args)
    width = max((len(rule.id) for rule in kb.rules), default=10)
    for rule in kb.rules:
        print(f"{rule.id:<{width}}  {rule.category:<12} {rule.title}  [{rule.location}]")
    print(f"{len(kb.rules)} rules", file=sys.stderr)
    _warn(kb.problems)
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    kb = _kb(args)
    rule = kb.get(args.id)
    if rule is None:
        from difflib import get_close_matches

        close = get_close_matches(args.id, [r.id for r in kb.rules], n=1)
        raise UsageError(f"no rule '{args.id}'" + (f"; did you mean '{close[0]}'?" if close else ""))
    print(f"{rule.id}  ({rule.category}, confidence {rule.confidence:.2f})")
    print(f"defined at {rule.location}  [{rule.origin}]")
    for heading, text in (("What", rule.title), ("Why", rule.hypothesis), ("Confirm", rule.confirm), ("Fix", rule.fix)):
        if text:
            print(f"\n{heading}\n  " + text.strip().replace("\n", "\n  "))
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

    kb = _kb(args)
    _warn(kb.problems)
    count, failures = test_rules(kb)
    for failure in failures:
        print(failure)
    passed = count - len(failures)
    print(f"{passed} passed, {len(failures)} failed ({len(kb.rules)} rules)")
    return EXIT_FAILED if failures or kb.problems else EXIT_OK


def _lint(args: argparse.Namespace) -> int:
    from .kb.selftest import test_rules

    kb = _kb(args)
    problems = [str(p) + (f"\n    help: {p.hint}" if p.hint else "") for p in kb.problems]
    _count, failures = test_rules(kb)
    problems += [str(f) for f in failures]
    for problem in problems:
        print(problem)
    print(f"{len(kb.rules)} rules, {len(problems)} problem(s)", file=sys.stderr)
    return EXIT_FAILED if problems else EXIT_OK


def _warn(problems) -> None:
    for problem in problems:
        print(f"triage: warning: rule skipped: {problem}", file=sys.stderr)
