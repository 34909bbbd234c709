"""What a probe is given: the ProbeContext, defined in triage.context so that capture can build it without importing probes."""

from __future__ import annotations

from ..context import ProbeContext

__all__ = ["ProbeContext"]
