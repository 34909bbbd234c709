"""Every live object of a type, found once at a failure or at the end of a run (never per step)."""

from __future__ import annotations

import gc
import warnings
from typing import Any


def live_objects(kind: type) -> list[Any]:
    """The objects the garbage collector tracks that are instances of `kind`.

    isinstance() on some lazy module attributes warns about deprecations, and on a weak proxy whose
    referent has died it raises ReferenceError: neither is a reason to stop the scan.
    """
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if isinstance(obj, kind):
                    found.append(obj)
            except ReferenceError:
                continue
    return found
