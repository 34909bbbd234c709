"""Probes: experiments that confirm or refute a diagnosis's hypothesis.

Probes are registered here by name with the module that implements them, so
that rule validation (which must not import torch) knows every name, and a
probe's module is imported only when the probe runs.
"""

from __future__ import annotations

# name -> "module:function"; each implementation takes a ProbeContext and returns a ProbeResult.
PROBES: dict[str, str] = {}


def known_probes() -> frozenset[str]:
    """Names a rule may list under `probes:`."""
    return frozenset(PROBES)
