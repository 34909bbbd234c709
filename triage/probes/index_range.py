"""index_range: check integer inputs against what indexes them: embedding sizes and the number of classes.

With a model, the step is replayed on CPU copies with a pre-hook on every
nn.Embedding/EmbeddingBag, so each embedding's own input is checked against its
own num_embeddings; the loss's integer target is checked against the class
count (the loss input's dimension 1). Without one, the batch's integer tensors
are checked against the model's embeddings and its classifier's out_features.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..diagnosis import ProbeResult
from ._support import Unavailable, cuda_poisoned, describe, iter_tensors, module_names, readable, result
from .context import ProbeContext
from .step import ModelOutput, call, first_tensor, rebuild

NAME = "index_range"
_EMBEDDINGS = (nn.Embedding, nn.EmbeddingBag)
_CLASS_LOSSES = ("CrossEntropyLoss", "NLLLoss", "cross_entropy", "nll_loss", "MultiMarginLoss", "multi_margin_loss")
_TARGET_NAMES = ("label", "target", "y", "class")


@dataclass
class Check:
    """One integer tensor against the range it must fall in."""

    what: str  # "input of encoder.embed (Embedding)" / "target of CrossEntropyLoss"
    tensor: torch.Tensor
    limit: int
    limit_text: str  # "num_embeddings=10"
    ignore: int | None = None
    kind: str = "ids"  # ids (indices into an embedding) | target (class indices of a loss)

    def offending(self) -> str | None:
        """`1 of 6 values outside [0, 10): 12 at [0, 2]` or None when all are in range."""
        t = self.tensor
        if t.numel() == 0:
            return None
        bad = (t < 0) | (t >= self.limit)
        if self.ignore is not None:
            bad &= t != self.ignore
        count = int(bad.sum())
        if count == 0:
            return None
        positions = bad.nonzero()[:4].tolist()
        shown = ", ".join(f"{int(t[tuple(p)])} at {p}" for p in positions)
        more = ", ..." if count > len(positions) else ""
        worst = f"; min {int(t.min())}, max {int(t.max())}"
        return f"{count} of {t.numel()} values outside [0, {self.limit}): {shown}{more}{worst}"


def index_range(ctx: ProbeContext) -> ProbeResult:
    poisoned = cuda_poisoned(ctx)
    checks: list[Check] = []
    notes: list[str] = []
    with torch.no_grad():
        try:
            checks = _replayed_checks(ctx, poisoned, notes)
        except Unavailable as exc:
            notes.append(str(exc))
        if not checks:
            checks = _batch_checks(ctx, poisoned)
    if not checks:
        reason = "; ".join(notes) or "no integer tensor and no embedding or class count to check it against"
        return result(NAME, "skipped" if ctx.model is None and ctx.batch is None else "inconclusive", reason)
    findings = [(c, c.offending()) for c in checks]
    bad = [(c, text) for c, text in findings if text]
    facts = {"checked": [f"{c.what}: {describe(c.tensor)} vs {c.limit_text}" for c in checks],
             "offending": {c.what: text for c, text in bad}, **_range_facts(checks, {id(c) for c, _ in bad})}
    if bad:
        parts = [f"{c.what} ({c.limit_text}): {text}" for c, text in bad]
        return result(NAME, "confirmed", "; ".join(parts), **facts)
    ranges = "; ".join(f"{c.what} in [{int(c.tensor.min()) if c.tensor.numel() else 0}, "
                       f"{int(c.tensor.max()) if c.tensor.numel() else 0}] vs {c.limit_text}" for c in checks)
    return result(NAME, "refuted", f"every index is in range: {ranges}", **facts)


def _range_facts(checks: list[Check], bad: set[int]) -> dict:
    """Stable facts for the rules, from the first out-of-range check of each kind (else the first of it):
    `target` (which tensor), `target_min`, `target_max`, `classes`, `ignore_index`; `ids` (which tensor),
    `ids_min`, `ids_max`, `num_embeddings`, `embedding`. A kind with no check gives none of its facts."""
    facts: dict = {"target": None, "target_min": None, "target_max": None, "classes": None, "ignore_index": None,
                   "ids": None, "ids_min": None, "ids_max": None, "num_embeddings": None}
    for kind, limit in (("target", "classes"), ("ids", "num_embeddings")):
        of_kind = [c for c in checks if c.kind == kind]
        chosen = next((c for c in of_kind if id(c) in bad), of_kind[0] if of_kind else None)
        if chosen is None:
            continue
        values = chosen.tensor
        if chosen.ignore is not None and values.numel():
            values = values[values != chosen.ignore]  # the ignored label (-100, 255) is not a class
        empty = values.numel() == 0
        facts.update({kind: chosen.what, f"{kind}_min": None if empty else int(values.min()),
                      f"{kind}_max": None if empty else int(values.max()), limit: chosen.limit})
        if kind == "target":
            facts["ignore_index"] = chosen.ignore
        else:
            facts["embedding"] = chosen.what.removeprefix("input of ")  # the module's name, as rules quote it
    # A fact no check gave is left out, so that a rule's `when` finds it undefined (and false).
    return {name: value for name, value in facts.items() if value is not None}


def _replayed_checks(ctx: ProbeContext, poisoned: bool, notes: list[str]) -> list[Check]:
    if not isinstance(ctx.model, nn.Module):
        return []
    step = rebuild(ctx, poisoned, with_failing=False)
    notes.extend(n for c in (step.model_call, step.loss_call) if c for n in c.inputs.notes)
    checks: list[Check] = []
    names = step.names
    handles = []

    def record(module, args):
        if args and isinstance(args[0], torch.Tensor):
            path = names.get(id(module), "")
            label = f"input of {path} ({type(module).__name__})" if path else f"input of {type(module).__name__}"
            checks.append(Check(label, args[0].detach().clone(), module.num_embeddings,
                                f"num_embeddings={module.num_embeddings}"))

    for module in step.model.module.modules():
        if isinstance(module, _EMBEDDINGS):
            handles.append(module.register_forward_pre_hook(record))
    output = None
    try:
        if step.model_call is not None:
            try:
                output = call(step.model_call)
            except Exception as exc:  # an out-of-range index stops the replay; the hook already saw it
                notes.append(f"the replay stopped at {type(exc).__name__}")
    finally:
        for handle in handles:
            handle.remove()
    if step.loss_call is not None:
        checks.extend(_target_checks(ctx, step.loss_call, output, step.model.module))
    return checks


def _target_checks(ctx: ProbeContext, loss_call, output, model: nn.Module) -> list[Check]:
    loss = loss_call.fn
    name = type(loss).__name__ if isinstance(loss, nn.Module) else getattr(loss, "__name__", "")
    if name not in _CLASS_LOSSES:
        return []
    args = [first_tensor(output) if a is ModelOutput else a for a in loss_call.inputs.args]
    prediction = next((a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
    target = next((a for a in args if isinstance(a, torch.Tensor) and not a.is_floating_point()), None)
    if target is None:
        target = loss_call.inputs.kwargs.get("target")
    if target is None:
        return []
    if prediction is not None and prediction.dim() >= 1:
        classes = prediction.shape[1] if prediction.dim() >= 2 else prediction.shape[0]
        source = f"the loss input's {classes} classes ({list(prediction.shape)})"
    else:
        classifier = _classifier(model)
        if classifier is None:
            return []
        classes, source = classifier.out_features, f"out_features={classifier.out_features}"
    ignore = getattr(loss, "ignore_index", -100)
    return [Check(f"target of {name}", target.detach().clone(), int(classes), source, ignore, kind="target")]


def _classifier(model: nn.Module | None) -> nn.Linear | None:
    last = None
    for module in model.modules() if model is not None else ():
        if isinstance(module, nn.Linear):
            last = module
    return last


def _batch_checks(ctx: ProbeContext, poisoned: bool) -> list[Check]:
    """No replay: the batch's integer tensors against every embedding and the classifier."""
    model = ctx.model if isinstance(ctx.model, nn.Module) else ctx.module if isinstance(ctx.module, nn.Module) else None
    names = module_names(model)
    embeddings = [(names.get(id(m), ""), m) for m in (model.modules() if model is not None else ())
                  if isinstance(m, _EMBEDDINGS)]
    classifier = _classifier(model)
    sources = list(iter_tensors(ctx.batch, "batch")) + list(iter_tensors(tuple(ctx.module_args or ()), "input"))
    checks: list[Check] = []
    seen: set[int] = set()
    for path, tensor in sources:
        if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
            continue
        if not readable(tensor, poisoned) or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        data = tensor.detach().cpu()
        is_target = any(word in path.lower() for word in _TARGET_NAMES) or (
            isinstance(ctx.batch, (list, tuple)) and len(ctx.batch) >= 2 and path == f"batch[{len(ctx.batch) - 1}]")
        if is_target and classifier is not None:
            path_name = names.get(id(classifier))
            owner = f"{path_name} ({type(classifier).__name__})" if path_name else "the classifier"
            checks.append(Check(f"{path} (targets)", data, classifier.out_features,
                                f"out_features={classifier.out_features} of {owner}", kind="target"))
        elif not is_target:
            for epath, embedding in embeddings:
                checks.append(Check(f"{path} for {epath or 'the embedding'}", data, embedding.num_embeddings,
                                    f"num_embeddings={embedding.num_embeddings}"))
    return checks
