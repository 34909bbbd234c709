"""torch-triage: diagnose why a PyTorch run died, from a live run or a pasted log.

`install`, `uninstall`, `watch`, `track` and `NonFiniteError` are imported from
triage.wrapper on first use, so `import triage` stays cheap and torch-free. `%load_ext triage` finds the
IPython extension hooks here; their code loads from triage.integrations.ipython when they are called.
"""

from __future__ import annotations

from typing import Any

from .version import __version__

_WRAPPER_NAMES = ("install", "uninstall", "watch", "track", "NonFiniteError")
__all__ = ["__version__", *_WRAPPER_NAMES]


def __getattr__(name: str) -> Any:
    if name in _WRAPPER_NAMES:
        from . import wrapper

        return getattr(wrapper, name)
    raise AttributeError(f"module 'triage' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext triage`: diagnose each failing cell with its live state; `%triage` reprints the last report."""
    from .integrations.ipython import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """`%unload_ext triage`: put back IPython's previous exception handler."""
    from .integrations.ipython import unload_ipython_extension as unload

    unload(ipython)
