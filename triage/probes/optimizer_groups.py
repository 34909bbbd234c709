"""optimizer_groups: the saved optimizer state's parameter groups against the optimizer it was loaded into.

`optimizer.load_state_dict` refuses a state whose groups differ in number or size from the optimizer's, without
saying how. torch's own `load_state_dict` frame on the traceback holds both: this experiment compares the group
sizes and, where the model is known, sets them beside its parameter counts (all of them, and those that require
grad), which tells a changed set of trained parameters (a frozen backbone) from groups set up differently. It
confirms when the groups differ and refutes when they match (the load failed for another reason).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..diagnosis import ProbeResult
from ._support import result, torch_frame_locals
from .context import ProbeContext

NAME = "optimizer_groups"


def optimizer_groups(ctx: ProbeContext) -> ProbeResult:
    local = torch_frame_locals(ctx.exception, "optimizer.py", "load_state_dict")
    optimizer = local.get("self") if local is not None else None
    saved = local.get("state_dict") if local is not None else None
    if optimizer is None or not isinstance(saved, dict) or "param_groups" not in saved:
        return result(NAME, "skipped", "torch's Optimizer.load_state_dict is not on the traceback with the state it "
                      "was given")
    try:
        saved_sizes = [len(group["params"]) for group in saved["param_groups"]]
        current_sizes = [len(group["params"]) for group in optimizer.param_groups]
    except (KeyError, TypeError) as exc:
        return result(NAME, "skipped", f"the saved state's param_groups cannot be read: {exc!r}")
    facts: dict[str, Any] = {"saved_groups": saved_sizes, "current_groups": current_sizes,
                             "optimizer": type(optimizer).__name__}
    model = ctx.model if isinstance(ctx.model, nn.Module) else None
    if model is not None:
        params = list(model.parameters())
        facts["model_parameters"] = len(params)
        facts["trainable_parameters"] = sum(1 for p in params if p.requires_grad)
    saved_text, current_text = _sizes(saved_sizes), _sizes(current_sizes)
    if saved_sizes == current_sizes:
        return result(NAME, "refuted", f"the saved state's parameter groups match the optimizer's ({saved_text})",
                      **facts)
    facts["same_group_count"] = len(saved_sizes) == len(current_sizes)
    reading = ""
    if model is not None:
        total, trainable = facts["model_parameters"], facts["trainable_parameters"]
        facts["saved_all_parameters"] = sum(saved_sizes) == total
        facts["current_trainable_only"] = sum(current_sizes) == trainable < total
        if facts["saved_all_parameters"] and facts["current_trainable_only"]:
            reading = (f": the saved optimizer held all {total} of the model's parameters, this one only the "
                       f"{trainable} that require grad now")
        else:
            reading = f" (the model has {total} parameters, {trainable} of them require grad)"
    return result(NAME, "confirmed", f"the saved {facts['optimizer']} state has {saved_text}, the optimizer it was "
                  f"loaded into has {current_text}{reading}", **facts)


def _sizes(sizes: list[int]) -> str:
    groups = f"{len(sizes)} parameter group{'s' if len(sizes) != 1 else ''}"
    return f"{groups} of {', '.join(map(str, sizes))} parameter{'s' if sizes != [1] else ''}"
