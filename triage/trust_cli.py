"""`triage trust [PATH]`, `triage trust --list`, `triage untrust PATH`: which project configs may run Python probes."""

from __future__ import annotations

import sys
from pathlib import Path

from .cli_common import EXIT_FAILED, EXIT_OK, Parser, UsageError, add_version

_HELP = """\
A rules folder's triage.yaml may register probes written in Python. They run only once you trust
that file: its real path and the sha256 of its contents are recorded, and a file that changes is
untrusted again. Rules themselves are text and need no trust."""


def main(argv: list[str]) -> int:
    """`argv` starts with the command: "trust" or "untrust"."""
    from .kb import trust

    command, rest = argv[0], argv[1:]
    parser = Parser(prog=f"triage {command}", description=_HELP)
    add_version(parser)
    if command == "trust":
        parser.add_argument("path", nargs="?", type=Path, help="triage.yaml, its rules folder, or a project "
                                                                "(default: this repository's .triage/rules/triage.yaml)")
        parser.add_argument("--list", action="store_true", help="show every trusted config and whether it changed")
    else:
        parser.add_argument("path", type=Path, help="a trusted triage.yaml, its rules folder, or a project")
    args = parser.parse_args(rest)
    try:
        if command == "trust" and args.list:
            if args.path is not None:
                raise UsageError("--list takes no PATH")
            return _list(trust)
        config = trust.resolve_config(args.path)
        if command == "untrust":
            if not trust.untrust(config):
                print(f"triage: {config} was not trusted", file=sys.stderr)
                return EXIT_FAILED
            print(f"untrusted {config}: its Python probes will not be imported")
            return EXIT_OK
        real = trust.trust(config)
    except trust.TrustError as exc:
        raise UsageError(str(exc)) from None
    print(f"trusted {real}: the Python probes it registers may run (until the file changes)")
    return EXIT_OK


def _list(trust) -> int:
    found = trust.entries()
    if not found:
        print(f"no trusted configs (recorded in {trust.store_path()})")
        return EXIT_OK
    for entry in found:
        note = {"trusted": "", "changed": "  (changed since trusted: untrusted until `triage trust` again)",
                "missing": "  (missing)"}[entry.state]
        print(f"{entry.path}  sha256:{entry.sha256[:12]}{note}")
    return EXIT_OK
