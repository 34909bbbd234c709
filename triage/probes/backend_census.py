"""backend_census: does this torch build have the device backend the failing code asks for, and which line asks?

"Torch not compiled with CUDA enabled" and its kin (MPS on Linux, XPU) say the build lacks a backend. The census
measures it in the failing process: whether the backend is compiled in and usable, the build's version, and the
user's line, innermost first, that names the backend (`.cuda()`, `device="cuda"`, `torch.cuda.set_device`,
`"mps"`), with whether it runs inside a module's own code, and, for CUDA, how many NVIDIA GPUs the machine itself
shows, whatever torch was built with (a CPU-only build on a GPU machine and a machine with no GPU need different
fixes). It confirms when the backend is missing from this build (or unusable here) and refutes when it is there:
then the build is not the cause. It reads build flags, device nodes and source lines only, so it runs in the
user's process.
"""

from __future__ import annotations

import glob
import os
import re
import sys
from typing import Any

import torch
from torch import nn

from ..diagnosis import ProbeResult
from ._support import result
from .context import ProbeContext

NAME = "backend_census"
# What a line says to ask for each backend.
_REQUESTS = {
    "cuda": re.compile(r"\.cuda\(|[\"']cuda(?::\d+)?[\"']|torch\.cuda\.(?!is_available|device_count)\w+|\bcuda\b"),
    "mps": re.compile(r"[\"']mps(?::\d+)?[\"']|torch\.mps\.\w+|\.mps\(|\bmps\b"),
    "xpu": re.compile(r"[\"']xpu(?::\d+)?[\"']|torch\.xpu\.\w+|\.xpu\(|\bxpu\b"),
}
_CREATES = re.compile(r"torch\.(?:zeros|ones|randn|rand|empty|tensor|arange|full|eye|randint)\b|\.new_\w+\(|Tensor\(")


def backend_census(ctx: ProbeContext) -> ProbeResult:
    backend = _backend(ctx)
    built, available = _state(backend)
    facts: dict[str, Any] = {"backend": backend, "built": built, "available": available,
                             "torch_version": torch.__version__, "cuda_version": torch.version.cuda}
    if backend == "cuda":
        facts["gpu_devices"] = nvidia_devices()
    request = _request(ctx, backend)
    if request is not None:
        facts.update(request)
    build = f"this torch ({torch.__version__}) is built {'with' if built else 'without'} {backend.upper()}"
    if built and available:
        return result(NAME, "refuted", f"{build} and {backend} is available here "
                      f"(torch.{backend}.is_available() is True): the build is not what failed", **facts)
    state = f"{build}; torch.{_module(backend)}.is_available() is {available}"
    if backend == "cuda":
        state += f", torch.version.cuda is {torch.version.cuda}"
        gpus = facts["gpu_devices"]
        if gpus is not None:
            state += f"; the machine shows {gpus} NVIDIA GPU{'' if gpus == 1 else 's'}" + (
                " (/dev/nvidia*)" if sys.platform.startswith("linux") else " (macOS has no CUDA)")
    if request is None:
        return result(NAME, "confirmed", f"{state}; no line of your code on the traceback names {backend}: a library "
                      f"asked for it", **facts)
    inside = f" (inside {request['module']}'s own code)" if request["module"] else ""
    names = f" ({'; '.join(request['names'])})" if request["names"] else ""
    return result(NAME, "confirmed", f"{state}; {request['where']}{inside} asks for it: `{request['line']}`{names}",
                  **facts)


def _backend(ctx: ProbeContext) -> str:
    """The backend the error names: the rule's `backend` group, else the message's, else CUDA."""
    values = getattr(ctx.diagnosis, "values", {}) or {}
    named = str(values.get("backend") or "").lower()
    if named in _REQUESTS:
        return named
    message = ctx.incident.exception.message if ctx.incident.exception else str(ctx.exception or "")
    found = next((name for name in ("mps", "xpu") if name in message.lower()), None)
    return found or "cuda"


def _module(backend: str) -> str:
    return "backends.mps" if backend == "mps" else backend


def nvidia_devices(dev: str = "/dev") -> int | None:
    """NVIDIA GPUs this machine shows whatever torch was built with: the driver's device nodes on Linux (a container
    sees those it was given), none on macOS (no CUDA there), None where it cannot be told (WSL2, Windows)."""
    if sys.platform == "darwin":
        return 0
    if not sys.platform.startswith("linux") or os.path.exists(os.path.join(dev, "dxg")):
        return None  # WSL2 reaches the GPU through /dev/dxg, with no /dev/nvidia* nodes
    return sum(bool(re.fullmatch(r"nvidia\d+", os.path.basename(path))) for path in glob.glob(os.path.join(dev, "nvidia*")))


def _state(backend: str) -> tuple[bool, bool]:
    """(compiled into this build, usable on this machine)."""
    if backend == "cuda":
        built = torch.backends.cuda.is_built()
        return built, built and torch.cuda.is_available()
    if backend == "mps":
        built = torch.backends.mps.is_built()
        return built, built and torch.backends.mps.is_available()
    xpu = getattr(torch, "xpu", None)
    built = bool(xpu is not None and getattr(torch._C, "_has_xpu", False))
    return built, built and bool(xpu.is_available())


def _request(ctx: ProbeContext, backend: str) -> dict[str, Any] | None:
    """The user's innermost traceback line that names the backend: where, the code, and the module whose method
    it is (None for a line outside any module's code), and whether it creates a tensor there."""
    pattern = _REQUESTS[backend]
    frames = ctx.incident.exception.frames if ctx.incident.exception else []
    live = {(f.f_code.co_filename, line): f for f, line in ctx.frames}
    for frame in reversed(frames):
        if not frame.user or not frame.code:
            continue
        owner = live.get((frame.file, frame.line))
        held = _names_holding(frame.code, owner, backend) if owner is not None else []
        if not pattern.search(frame.code) and not held:
            continue
        this = owner.f_locals.get("self") if owner is not None else None
        return {"where": f"{frame.file}:{frame.line} in {frame.function}", "line": frame.code.strip(),
                "function": frame.function, "module": type(this).__name__ if isinstance(this, nn.Module) else None,
                "creates_tensor": bool(_CREATES.search(frame.code)), "names": held}
    return None


def _names_holding(code: str, frame: Any, backend: str) -> list[str]:
    """`DEVICE` is device(type='mps')`-style notes for the names on the line whose value is the backend's device (a
    module-level `DEVICE = torch.device("mps")` the line only names)."""
    found = []
    for name in dict.fromkeys(re.findall(r"\b[A-Za-z_]\w*\b", code)):
        value = frame.f_locals[name] if name in frame.f_locals else frame.f_globals.get(name)
        if (isinstance(value, torch.device) and value.type == backend) or (
                isinstance(value, str) and value.split(":")[0] == backend):
            found.append(f"{name} is {value!r}")
    return found
