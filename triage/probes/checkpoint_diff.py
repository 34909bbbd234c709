"""checkpoint_diff: compare a failing checkpoint with what it was loaded into, or read the file torch.load refused.

`load_state_dict` failures: the model and the state dict are the live locals of
torch's own `load_state_dict` frame on the traceback. Their keys are compared as
strings: a prefix on every key of one side (`module.` from DataParallel,
`_orig_mod.` from torch.compile), keys cut by a fixed number of characters (a
`k[7:]` applied to keys that had no prefix), and tensors whose shapes differ.

`torch.load` failures: the file named in torch's `load` frame is read, never
unpickled: whether its zip archive is whole, which globals it would need under
`weights_only=True`, and on which devices its tensors were saved.
"""

from __future__ import annotations

import os
import re
import zipfile
from collections import Counter
from typing import Any

from ..diagnosis import ProbeResult
from ._support import result, torch_frame_locals
from .context import ProbeContext

NAME = "checkpoint_diff"
SHOWN = 3  # keys quoted in a detail


def checkpoint_diff(ctx: ProbeContext) -> ProbeResult:
    loading = torch_frame_locals(ctx.exception, "module.py", "load_state_dict")
    if loading is not None:
        return _compare(ctx, loading.get("self"), loading.get("state_dict"))
    reading = torch_frame_locals(ctx.exception, "serialization.py", "load")
    if reading is not None:
        return _read_file(ctx, reading.get("f"), reading.get("map_location"))
    return result(NAME, "skipped", "neither torch's load_state_dict nor torch.load is on the failing stack")


# ------------------------------------------------------------------------------------------ key comparison


def _compare(ctx: ProbeContext, model: Any, state: Any) -> ProbeResult:
    if not hasattr(model, "state_dict") or not hasattr(state, "keys"):
        return result(NAME, "skipped", "the model or the state dict is not readable in load_state_dict's frame")
    own = {key: tuple(value.shape) for key, value in model.state_dict().items() if hasattr(value, "shape")}
    saved = {key: tuple(value.shape) for key, value in state.items() if hasattr(value, "shape")}
    nested = sorted(key for key, value in state.items() if isinstance(value, dict)
                    and any(hasattr(inner, "shape") for inner in value.values()))
    missing = sorted(set(own) - set(saved))
    unexpected = sorted(set(saved) - set(own))
    facts: dict[str, Any] = {"model_keys": len(own), "checkpoint_keys": len(saved), "missing": len(missing),
                             "unexpected": len(unexpected), "missing_keys": missing[:20],
                             "unexpected_keys": unexpected[:20]}
    findings = []
    if nested:
        facts["nested_state_dicts"] = nested
        unexpected = [key for key in unexpected if key not in nested]
        inner = state[nested[0]]
        fits = sum(key in own for key in inner)
        findings.append(f"the dict given to load_state_dict is a whole checkpoint: {', '.join(repr(k) for k in nested)} "
                        f"hold(s) the tensors ({fits} of {len(own)} model keys are in {nested[0]!r})")
    prefix = _common_prefix_removed(unexpected, set(own))
    if prefix:
        facts["checkpoint_prefix"] = prefix
        findings.append(f"every checkpoint key has the prefix '{prefix}' the model's keys lack "
                        f"('{unexpected[0]}' against '{unexpected[0][len(prefix):]}')")
    model_prefix = _common_prefix_removed(missing, set(saved))
    if model_prefix:
        facts["model_prefix"] = model_prefix
        findings.append(f"every model key has the prefix '{model_prefix}' the checkpoint's keys lack "
                        f"('{missing[0]}' against '{missing[0][len(model_prefix):]}')")
    cut = _cut_by(missing, set(unexpected)) if not (prefix or model_prefix) else None
    if cut:
        facts["keys_cut_by"] = cut
        findings.append(f"each checkpoint key is a model key without its first {cut} characters "
                        f"('{missing[0][cut:]}' for '{missing[0]}'): a prefix was stripped from keys that had none")
    mismatched = [(key, saved[key], own[key]) for key in sorted(set(own) & set(saved)) if own[key] != saved[key]]
    if mismatched:
        facts["shape_mismatches"] = [{"key": k, "checkpoint": list(a), "model": list(b)} for k, a, b in mismatched[:20]]
        shown = "; ".join(f"{k}: checkpoint {list(a)}, model {list(b)}" for k, a, b in mismatched[:SHOWN])
        findings.append(f"{len(mismatched)} tensor(s) differ in shape ({shown})")
    if (missing or unexpected) and not (prefix or model_prefix or cut or nested):
        renamed = _renamed_parts(missing, unexpected)
        if renamed:
            facts["renamed"] = renamed
        findings.append(f"{len(missing)} key(s) missing ({', '.join(missing[:SHOWN]) or '-'}) and "
                        f"{len(unexpected)} unexpected ({', '.join(unexpected[:SHOWN]) or '-'})"
                        + (f"; the names differ in {renamed}" if renamed else ""))
    if not findings:
        return result(NAME, "refuted", f"the checkpoint's {len(saved)} tensors match the model's keys and shapes",
                      **facts)
    return result(NAME, _status(ctx, facts), "; ".join(findings), **facts)


def _common_prefix_removed(keys: list[str], targets: set[str]) -> str | None:
    """The dotted prefix that, removed from every key, gives keys of `targets` (at least 90% of them)."""
    if not keys:
        return None
    heads = Counter(key.split(".", 1)[0] + "." for key in keys if "." in key)
    if not heads:
        return None
    head, count = heads.most_common(1)[0]
    if count < len(keys):
        return None
    hits = sum(key[len(head):] in targets for key in keys)
    return head if hits >= 0.9 * len(keys) else None


