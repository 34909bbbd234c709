"""heldout_learnability: do the labels carry information about the inputs? Train on part of the data, test on the rest.

A loss that stays at chance comes either from the training (a step that does
nothing useful) or from the data (labels that do not belong to their inputs:
inputs and labels shuffled apart, labels from another split). A correct loop
tells them apart: from the weights the run ended with, the model is trained with
Adam on three quarters of up to MAX_EXAMPLES examples of the run's Dataset and
tested on the other quarter. If the held-out loss falls, the inputs predict the
labels and the data is not the cause. If the model fits its training part while
the held-out loss stays where it started, it is memorising: the labels are
unrelated to the inputs.

The examples are fed the way the script fed its last batch: the probe requires
the model's recorded call to take one of the batch's tensors as it is and the
loss's call another, and puts the Dataset's collated examples in their places.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ..diagnosis import ProbeResult
from ._support import Unavailable, exception_line, result
from .context import ProbeContext

NAME = "heldout_learnability"
MAX_EXAMPLES = 4096
TRAIN_SHARE = 0.75
MAX_EPOCHS = 40
READ_BUDGET_S = 10.0  # reading the Dataset's examples (a Dataset that decodes images is slow) stops after this
TIME_BUDGET_S = 20.0  # training stops after this, between two batches
LEARNED = 0.9  # a loss at most this share of where it started has fallen
UNMOVED = 0.98  # a held-out loss at least this share of where it started has not


def heldout_learnability(ctx: ProbeContext) -> ProbeResult:
    try:
        feed = _feed(ctx)
    except Unavailable as exc:
        return result(NAME, "skipped", str(exc))
    dataset, model, loss_fn = feed["dataset"], ctx.model, ctx.loss_fn
    size = len(dataset)
    order = torch.randperm(size, generator=torch.Generator().manual_seed(0))[:MAX_EXAMPLES].tolist()
    batch_size = max(1, int(getattr(ctx.loader, "batch_size", None) or 32))
    try:
        examples = _read(dataset, order)
        count = len(examples)
        cut = int(count * TRAIN_SHARE)
        train = _batches(ctx.loader, examples[:cut], batch_size, feed)
        held = _batches(ctx.loader, examples[cut:], batch_size, feed)
    except Exception as exc:
        return result(NAME, "skipped", f"the Dataset's examples could not be collated: {exception_line(exc)}")
    if len(train) < 2 or not held:
        return result(NAME, "skipped", f"{count} of the Dataset's {size} examples were read: too few to split into a "
                      "training and a held-out part")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return result(NAME, "skipped", "no parameter of the model requires grad")
    try:
        train_before, held_before = _loss(model, loss_fn, train, feed), _loss(model, loss_fn, held, feed)
        epochs = _train(model, loss_fn, train, feed, params)
        train_after, held_after = _loss(model, loss_fn, train, feed), _loss(model, loss_fn, held, feed)
    except Exception as exc:
        return result(NAME, "inconclusive", f"training on the Dataset's examples raised {exception_line(exc)}")
    facts: dict[str, Any] = {"examples": count, "train": cut, "held_out": count - cut, "epochs": epochs,
                             "train_loss": [train_before, train_after], "held_out_loss": [held_before, held_after]}
    measured = (f"trained with Adam for {epochs} epochs on {cut} of the Dataset's examples from the weights the run "
                f"ended with, the model's loss on them went {train_before:.4f} → {train_after:.4f}, and on the "
                f"{count - cut} held-out examples {held_before:.4f} → {held_after:.4f}")
    if held_after <= LEARNED * held_before:
        return result(NAME, "refuted", f"{measured}: the inputs do predict the labels, so the data is not why the run "
                      "stays at chance", **facts)
    if train_after <= LEARNED * train_before and held_after >= UNMOVED * held_before:
        return result(NAME, "confirmed", f"{measured}: it memorises its training examples but predicts nothing about "
                      "new ones, so the labels are unrelated to the inputs", **facts)
    return result(NAME, "inconclusive", f"{measured}: the model did not fit its training examples either", **facts)


def _feed(ctx: ProbeContext) -> dict[str, Any]:
    """Where the batch's inputs and labels go in the model's and the loss's calls (by identity), and the Dataset."""
    loader = ctx.loader
    dataset = getattr(loader, "dataset", None) or getattr(loader, "_dataset", None)
    if dataset is None or not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise Unavailable("no DataLoader over a sized Dataset was iterated in this run")
    if not isinstance(ctx.model, torch.nn.Module) or ctx.model_args is None or not callable(ctx.loss_fn):
        raise Unavailable("the model's call and the loss module's call were not both recorded")
    if ctx.loss_args is None or len(ctx.loss_args) != 2:
        raise Unavailable("the loss's recorded call does not take (output, target)")
    batch = ctx.batch
    if not isinstance(batch, (list, tuple)):
        raise Unavailable("the last batch is not a (inputs, labels) sequence")
    positions = {id(value): index for index, value in enumerate(batch) if isinstance(value, torch.Tensor)}
    inputs = [(i, positions[id(a)]) for i, a in enumerate(ctx.model_args) if id(a) in positions]
    target = positions.get(id(ctx.loss_args[1]))
    if len(inputs) != 1 or target is None:
        raise Unavailable("the model and the loss were not called with the batch's own tensors (the loop transforms "
                            "them), so the Dataset's examples cannot be fed the same way")
    return {"dataset": dataset, "arg": inputs[0][0], "input": inputs[0][1], "target": target,
            "args": tuple(ctx.model_args), "kwargs": dict(ctx.model_kwargs or {})}


def _read(dataset: Any, order: list[int]) -> list[Any]:
    """The examples at `order`, as many as READ_BUDGET_S allows."""
    started = time.monotonic()
    examples = []
    for index in order:
        if time.monotonic() - started > READ_BUDGET_S:
            break
        examples.append(dataset[index])
    return examples


def _batches(loader: Any, examples: list[Any], size: int, feed: dict[str, Any]) -> list[tuple]:
    """(inputs, labels) of each batch of `examples`, collated as the run's DataLoader collates."""
    from torch.utils.data import default_collate

    collate = getattr(loader, "collate_fn", None) or default_collate
    out = []
    for start in range(0, len(examples), size):
        batch = collate(examples[start:start + size])
        out.append((batch[feed["input"]], batch[feed["target"]]))
    return out


def _call(model: Any, loss_fn: Any, inputs: torch.Tensor, target: torch.Tensor, feed: dict[str, Any]) -> torch.Tensor:
    """The loss of one collated batch, the model called as the script called it with the batch's inputs in place."""
    args = list(feed["args"])
    args[feed["arg"]] = inputs
    return loss_fn(model(*args, **feed["kwargs"]), target)


def _loss(model: Any, loss_fn: Any, batches: list[tuple], feed: dict[str, Any]) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for inputs, target in batches:
            total += float(_call(model, loss_fn, inputs, target, feed)) * len(target)
            count += len(target)
    return total / max(1, count)


def _train(model: Any, loss_fn: Any, batches: list[tuple], feed: dict[str, Any], params: list) -> int:
    optimizer = torch.optim.Adam(params, lr=1e-3)
    started = time.monotonic()
    epochs = 0
    while epochs < MAX_EPOCHS and time.monotonic() - started < TIME_BUDGET_S:
        for inputs, target in batches:
            if time.monotonic() - started > TIME_BUDGET_S:
                break
            optimizer.zero_grad()
            with torch.enable_grad():
                loss = _call(model, loss_fn, inputs, target, feed)
            loss.backward()
            optimizer.step()
        epochs += 1
    return epochs
