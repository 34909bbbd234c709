"""Probes: experiments that confirm or refute a diagnosis's hypothesis.

Probes are registered here by name with the module that implements them, so
that rule validation (which must not import torch) knows every name, and a
probe's module is imported only when the probe runs.
"""

from __future__ import annotations

# name -> "module:function"; each implementation takes a ProbeContext and returns a ProbeResult.
PROBES: dict[str, str] = {
    "save_batch": "triage.probes.save_batch:save_batch",
    "cpu_rerun": "triage.probes.cpu_rerun:cpu_rerun",
    "index_range": "triage.probes.index_range:index_range",
    "shape_trace": "triage.probes.shape_trace:shape_trace",
    "device_census": "triage.probes.census:device_census",
    "dtype_census": "triage.probes.census:dtype_census",
    "anomaly_rerun": "triage.probes.anomaly_rerun:anomaly_rerun",
    "workers0_rerun": "triage.probes.workers0_rerun:workers0_rerun",
    "memory_breakdown": "triage.probes.memory_breakdown:memory_breakdown",
}


def known_probes() -> frozenset[str]:
    """Names a rule may list under `probes:`."""
    return frozenset(PROBES)