def _cut_by(missing: list[str], unexpected: set[str]) -> int | None:
    """n when the unexpected keys are the missing ones without their first n characters (for most of them)."""
    for n in range(1, 16):
        if missing and sum(key[n:] in unexpected for key in missing) >= 0.9 * len(missing):
            return n
    return None


def _renamed_parts(missing: list[str], unexpected: list[str]) -> str | None:
    """'backbone -> encoder' when the two key lists differ by one consistent name part."""
    swaps: Counter = Counter()
    for a in missing:
        for b in unexpected:
            pa, pb = a.split("."), b.split(".")
            if len(pa) == len(pb):
                diff = [(x, y) for x, y in zip(pa, pb) if x != y]
                if len(diff) == 1:
                    swaps[diff[0]] += 1
    if not swaps:
        return None
    (model_part, checkpoint_part), count = swaps.most_common(1)[0]
    return f"'{checkpoint_part}' (checkpoint) -> '{model_part}' (model)" if count >= min(len(missing), 2) else None


def _status(ctx: ProbeContext, facts: dict[str, Any]) -> str:
    """Confirmed when the comparison shows what the diagnosis claims; refuted when it shows another mismatch."""
    rule = getattr(ctx.diagnosis, "rule", "") or ""
    if "prefix" in rule:
        return "confirmed" if facts.get("checkpoint_prefix") or facts.get("model_prefix") or facts.get("keys_cut_by") \
            else "refuted"
    if "size-mismatch" in rule or "shape" in rule:
        return "confirmed" if facts.get("shape_mismatches") else "refuted"
    if "whole-checkpoint" in rule:
        return "confirmed" if facts.get("nested_state_dicts") else "refuted"
    return "confirmed"


# ------------------------------------------------------------------------------------------ file reading

_DEVICE = re.compile(rb"(cuda(?::\d+)?|mps|xpu|hpu)")


def _read_file(ctx: ProbeContext, f: Any, map_location: Any = None) -> ProbeResult:
    if not isinstance(f, (str, os.PathLike)):
        return result(NAME, "skipped", "torch.load was given a file object, not a path: its bytes cannot be re-read")
    path = os.fspath(f)
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        return result(NAME, "confirmed" if _about(ctx, "missing", "not-found") else "inconclusive",
                      f"{path} cannot be read: {exc.strerror or exc}", path=path, readable=False)
    facts: dict[str, Any] = {"path": path, "bytes": size}
    if map_location is not None and not callable(map_location):
        facts["map_location"] = str(map_location)
    with open(path, "rb") as handle:
        head = handle.read(4)
    if not zipfile.is_zipfile(path):
        facts["zip"] = False
        if head[:1] == b"\x80":
            facts["format"] = "legacy pickle"
            return result(NAME, _verdict(ctx, facts), f"{path} ({size} bytes) is a legacy (pre-1.6) pickle, not a zip "
                          "archive", **facts)
        facts["truncated"] = head[:2] == b"PK"  # a zip that lost its central directory at the end
        what = "a zip archive cut short (its central directory is missing)" if facts["truncated"] else \
            f"not a checkpoint at all (it starts with {head!r})"
        return result(NAME, _verdict(ctx, facts), f"{path} ({size} bytes) is {what}", **facts)
    facts["zip"] = True
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            pickle_name = next((n for n in names if n.endswith("data.pkl")), None)
            data = archive.read(pickle_name) if pickle_name else b""
            broken = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        facts["truncated"] = True
        return result(NAME, _verdict(ctx, facts), f"{path} ({size} bytes): its zip archive is damaged ({exc})", **facts)
    if broken is not None:
        facts["damaged_member"] = broken
    devices = sorted({m.decode() for m in _DEVICE.findall(data)})
    facts["saved_on"] = devices or ["cpu"]
    facts["globals"] = _globals(path)
    parts = [f"{path} ({size} bytes) is a whole zip archive" if broken is None else
             f"{path}: member {broken} is damaged"]
    if devices:
        parts.append(f"its tensors were saved on {', '.join(devices)}")
    if "cuda" in facts.get("map_location", ""):
        parts.append(f"map_location={facts['map_location']} asks for a CUDA device")
    if facts["globals"]:
        parts.append("under weights_only=True it needs the globals " + ", ".join(facts["globals"][:5]))
    return result(NAME, _verdict(ctx, facts), "; ".join(parts), **facts)


def _globals(path: str) -> list[str]:
    """The non-tensor globals a weights_only load would refuse, as torch lists them (torch >= 2.5)."""
    import torch

    lister = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    if lister is None:
        return []
    try:
        return sorted(lister(path))
    except Exception:  # an archive torch cannot list (damaged, legacy) has already been described
        return []


def _about(ctx: ProbeContext, *words: str) -> bool:
    rule = getattr(ctx.diagnosis, "rule", "") or ""
    return any(word in rule for word in words)


def _verdict(ctx: ProbeContext, facts: dict[str, Any]) -> str:
    """Whether what the file shows is what the diagnosis claims."""
    if _about(ctx, "weights-only"):
        return "confirmed" if facts.get("globals") else "refuted"
    if _about(ctx, "corrupt", "truncat"):
        return "confirmed" if facts.get("truncated") or facts.get("damaged_member") or not facts.get("zip") \
            else "refuted"
    if _about(ctx, "gpu", "cuda", "map-location", "device"):
        on_device = any(d != "cpu" for d in facts.get("saved_on", [])) or "cuda" in facts.get("map_location", "")
        return "confirmed" if on_device else "refuted"
    if _about(ctx, "not-a-checkpoint"):
        return "confirmed" if facts.get("zip") is False and not facts.get("truncated") and "format" not in facts \
            else "refuted"
    return "inconclusive"
