"""device_census and dtype_census: where every parameter, buffer and input lives, and which ones disagree.

Only metadata is read (device and dtype are host-side), so both are safe after a
CUDA error. Besides registered parameters and buffers, plain tensor attributes of
modules are listed too: `.to(device)` does not move them, a classic source of
"Expected all tensors to be on the same device".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch import nn

from ..diagnosis import ProbeResult
from ._support import describe, iter_tensors, module_names, result, torch_frame_locals
from .context import ProbeContext

_CLASS_LOSSES = ("CrossEntropyLoss", "NLLLoss", "cross_entropy", "nll_loss")
_REGRESSION_LOSSES = ("MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "BCELoss", "BCEWithLogitsLoss",
                      "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
                      "binary_cross_entropy_with_logits")


@dataclass
class Entry:
    """One tensor the model or the failing call holds: what it is and its metadata."""

    label: str  # "parameter `weight` of fc1 (Linear)"
    tensor: torch.Tensor
    kind: str  # parameter | buffer | attribute | input | optimizer state
    hint: str = ""

    @property
    def device(self) -> str:
        return str(self.tensor.device)

    @property
    def dtype(self) -> str:
        return str(self.tensor.dtype).replace("torch.", "")


def model_entries(model: nn.Module | None) -> list[Entry]:
    if model is None:
        return []
    entries: list[Entry] = []
    seen: set[int] = set()
    for path, module in model.named_modules():
        owner = f"{path} ({type(module).__name__})" if path else type(module).__name__
        for name, param in module._parameters.items():
            if param is not None and id(param) not in seen:
                seen.add(id(param))
                entries.append(Entry(f"parameter `{name}` of {owner}", param, "parameter"))
        for name, buf in module._buffers.items():
            if buf is not None and id(buf) not in seen:
                seen.add(id(buf))
                entries.append(Entry(f"buffer `{name}` of {owner}", buf, "buffer"))
        for name, value in vars(module).items():
            if isinstance(value, torch.Tensor) and id(value) not in seen:
                seen.add(id(value))
                entries.append(Entry(f"attribute `{name}` of {owner}", value, "attribute",
                                     "a plain tensor attribute, which .to() does not move: register it with "
                                     "self.register_buffer"))
    return entries


def input_entries(ctx: ProbeContext) -> list[Entry]:
    """Tensors the failing layer, the model and the loss were called with."""
    names = module_names(ctx.model if isinstance(ctx.model, nn.Module) else None)
    entries: list[Entry] = []
    seen: set[int] = set()
    sources = []
    if ctx.module is not None:
        path = names.get(id(ctx.module), ctx.module_name or "")
        owner = f"{path} ({type(ctx.module).__name__})" if path else type(ctx.module).__name__
        sources.append((f"input {{}} of {owner}", (tuple(ctx.module_args or ()), ctx.module_kwargs or {})))
    if ctx.model_args is not None:
        sources.append(("model input {}", (ctx.model_args, ctx.model_kwargs or {})))
    if ctx.loss_args is not None:
        sources.append(("loss input {}", (ctx.loss_args, ctx.loss_kwargs or {})))
    for template, value in sources:
        for path, tensor in iter_tensors(value):
            if id(tensor) not in seen:
                seen.add(id(tensor))
                entries.append(Entry(template.format(_arg_path(path)), tensor, "input"))
    return entries


def _arg_path(path: str) -> str:
    # iter_tensors over (args, kwargs) names them "[0][1]" / "[1]['mask']"
    if path.startswith("[0]["):
        return "arg" + path[4:].split("]", 1)[0] + path[4:].split("]", 1)[1]
    if path.startswith("[1]["):
        return path[4:].split("]", 1)[0].strip("'\"") + path[4:].split("]", 1)[1]
    return path


def optimizer_entries(optimizer, model: nn.Module | None) -> list[Entry]:
    if optimizer is None or not hasattr(optimizer, "state"):
        return []
    names = {id(p): n for n, p in model.named_parameters()} if isinstance(model, nn.Module) else {}
    entries: list[Entry] = []
    try:
        states = list(optimizer.state.items())
    except Exception:
        return []
    for param, state in states[:10000]:
        for key, value in (state.items() if isinstance(state, dict) else ()):
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                owner = names.get(id(param), "a parameter")
                entries.append(Entry(f"optimizer state `{key}` of {owner}", value, "optimizer state"))
    return entries


def _model(ctx: ProbeContext) -> nn.Module | None:
    if isinstance(ctx.model, nn.Module):
        return ctx.model
    return ctx.module if isinstance(ctx.module, nn.Module) else None


def _listed(entries: list[Entry], attr: str, limit: int = 4) -> str:
    shown = "; ".join((f"{e.label} on {e.device}" if attr == "device" else f"{e.label} is {e.dtype}")
                      + (f" ({e.hint})" if e.hint else "") for e in entries[:limit])
    more = f"; and {len(entries) - limit} more" if len(entries) > limit else ""
    return shown + more


def device_census(ctx: ProbeContext) -> ProbeResult:
    model = _model(ctx)
    held = model_entries(model) + optimizer_entries(ctx.optimizer, model)
    inputs = input_entries(ctx)
    if not held and not inputs:
        return result("device_census", "skipped", "no live model or inputs to inspect")
    weights = Counter(e.device for e in held if e.kind in ("parameter", "buffer")) or Counter(e.device for e in held)
    home = weights.most_common(1)[0][0] if weights else Counter(e.device for e in inputs).most_common(1)[0][0]
    odd = [e for e in held + inputs if e.device != home]
    everything = Counter(e.device for e in held + inputs)
    facts = {"devices": dict(everything), "home": home,
             "odd": [f"{e.label} on {e.device}" for e in odd][:50]}
    meta = [e for e in held + inputs if e.tensor.device.type == "meta"]
    facts["meta"] = [e.label for e in meta][:50]
    if not odd and meta:
        # One device, but meta holds no data: no step can compute on it, whatever else agrees.
        return result("device_census", "confirmed", f"every parameter, buffer and input is on meta, which holds no "
                      f"data ({len(meta)} tensors: {_listed(meta, 'device', 3)})", **facts)
    if not odd:
        return result("device_census", "refuted", f"every parameter, buffer and input is on {home} "
                      f"({sum(everything.values())} tensors)", **facts)
    held_n = sum(weights.values())
    detail = (f"the model's tensors are on {home} ({held_n} parameters/buffers) but "
              f"{_listed(sorted(odd, key=_priority), 'device')}")
    return result("device_census", "confirmed", detail, **facts)


def _priority(entry: Entry) -> int:
    return {"attribute": 0, "buffer": 1, "parameter": 2, "input": 3, "optimizer state": 4}.get(entry.kind, 5)


def dtype_census(ctx: ProbeContext) -> ProbeResult:
    """Facts: `home` (the model's floating dtype), `weight_dtype` (the failing call's own weights', else home),
    `mismatched` ([{"name", "arg", "dtype", "shape", "kind"}], kind one of input | state | parameter | buffer |
    target | indices: every tensor whose dtype disagrees, the failing call's inputs and recurrent state included, so
    that a fix can cast all of them; an embedding's non-integer indices also say `whole_numbers`), `odd` (the same as sentences) and `dtypes` (a count per dtype)."""
    model = _model(ctx)
    held = model_entries(model)
    inputs = input_entries(ctx)
    if not held and not inputs:
        return result("dtype_census", "skipped", "no live model or inputs to inspect")
    floats = Counter(e.dtype for e in held if e.tensor.is_floating_point())
    home = floats.most_common(1)[0][0] if floats else None
    found: list[Mismatch] = []
    if home is not None:
        found += [Mismatch(f"{e.label} is {e.dtype}", _fact(e.label, "", e.tensor, e.kind)) for e in held
                  if e.tensor.is_floating_point() and e.dtype != home]
    weights, call_mismatches = _failing_call_mismatches(ctx, model)
    found += call_mismatches
    found += _loss_mismatches(ctx)
    odd = [m.text for m in found]
    facts = {"dtypes": dict(Counter(e.dtype for e in held + inputs)), "home": home,
             "weight_dtype": weights or home, "mismatched": [m.fact for m in found][:50], "odd": odd[:50]}
    if not odd:
        shown = f"the model's floating tensors are {home}" if home else "the model has no floating tensors"
        kinds = Counter(f"{e.dtype}" for e in inputs)
        ins = f"; inputs: {', '.join(f'{n} {k}' for k, n in kinds.items())}" if inputs else ""
        return result("dtype_census", "refuted", f"no dtype disagreement: {shown}{ins}", **facts)
    lead = f"the model's floating tensors are {home}" if home else "the model holds no floating tensors"
    more = f"; and {len(odd) - 4} more" if len(odd) > 4 else ""
    return result("dtype_census", "confirmed", f"{lead}, but " + "; ".join(odd[:4]) + more, **facts)


@dataclass
class Mismatch:
    """One tensor whose dtype disagrees: the sentence for the detail and the fact for the rules."""

    text: str
    fact: dict


def _fact(name: str, arg: str, tensor: torch.Tensor, kind: str) -> dict:
    return {"name": name, "arg": arg, "dtype": str(tensor.dtype).replace("torch.", ""), "shape": list(tensor.shape),
            "kind": kind}


def _is_state(module: nn.Module, arg: str) -> bool:
    """The recurrent state of an RNN call: its second positional argument or `hx` (a tensor or an (h, c) pair)."""
    return isinstance(module, (nn.RNNBase, nn.RNNCellBase)) and (arg.startswith("arg1") or arg.startswith("hx"))


def _failing_call_mismatches(ctx: ProbeContext, model: nn.Module | None) -> tuple[str | None, list[Mismatch]]:
    """(the failing call's weight dtype, its floating inputs and state of another dtype)."""
    module = ctx.module if isinstance(ctx.module, nn.Module) else None
    if module is None:
        return None, []
    own = [p for p in module.parameters(recurse=False) if p.is_floating_point()]
    if not own:
        return None, []
    want = own[0].dtype
    weights = str(want).replace("torch.", "")
    names = module_names(model)
    path = names.get(id(module), ctx.module_name or "")
    owner = f"{path} ({type(module).__name__})" if path else type(module).__name__
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        return weights, _index_mismatches(ctx, owner)
    out = []
    for arg_path, tensor in iter_tensors((tuple(ctx.module_args or ()), ctx.module_kwargs or {})):
        if tensor.dtype == want:
            continue
        arg = _arg_path(arg_path)
        kind = "state" if _is_state(module, arg) else "input"
        what = "hidden state" if kind == "state" else "input"
        out.append(Mismatch(f"{what} {arg} of {owner} is {describe(tensor)} while its weights are {weights}",
                            _fact(f"{what} {arg} of {owner}", arg, tensor, kind)))
    return weights, out


def _index_mismatches(ctx: ProbeContext, owner: str) -> list[Mismatch]:
    """An embedding's indices (its first input) that are not integers, with whether they hold whole numbers (then
    a cast keeps every id; a fraction or a NaN says the ids were computed wrongly, not merely stored as floats)."""
    args = tuple(ctx.module_args or ())
    indices = args[0] if args else (ctx.module_kwargs or {}).get("input")
    if not isinstance(indices, torch.Tensor) or not (indices.is_floating_point() or indices.dtype == torch.bool):
        return []
    fact = _fact(f"input arg0 of {owner}", "arg0", indices, "indices")
    whole = None
    if indices.device.type == "cpu":
        whole = bool(torch.isfinite(indices).all() and (indices == indices.round()).all()) \
            if indices.is_floating_point() else True
    fact["whole_numbers"] = whole
    shown = {True: "; every value is a whole number, so `.long()` keeps the ids",
             False: "; some values are fractions, NaN or inf: the ids were computed wrongly", None: ""}[whole]
    return [Mismatch(f"the indices (arg0) of {owner} are {describe(indices)}: an embedding needs Long or Int "
                     f"indices{shown}", fact)]


def _loss_call(ctx: ProbeContext) -> tuple[str, tuple, dict] | None:
    """(the loss's name, its args, its kwargs): the recorded loss call, else a functional loss (F.cross_entropy,
    which no hook records) that raised, read from its own frame on the traceback."""
    if ctx.loss_args is not None and ctx.loss_fn is not None:
        fn = ctx.loss_fn
        name = type(fn).__name__ if isinstance(fn, nn.Module) else getattr(fn, "__name__", "")
        return name, tuple(ctx.loss_args), dict(ctx.loss_kwargs or {})
    for name in _CLASS_LOSSES + _REGRESSION_LOSSES:
        if name[0].islower():
            local = torch_frame_locals(ctx.exception, "functional.py", name)
            if local is not None and isinstance(local.get("input"), torch.Tensor):
                return name, (local["input"],), {"target": local.get("target")}
    return None


def _loss_mismatches(ctx: ProbeContext) -> list[Mismatch]:
    call = _loss_call(ctx)
    if call is None:
        return []
    name, args, kwargs = call
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    target = kwargs.get("target")
    if not isinstance(target, torch.Tensor):
        target = None
    if len(tensors) < 2 and target is None:
        return []
    prediction, target = tensors[0], target if target is not None else tensors[1]
    fact = _fact(f"target of {name}", "target", target, "target")
    if name in _CLASS_LOSSES:
        if (target.is_floating_point() and target.shape != prediction.shape) or (
                not target.is_floating_point() and target.dtype != torch.long):
            return [Mismatch(f"the target of {name} is {describe(target)}: class indices must be Long (int64)", fact)]
        return []
    if name in _REGRESSION_LOSSES and target.dtype != prediction.dtype:
        return [Mismatch(f"the target of {name} is {describe(target)} but its input is {describe(prediction)}: "
                         f"they must have the same dtype", fact)]
    return []
