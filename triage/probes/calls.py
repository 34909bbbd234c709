"""The nn.Module calls that were running when an exception was raised, read from its traceback.

torch's `Module._call_impl(self, *args, **kwargs)` frame keeps the exact
arguments a module was called with (the user's `forward` may have reassigned
its own parameter names since), so the traceback alone is enough to re-run the
failing layer (the innermost call) or the whole model (the outermost one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType
from typing import Any


@dataclass
class ModuleCall:
    """One module call on the failing stack."""

    module: Any
    args: tuple
    kwargs: dict[str, Any] = field(default_factory=dict)


def _is_call_impl(frame) -> bool:
    code = frame.f_code
    return code.co_name == "_call_impl" and code.co_filename.replace("\\", "/").endswith("torch/nn/modules/module.py")


def module_calls(tb: TracebackType | None) -> list[ModuleCall]:
    """Module calls on the traceback, outermost first (the model), innermost last (the failing layer)."""
    calls: list[ModuleCall] = []
    while tb is not None:
        frame = tb.tb_frame
        if _is_call_impl(frame):
            local = frame.f_locals
            module = local.get("self")
            args = local.get("args", ())
            kwargs = local.get("kwargs", {})
            if module is not None and isinstance(args, tuple) and isinstance(kwargs, dict):
                calls.append(ModuleCall(module, args, dict(kwargs)))
        tb = tb.tb_next
    return calls


def failing_calls(exc: BaseException | None) -> tuple[ModuleCall | None, ModuleCall | None]:
    """(outermost, innermost) module calls of an exception's traceback, or None for each when there are none."""
    if exc is None:
        return None, None
    calls = module_calls(exc.__traceback__)
    if not calls:
        return None, None
    return calls[0], calls[-1]
