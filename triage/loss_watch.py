"""The loss trend, gradient norms and gradient clipping of a run, kept cheaply per step for the NaN/Inf diagnosis.

A loss that grows by orders of magnitude and overflows, or a NaN born once, usually kills the run later, in an
op that rejects the non-finite value (`binary_cross_entropy`, `Categorical`, `torch.multinomial`, `math.exp`).
By then the evidence of what happened is gone. This module keeps it: the last losses (each `backward()` call
reads a CPU scalar loss by its address, well under a microsecond), the gradient norms the NaN check and the
health checks compute anyway, and whether `clip_grad_norm_` was called (the wrapper counts calls and keeps the
norms it returns). `verdict()` turns them into facts and report lines; the first non-finite loss calls
`on_nonfinite`, which the runner points at its NaN check so that the incident comes before backward runs.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from typing import Any, Callable

KEEP = 64  # latest losses and gradient norms kept
BASELINE = 4  # the first losses, kept apart: the trend is measured against them
DIVERGED_GROWTH = 100.0  # a loss this many times its starting value has diverged (two orders of magnitude)
GRADIENT_LED_GROWTH = 10.0  # the gradient norm grew this much while the loss had not yet grown as much
ARMED_GROWTH = 3.0  # from a loss this many times its starting value on, every backward()'s gradient norm is read...
MAX_ARMED_READS = 64  # ...this many times at most in a run (a loss that simply starts small must not cost every step)
MAX_INITIAL_BYTES = 64 * 2**20  # the first step's weights are kept for models up to this size


class LossTrend:
    """Losses per backward() call, gradient norms and clipping calls, for one run."""

    def __init__(self) -> None:
        self.calls = 0  # backward() calls seen
        self.baseline: list[tuple[int, float]] = []
        self.losses: deque[tuple[int, float]] = deque(maxlen=KEEP)
        self.grad_norms: deque[tuple[int, float]] = deque(maxlen=KEEP)
        self.first_grad_norm: tuple[int, float] | None = None
        self.first_nonfinite: tuple[int, float] | None = None
        self.clip_calls = 0
        self.clip_max_norm: float | None = None
        self.armed_reads = 0
        self.initial: list[tuple[Any, Any]] = []  # (weak reference to a parameter, its value at the first step)
        self.armed_above = math.inf  # |loss| from which gradients are read again: ARMED_GROWTH times the first loss
        self.wants_gradients = False  # whether the hook reads this backward()'s gradient norm
        self.on_nonfinite: Callable[[int, float], None] | None = None
        self._readers: dict[Any, tuple[Any, int]] = {}
        # A GPU run's losses and gradient norms, kept on the device until an incident reads them.
        self.device_losses = DeviceSeries(KEEP)
        self.device_baseline = DeviceSeries(BASELINE)
        self.device_grad_norms = DeviceSeries(KEEP)

    # ------------------------------------------------------------------ per step (kept to a few attribute reads)

    def read_loss(self, tensors: Any) -> None:
        """Called by the backward() hook before backward runs: a CPU scalar loss is read by its address. Sets
        `wants_gradients` for the hook to read after backward: during the first calls (the baseline a divergence is
        measured against) and, MAX_ARMED_READS times at most, once the loss has grown ARMED_GROWTH-fold."""
        loss = tensors[0] if type(tensors) in (tuple, list) else tensors
        reader = self._readers.get(getattr(loss, "dtype", None))
        if reader is None or not loss.is_cpu or loss.numel() != 1:
            self.wants_gradients = False
            if getattr(loss, "is_cuda", False) and loss.numel() == 1 and loss.is_floating_point():
                # Reading a GPU loss would synchronise: it is copied into a buffer on its device, read at an incident.
                calls = self.calls = self.calls + 1
                self.device_losses.record(calls, loss)
                if calls <= BASELINE:
                    self.device_baseline.record(calls, loss)
            return
        calls = self.calls = self.calls + 1
        value = reader[0][loss.data_ptr() >> reader[1]]
        self.losses.append((calls, value))
        if calls <= BASELINE:
            self.baseline.append((calls, value))
            self.wants_gradients = True
        elif not abs(value) < self.armed_above:  # NaN too
            self.wants_gradients = self.armed_reads < MAX_ARMED_READS
            self.armed_reads += 1
        else:
            self.wants_gradients = False
        if calls == 1:
            self.armed_above = ARMED_GROWTH * abs(value) if value - value == 0 else math.inf
        if value - value != 0 and self.first_nonfinite is None:  # inf - inf and nan - nan are nan
            self.first_nonfinite = (calls, value)
            if self.on_nonfinite is not None:
                self.on_nonfinite(calls, value)

    def read_gradients(self, leaves: Any) -> None:
        """After backward: the total norm of the gradients of `leaves` (weak references to parameters)."""
        torch = sys.modules["torch"]
        grads = []
        for ref in leaves:
            param = ref()
            grad = getattr(param, "grad", None)
            if grad is not None and grad.is_floating_point() and grad.device.type == "cpu":
                grads.append(grad)
        if grads:
            with torch.no_grad():
                self.note_grad_norm(float(torch.stack([n.float() for n in torch._foreach_norm(grads)]).norm()))
        if self.calls == 1 and not self.initial:
            self._keep_initial(leaves)

    def _keep_initial(self, leaves: Any) -> None:
        """A copy of the weights after the first backward, before any update: the divergence_rerun experiment
        replays the step from them. Only for models up to MAX_INITIAL_BYTES (the copy is the one memory cost here)."""
        import weakref

        params = [param for param in (ref() for ref in leaves) if param is not None and param.device.type == "cpu"]
        if sum(p.numel() * p.element_size() for p in params) <= MAX_INITIAL_BYTES:
            self.initial = [(weakref.ref(p), p.detach().clone()) for p in params]

    def note_grad_norm(self, norm: float) -> None:
        """A total gradient norm computed by a check that runs anyway (the NaN check, the health sampler)."""
        self.note_grad_norm_at(self.calls, norm)

    def note_grad_norm_at(self, calls: int, norm: float) -> None:
        point = (calls, norm)
        if self.first_grad_norm is None:
            self.first_grad_norm = point
        if not self.grad_norms or self.grad_norms[-1][0] != calls:
            self.grad_norms.append(point)

    def note_device_grad_norm(self, norm: Any) -> None:
        """A GPU total gradient norm the NaN check computed anyway, kept on its device (no synchronisation)."""
        self.device_grad_norms.record(self.calls, norm)

    # ------------------------------------------------------------------ after the fact

    def read_device_values(self) -> None:
        """Bring a GPU run's losses and gradient norms to the host (one synchronisation, at an incident), in call
        order, as a CPU run reads them step by step. After a CUDA error the device cannot be read: they stay unknown."""
        losses = self.device_baseline.read() + self.device_losses.read()
        norms = self.device_grad_norms.read()
        known = {call for call, _ in self.baseline}
        self.baseline.extend(point for point in losses if point[0] <= BASELINE and point[0] not in known)
        known = {call for call, _ in self.losses}  # by call: a NaN equals no other, not even itself
        self.losses.extend(point for point in _unique(losses) if point[0] not in known)
        for call, value in _unique(losses):
            if value - value != 0 and (self.first_nonfinite is None or call < self.first_nonfinite[0]):
                self.first_nonfinite = (call, value)
                break
        for point in _unique(norms):
            self.note_grad_norm_at(*point)

    def verdict(self, optimizer: Any = None, model: Any = None, main_globals: dict[str, Any] | None = None) -> dict[str, Any]:
        """What the losses and gradient norms say, as plain facts (empty when too few losses were seen)."""
        points = _unique(self.baseline + list(self.losses))
        finite = [(call, value) for call, value in points if math.isfinite(value)]
        if not finite:
            return {}
        start = finite[0][1]
        until = self.first_nonfinite[0] if self.first_nonfinite else None
        before = [(call, value) for call, value in finite if until is None or call < until]
        peak_call, peak = max(before or finite, key=lambda point: abs(point[1]))
        growth = abs(peak) / abs(start) if start else math.inf
        facts: dict[str, Any] = {
            "backward_calls": self.calls, "first_loss": start, "peak_loss": peak, "peak_at": peak_call,
            "growth": growth, "losses": [value if math.isfinite(value) else _number(value) for _, value in points[-12:]],
            "nonfinite_at": until, "nonfinite_loss": _number(self.first_nonfinite[1]) if self.first_nonfinite else None,
            "clip_calls": self.clip_calls, "clip_max_norm": self.clip_max_norm,
        }
        facts["diverged"] = bool(growth >= DIVERGED_GROWTH or (until is not None and len(before) >= 2 and
                                                              growth >= DIVERGED_GROWTH ** 0.5))
        norms = _unique(([self.first_grad_norm] if self.first_grad_norm else []) + list(self.grad_norms))
        finite_norms = [(call, norm) for call, norm in norms if math.isfinite(norm)]
        if finite_norms:
            first_norm = finite_norms[0][1]
            peak_norm_call, peak_norm = max(finite_norms, key=lambda point: point[1])
            facts.update(first_grad_norm=first_norm, peak_grad_norm=peak_norm,
                         grad_norm_growth=peak_norm / first_norm if first_norm else math.inf,
                         nonfinite_grad_norm=any(not math.isfinite(norm) for _, norm in norms))
            facts["gradient_led"] = _gradient_led(finite, finite_norms)
        learning_rate = _learning_rate(optimizer, main_globals)
        if learning_rate is not None:
            facts["lr"], facts["lr_source"] = learning_rate
        if optimizer is not None:
            facts["optimizer"] = type(optimizer).__name__
        recurrent = _recurrent_modules(model)
        if recurrent:
            facts["recurrent"] = recurrent
        return facts

    def lines(self, facts: dict[str, Any]) -> list[str]:
        """The report lines a rule matches (`triage: the loss ...`)."""
        if not facts:
            return []
        out = []
        if facts["diverged"]:
            end = (f", then became {facts['nonfinite_loss']} at call {facts['nonfinite_at']}"
                   if facts["nonfinite_at"] is not None else "")
            out.append(f"triage: the loss diverged: it grew from {_fmt(facts['first_loss'])} to "
                       f"{_fmt(facts['peak_loss'])} (x{_fmt(facts['growth'])}) over {facts['peak_at']} backward() "
                       f"calls{end}")
        elif facts["nonfinite_at"] is not None:
            out.append(f"triage: the loss was {facts['nonfinite_loss']} at backward() call {facts['nonfinite_at']} "
                       f"without growing first (from {_fmt(facts['first_loss'])}, at most {_fmt(facts['peak_loss'])})")
        else:
            return []
        if "first_grad_norm" in facts:
            grew = f" (x{_fmt(facts['grad_norm_growth'])})" if facts["grad_norm_growth"] > 1 else ""
            lead = ", growing before the loss did" if facts.get("gradient_led") else ""
            out.append(f"triage: gradient norm from {_fmt(facts['first_grad_norm'])} to "
                       f"{_fmt(facts['peak_grad_norm'])}{grew}{lead}"
                       + ("; then non-finite" if facts["nonfinite_grad_norm"] else ""))
        clipping = (f"clip_grad_norm_ called {facts['clip_calls']} times (max_norm={facts['clip_max_norm']})"
                    if facts["clip_calls"] else "clip_grad_norm_ was never called")
        rate = f"; learning rate lr={_fmt(facts['lr'])} ({facts['lr_source']})" if "lr" in facts else ""
        out.append(f"triage: {clipping}{rate}")
        return out


class DeviceSeries:
    """The latest `keep` scalars of a GPU run, each with its backward() call, kept on their device.

    Recording is one copy kernel into a slot of a small device buffer (no synchronisation); `read()` brings
    them to the host once, when an incident needs them.
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.values: Any = None  # float64 on the device of the first value recorded
        self.slots: list[Any] = []  # a view of each element of `values`, made once
        self.calls: list[int | None] = [None] * keep
        self.next = 0

    def record(self, call: int, value: Any) -> None:
        if self.values is None or self.values.device != value.device:
            torch = sys.modules["torch"]
            self.values = torch.empty(self.keep, dtype=torch.float64, device=value.device)
            self.slots = list(self.values.unbind())
            self.calls = [None] * self.keep
        self.slots[self.next].copy_(value.detach().reshape(()))
        self.calls[self.next] = call
        self.next = (self.next + 1) % self.keep

    def read(self) -> list[tuple[int, float]]:
        """(call, value) pairs, oldest first; empty when nothing was recorded or the device cannot be read."""
        if self.values is None:
            return []
        try:
            host = self.values.cpu().tolist()
        except RuntimeError:  # a CUDA error (a device-side assert) leaves the device unreadable
            return []
        return sorted((call, value) for call, value in zip(self.calls, host) if call is not None)


