"""Probes: experiments that confirm or refute a diagnosis's hypothesis.

Probes are registered by name with the module that implements them, so
that rule validation (which must not import torch) knows every name, and a
probe's module is imported only when the probe runs. The built-in names live
in triage.probe_registry, a leaf the knowledge base reads too.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable

from ..probe_registry import (  # noqa: F401 (the registry, re-exported for probe authors)
    ENTRY_POINT_GROUP,
    PROBES,
    CustomProbe,
    custom_probes,
    entry_point_probes,
    known_probes,
    probe_target,
    register_probe,
    registered_probes,
)


class ProbeLoadError(Exception):
    """Raised when a probe's module or function cannot be imported; the message says which."""


def load_probe(name: str) -> Callable[..., Any]:
    """Import and return a probe's function; only called when the probe is about to run."""
    target = probe_target(name)
    if target is None:
        raise ProbeLoadError(f"unknown probe '{name}'")
    module_name, _, function_name = target.partition(":")
    custom = custom_probes().get(name) if name not in PROBES else None
    if custom is not None and custom.config is not None:
        from ..kb.trust import is_trusted

        if not is_trusted(custom.config):  # checked now, against the file as it is now
            raise ProbeLoadError(f"probe '{name}' is registered by {custom.config}, which is not trusted to run Python; "
                                 f"run `triage trust {custom.config}` if you trust it")
    for folder in custom.python_path if custom else ():
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
        return getattr(module, function_name or "probe")
    except Exception as exc:
        origin = f" (registered by {custom.origin})" if custom else ""
        raise ProbeLoadError(f"cannot load probe '{name}' from {target}{origin}: {type(exc).__name__}: {exc}") from None
