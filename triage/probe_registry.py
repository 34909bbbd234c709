"""Probes by name, built-in and custom: a leaf that rule validation and the probe runner both read, importing no probe."""

from __future__ import annotations

import functools
from dataclasses import dataclass

# name -> "module:function"; each implementation takes a ProbeContext and returns a ProbeResult.
PROBES: dict[str, str] = {
    "save_batch": "triage.probes.save_batch:save_batch",
    "cpu_rerun": "triage.probes.cpu_rerun:cpu_rerun",
    "index_range": "triage.probes.index_range:index_range",
    "shape_trace": "triage.probes.shape_trace:shape_trace",
    "device_census": "triage.probes.census:device_census",
    "dtype_census": "triage.probes.census:dtype_census",
    "anomaly_rerun": "triage.probes.anomaly_rerun:anomaly_rerun",
    "nonfinite_origin": "triage.probes.nonfinite:nonfinite_origin",
    "divergence_rerun": "triage.probes.divergence_rerun:divergence_rerun",
    "workers0_rerun": "triage.probes.workers0_rerun:workers0_rerun",
    "memory_breakdown": "triage.probes.memory_breakdown:memory_breakdown",
    # training-health experiments (the `learning` rules)
    "gradcheck": "triage.probes.gradcheck:gradcheck",
    "determinism": "triage.probes.determinism:determinism",
    "compile_compare": "triage.probes.compile_compare:compile_compare",
    # measurements on a replay of the model's last recorded call, from the weights a finished run ended with
    "softmax_rows": "triage.probes.step_measures:softmax_rows",
    "relu_activity": "triage.probes.step_measures:relu_activity",
    "gradient_reach": "triage.probes.step_measures:gradient_reach",
    "grad_carryover": "triage.probes.step_measures:grad_carryover",
    # a census of the live optimizers and modules, then one step or one replay as the fix would act
    "optimizer_stepped": "triage.probes.optimizer_census:optimizer_stepped",
    "optimizer_membership": "triage.probes.optimizer_census:optimizer_membership",
    "requires_grad_flags": "triage.probes.optimizer_census:requires_grad_flags",
    "lr_replay": "triage.probes.lr_replay:lr_replay",  # a few steps at the run's learning rate and at a tenth
    "graph_memory": "triage.probes.graph_memory:graph_memory",  # what the graphs a container keeps hold
    "heldout_learnability": "triage.probes.learnability:heldout_learnability",  # train on part, test on the rest
    # torch.compile failures: does the step run without the compiler?
    "eager_rerun": "triage.probes.eager_rerun:eager_rerun",
    # checkpoint failures: the state dict's keys against the model's, or the file torch.load refused
    "checkpoint_diff": "triage.probes.checkpoint_diff:checkpoint_diff",
    # autograd failures: where the graph was cut, carried across iterations, or left unreduced
    "grad_graph": "triage.probes.grad_graph:grad_graph",
    # "not compiled with CUDA" and kin: is the backend in this build, and which line of the user's asks for it
    "backend_census": "triage.probes.backend_census:backend_census",
    # spawned DataLoader workers that cannot start: which part (dataset, collate_fn, worker_init_fn) fails to pickle
    "worker_pickle": "triage.probes.worker_pickle:worker_pickle",
    # a collate that met samples of different sizes: which field of the samples is ragged, with its sizes
    "collate_fields": "triage.probes.collate_fields:collate_fields",
    # the tensors the failing line itself handles, re-read in its frame (triage/probes/line_tensors.py)
    "numpy_grad": "triage.probes.line_tensors:numpy_grad",
    "inplace_leaf": "triage.probes.line_tensors:inplace_leaf",
    "inplace_view": "triage.probes.line_tensors:inplace_view",
    "view_contiguity": "triage.probes.line_tensors:view_contiguity",
    "index_bounds": "triage.probes.line_tensors:index_bounds",
    # optimizer.load_state_dict refused a state: the saved groups' sizes against the optimizer's and the model's
    "optimizer_groups": "triage.probes.optimizer_groups:optimizer_groups",
    # "modified by an inplace operation": which node's saved tensor is stale, read from the failing graph
    "saved_versions": "triage.probes.saved_versions:saved_versions",
}

# Mechanical fixes a rule's cause may ask to be tried (`fixes: [{trial: ...}]`): each applies its fix to copies in
# an experiment's sandbox and re-runs the failing step (triage/probes/fix_trials.py implements them).
FIX_TRIALS = frozenset({
    "resize-linear-in", "resize-head", "resize-embedding", "shift-labels", "ignore-index", "target-long",
    "target-float", "input-float", "squeeze-output", "unsqueeze-target", "contiguous", "relu-not-inplace",
    "detach-hidden", "detach-fake", "strip-module-prefix", "map-location-cpu", "weights-only-false", "safe-globals",
})  # fmt: skip


def known_probes() -> frozenset[str]:
    """Names a rule may list under `probes:`: built-in, installed through entry points, or registered."""
    return frozenset(PROBES) | frozenset(custom_probes())


# Custom probes: teams opt in explicitly, either by installing a package that declares the
# entry-point group below, or by naming "module:function" in a rules folder's triage.yaml that
# the user trusted (`triage trust`). Nothing here imports a probe's module; `load_probe` does,
# when the probe runs, and only after checking that trust.
ENTRY_POINT_GROUP = "triage.probes"


@dataclass(frozen=True)
class CustomProbe:
    """A probe a team registered: its name, "module:function", and where it was registered."""

    name: str
    target: str
    origin: str
    python_path: tuple[str, ...] = ()  # folders to put on sys.path before importing the module
    config: str | None = None  # the triage.yaml that registered it, which must be trusted; None for an entry point


_registered: dict[str, CustomProbe] = {}


@functools.lru_cache(maxsize=1)
def entry_point_probes() -> dict[str, CustomProbe]:
    """Probes installed packages declare under the `triage.probes` entry-point group (metadata only)."""
    from importlib.metadata import entry_points

    found: dict[str, CustomProbe] = {}
    try:
        points = entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # a broken distribution's metadata must not break triage
        return found
    for point in points:
        dist = getattr(getattr(point, "dist", None), "name", None) or "an installed package"
        if point.name not in PROBES:
            found[point.name] = CustomProbe(point.name, point.value, f"entry point of {dist}")
    return found


def register_probe(probe: CustomProbe) -> None:
    """Make a team probe known by name for this process (the loader calls this for triage.yaml probes)."""
    if probe.name in PROBES:
        raise ValueError(f"probe name '{probe.name}' is built in; give the custom probe another name")
    _registered[probe.name] = probe


def registered_probes() -> dict[str, CustomProbe]:
    """Probes registered by rules folders in this process (not the installed entry points)."""
    return dict(_registered)


def custom_probes() -> dict[str, CustomProbe]:
    """Every custom probe known now: installed entry points, then probes registered by rules folders."""
    return {**entry_point_probes(), **_registered}


def probe_target(name: str) -> str | None:
    """The "module:function" that implements a probe, built-in or custom; None for an unknown name."""
    if name in PROBES:
        return PROBES[name]
    custom = custom_probes().get(name)
    return custom.target if custom else None