def _unique(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    seen: dict[int, float] = {}
    for call, value in points:
        seen.setdefault(call, value)
    return sorted(seen.items())


def _gradient_led(losses: list[tuple[int, float]], norms: list[tuple[int, float]]) -> bool:
    """Whether the gradient norm grew GRADIENT_LED_GROWTH-fold at a call where the loss had grown less than that:
    exploding gradients drive the loss up, while a learning rate too high moves both at once."""
    first_norm, first_loss = norms[0][1], abs(losses[0][1])
    if not first_norm or not first_loss:
        return False
    loss_at = dict(losses)
    for call, norm in norms[1:]:
        if norm / first_norm >= GRADIENT_LED_GROWTH:
            loss = loss_at.get(call)
            return loss is not None and abs(loss) / first_loss < GRADIENT_LED_GROWTH
    return False


def _learning_rate(optimizer: Any, main_globals: dict[str, Any] | None) -> tuple[float, str] | None:
    """The optimizer's learning rate; for a loop that updates the weights itself, the script's `lr` global."""
    try:
        if optimizer is not None:
            rate = optimizer.param_groups[0]["lr"]
            return float(rate), f"{type(optimizer).__name__}"
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        pass
    for name in ("lr", "learning_rate"):
        value = (main_globals or {}).get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value), f"the script's `{name}`, used by a hand-written update"
    return None


