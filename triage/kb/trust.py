"""Which project configs the user has trusted to run Python: `triage trust` records them, probes check them.

Rules on the search path are text: they are matched and rendered, never run.
A rules folder's triage.yaml may also register probes written in Python; such
a probe is imported only when its triage.yaml is trusted. Trusting records the
file's real path and the sha256 of its contents in
$XDG_CONFIG_HOME/triage/trusted.json, as direnv's `allow` does: a file that
changed since is untrusted again. The user's own rules folder (beside that
record) is trusted as it is; installed entry points need no record.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

STORE_NAME = "trusted.json"
MAX_CONFIG_BYTES = 2 << 20


class TrustError(Exception):
    """Raised when a path cannot be trusted or untrusted; the message says why."""


@dataclass(frozen=True)
class TrustEntry:
    """One trusted config: its real path, the digest recorded, and whether the file still has it."""

    path: str
    sha256: str
    state: str  # "trusted", "changed" or "missing"


def config_home(env: Mapping[str, str] | None = None) -> Path:
    """$XDG_CONFIG_HOME/triage (or ~/.config/triage), where the user's rules and the trust record live."""
    from .searchpath import user_rules_dir

    return user_rules_dir(env).parent


def store_path(env: Mapping[str, str] | None = None) -> Path:
    return config_home(env) / STORE_NAME


def digest(path: Path) -> str:
    """The sha256 of a file's contents; raises OSError if it cannot be read."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise OSError(f"{path} is over {MAX_CONFIG_BYTES >> 20} MB")
    return hashlib.sha256(data).hexdigest()


def read_store(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Real path -> sha256 of every trusted config; an unreadable or malformed record trusts nothing."""
    try:
        data = json.loads(store_path(env).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    entries = data.get("trusted") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return {}
    return {entry["path"]: entry["sha256"] for entry in entries
            if isinstance(entry, dict) and isinstance(entry.get("path"), str) and isinstance(entry.get("sha256"), str)}


def _write_store(store: dict[str, str], env: Mapping[str, str] | None) -> None:
    path = store_path(env)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"trusted": [{"path": p, "sha256": h} for p, h in sorted(store.items())]}, indent=2) + "\n"
    temporary = path.with_name(f".{STORE_NAME}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # only the user may change what is trusted
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, path)


def is_trusted(config: str | os.PathLike, env: Mapping[str, str] | None = None) -> bool:
    """True when the config's real path is recorded with the digest its contents have now, or it is the user's own."""
    real = Path(os.path.realpath(config))
    try:
        real.relative_to(os.path.realpath(config_home(env)))
        return real.is_file()  # the user's own folder, where only the user writes
    except ValueError:
        pass
    recorded = read_store(env).get(str(real))
    if recorded is None:
        return False
    try:
        return digest(real) == recorded
    except OSError:
        return False


def trust(config: Path, env: Mapping[str, str] | None = None) -> Path:
    """Record a config as trusted, with the digest of what it holds now; returns its real path."""
    real = Path(os.path.realpath(config))
    try:
        sha = digest(real)
    except OSError as exc:
        raise TrustError(f"cannot read {config}: {getattr(exc, 'strerror', None) or exc}") from None
    store = read_store(env)
    store[str(real)] = sha
    _write_store(store, env)
    return real


def untrust(config: Path, env: Mapping[str, str] | None = None) -> bool:
    """Forget a config; False when it was not trusted."""
    store = read_store(env)
    removed = store.pop(os.path.realpath(config), None) is not None
    if removed:
        _write_store(store, env)
    return removed


def entries(env: Mapping[str, str] | None = None) -> list[TrustEntry]:
    """Every recorded config, and whether it is still what was trusted."""
    out = []
    for path, sha in sorted(read_store(env).items()):
        try:
            state = "trusted" if digest(Path(path)) == sha else "changed"
        except OSError:
            state = "missing"
        out.append(TrustEntry(path, sha, state))
    return out


def resolve_config(target: Path | None, cwd: Path | None = None) -> Path:
    """The triage.yaml a `triage trust [PATH]` means: a file, a rules folder, or a project; default the current one."""
    from .searchpath import CONFIG_NAME, PROJECT_RULES, project_root

    base = cwd or Path.cwd()
    if target is None:
        root = project_root(base) or base
        candidate = root / PROJECT_RULES / CONFIG_NAME
        if not candidate.is_file():
            raise TrustError(f"no {PROJECT_RULES / CONFIG_NAME} in {root}; name the config to trust")
        return candidate
    path = target if target.is_absolute() else base / target
    for candidate in (path, path / CONFIG_NAME, path / PROJECT_RULES / CONFIG_NAME):
        if candidate.is_file():
            return candidate
    raise TrustError(f"{target}: no such file, and no {CONFIG_NAME} in it or in its {PROJECT_RULES}")
