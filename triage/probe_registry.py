"""The built-in probes by name: a leaf that rule validation and the probe runner both read, importing no probe."""

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
