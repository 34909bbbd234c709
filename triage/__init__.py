"""torch-triage: diagnose why a PyTorch run died, from a live run or a pasted log.

`install`, `uninstall`, `watch`, `track` and `NonFiniteError` are imported from
triage.wrapper on first use, so `import triage` stays cheap and torch-free.
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