def _recurrent_modules(model: Any) -> list[str]:
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(model, torch.nn.Module):
        return []
    found = []
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.RNNBase, torch.nn.RNNCellBase)):
            found.append(f"{name} ({type(module).__name__})" if name else type(module).__name__)
    return found[:4]


def _number(value: float) -> str:
    return "nan" if value != value else ("inf" if value > 0 else "-inf")


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return _number(value)
    if value and (abs(value) >= 1e5 or abs(value) < 1e-3):
        return f"{value:.2g}"
    return f"{value:.4g}"


# ---------------------------------------------------------------------------- the run's one trend


TREND: LossTrend | None = None
ORIGIN: dict[str, Any] | None = None  # where the NaN check found NaN/Inf born, for a crash that follows it


def start() -> Callable[[], None]:
    """Keep a LossTrend for this process and count `clip_grad_norm_` calls; returns the function that undoes it."""
    global TREND
    import torch
    from torch.nn.utils import clip_grad as clip_module

    from .host_memory import READERS

    trend = TREND = LossTrend()
    trend._readers = {getattr(torch, name.split(".")[1]): reader for name, reader in READERS.items()}
    original = clip_module.clip_grad_norm_

    def clip_grad_norm_(parameters, max_norm, *args, **kwargs):
        total = original(parameters, max_norm, *args, **kwargs)
        trend.clip_calls += 1
        trend.clip_max_norm = float(max_norm)
        if isinstance(total, torch.Tensor) and total.numel() == 1 and total.device.type == "cpu":
            trend.note_grad_norm(float(total))  # the norm before clipping: what the gradients really were
        return total

    clip_grad_norm_.__wrapped__ = original  # type: ignore[attr-defined]
    clip_grad_norm_.__doc__ = original.__doc__
    clip_grad_norm_._triage_hook = True  # type: ignore[attr-defined]
    patched = [(module, "clip_grad_norm_") for module in (clip_module, torch.nn.utils)
               if getattr(module, "clip_grad_norm_", None) is original]
    for module, attribute in patched:
        setattr(module, attribute, clip_grad_norm_)

    def undo() -> None:
        global TREND
        for module, attribute in patched:
            if getattr(module, attribute, None) is clip_grad_norm_:
                setattr(module, attribute, original)
        if TREND is trend:
            TREND = None

    return undo


def evidence(optimizer: Any = None, model: Any = None) -> tuple[dict[str, Any], list[str]]:
    """The run's trend as (facts, report lines); empty when no trend is kept or it says nothing."""
    if TREND is None:
        return {}, []
    TREND.read_device_values()
    main = sys.modules.get("__main__")
    facts = TREND.verdict(optimizer, model, getattr(main, "__dict__", None))
    lines = TREND.lines(facts)
    return (facts, lines) if lines else ({}, [])
