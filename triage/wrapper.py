"""The training-loop wrapper: `install()`, `watch(...)`, `track(loader)`, and NaN/Inf as incidents.

`install()` chains triage after the previous sys.excepthook and
threading.excepthook (and IPython's handler in a notebook): the traceback
prints as before, then the diagnosis. `watch()` and `track()` tell triage the
model, optimizer, loss function, step and batch by reference, at the cost of a
few hooks, and check the loss (and, at a stride kept under a fixed share of the
step time, the gradients) for NaN/Inf. On a GPU the check is a device-side flag
copied to pinned memory and read when its CUDA event has completed, so there is
no host-device synchronisation per step. `auto_track()` gives the runner the
same context for an unmodified script by hooking DataLoader iteration and
optimizer steps.
"""

from __future__ import annotations

import math
from math import isfinite
import os
import sys
import threading
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from . import tracking
from .host_memory import READERS
from .tracking import TRACKER, Tracker

ON_NAN = ("report", "raise", "ignore")
# Share of the measured step time the full gradient check may take; its stride adapts to keep under it. The
# check is the backstop for a NaN/Inf the per-step peek misses (it runs every ~180 steps on a 1 ms MLP step,
# where one check costs ~0.1 ms): a NaN found by it is dated to within a stride.
GRADIENT_CHECK_BUDGET = 0.0005
# Where a NaN/Inf incident goes: None means diagnose_live() here; the runner may set its own (incident, tracker).
incident_handler: Callable[[Any, Tracker], None] | None = None


class NonFiniteError(FloatingPointError):
    """Raised from the loss or optimizer hook by `watch(on_nan="raise")` when the loss or gradients are NaN/Inf."""


# ---------------------------------------------------------------------------- reporting


class _Settings:
    report_dir: Path | None = None
    probes: bool = True
    rules: tuple[Path, ...] = ()
    stream: Any = None  # where the summary goes; sys.stderr when None


_settings = _Settings()


def _report_folder() -> Path:
    """This incident's own folder: the one install() named (then DIR-2, ... for later incidents), or a new one."""
    from .report_dir import DEFAULT_ROOT, claim_folder

    script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "python"
    return claim_folder(explicit=str(_settings.report_dir) if _settings.report_dir is not None else None,
                        root=DEFAULT_ROOT, label=script or "python", run_id=str(os.getpid()))


def diagnose_live(incident: Any, exception: BaseException | None, tracker: Tracker = TRACKER) -> Any:
    """Match, probe and report a live incident through the one pipeline; returns the Report (also written and printed)."""
    from .capture.environment import environment, launcher_rank
    from .kb import load_knowledge_base
    from .pipeline import LiveContext, print_summary, rule_warnings, triage_incident
    from .report_dir import ReportWriter

    incident.environment = incident.environment or environment()
    incident.rank = incident.rank if incident.rank is not None else launcher_rank()
    kb = load_knowledge_base(list(_settings.rules))
    warnings = rule_warnings(kb)
    try:
        folder: Path | None = _report_folder()
    except OSError as exc:  # the diagnosis still prints
        folder = None
        warnings.append(f"could not create a report folder: {exc}")
    live = LiveContext(exception=exception, tracker=tracker) if _settings.probes else None
    report = triage_incident(incident, kb, source="run", live=live, writer=ReportWriter(folder) if folder else None,
                             rerun=lambda: _rerun_commands(folder), warnings=warnings)
    print_summary(report, _settings.stream or sys.stderr, folder=folder)
    return report


def _rerun_commands(report_dir: Path | None) -> dict[str, str | None] | None:
    """How to re-run this script under triage; None in a notebook or `python -c`, which have no script to name."""
    from .replay import rerun_commands

    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and getattr(spec, "name", None) not in (None, "__main__"):
        return rerun_commands(spec.name, sys.argv[1:], module=True, report_dir=report_dir)
    if getattr(main, "__file__", None) is None:
        return None
    return rerun_commands(sys.argv[0], sys.argv[1:], report_dir=report_dir)


def incident_from_exception(exc: BaseException) -> Any:
    """An Incident for a live exception: its printed traceback, read like a pasted one (workers unwrapped)."""
    from .capture.secrets import scrub_text
    from .logparse import parse_text

    incident = parse_text(scrub_text("".join(traceback.format_exception(type(exc), exc, exc.__traceback__))))
    incident.source = "run"
    return incident


def _report_exception(exc: BaseException) -> None:
    """The crash path: never raises, never changes the exception; one line if triage itself fails."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit, NonFiniteError)):
        return  # a NonFiniteError is raised after its NaN incident was reported
    try:
        diagnose_live(incident_from_exception(exc), exc)
    except Exception as failure:
        if os.environ.get("TRIAGE_DEBUG"):
            raise
        print(f"triage: could not diagnose this failure: {type(failure).__name__}: {failure} "
              "(set TRIAGE_DEBUG=1 for details)", file=sys.stderr)


# ---------------------------------------------------------------------------- install / uninstall


class _Installed:
    def __init__(self) -> None:
        self.previous_excepthook = sys.excepthook
        self.previous_threading_hook = threading.excepthook
        self.active = True
        self.ipython = None


_installed: _Installed | None = None


def install(report_dir: str | Path | None = None, probes: bool = True, rules: Iterable[str | Path] = (),
            stream: Any = None) -> None:
    """Diagnose uncaught exceptions (main thread, other threads, IPython cells) after their traceback prints."""
    global _installed
    _settings.report_dir = Path(report_dir) if report_dir is not None else None
    _settings.probes = probes
    _settings.rules = tuple(Path(r) for r in rules)
    _settings.stream = stream
    if (_installed is not None and _installed.active) or tracking.capture_owner == "runner":
        return  # under `python -m triage` the runner already diagnoses every uncaught exception
    state = _Installed()

    def excepthook(exc_type, exc, tb):
        state.previous_excepthook(exc_type, exc, tb)
        if state.active and exc is not None:
            _report_exception(exc)

    def threading_hook(args):
        state.previous_threading_hook(args)
        if state.active and args.exc_value is not None:
            _report_exception(args.exc_value)

    excepthook._triage_hook = True  # type: ignore[attr-defined]
    threading_hook._triage_hook = True  # type: ignore[attr-defined]
    sys.excepthook = excepthook
    threading.excepthook = threading_hook
    state.ipython = _install_ipython(state)
    state.excepthook, state.threading_hook = excepthook, threading_hook  # type: ignore[attr-defined]
    _installed = state
    tracking.capture_owner = tracking.capture_owner or "install"


def _install_ipython(state: _Installed) -> Any:
    ipython_module = sys.modules.get("IPython")
    shell = ipython_module.get_ipython() if ipython_module is not None else None
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return None

    def handler(shell, etype, evalue, tb, tb_offset=None):
        shell.showtraceback((etype, evalue, tb), tb_offset=tb_offset)
        if state.active:
            _report_exception(evalue)

    shell.set_custom_exc((Exception,), handler)
    return shell


def uninstall() -> None:
    """Put back the hooks install() replaced; a hook chained after ours keeps working and triage stays quiet."""
    global _installed
    state = _installed
    if state is None:
        return
    state.active = False
    if sys.excepthook is getattr(state, "excepthook", None):
        sys.excepthook = state.previous_excepthook
    if threading.excepthook is getattr(state, "threading_hook", None):
        threading.excepthook = state.previous_threading_hook
    if state.ipython is not None:
        state.ipython.set_custom_exc((), None)
    _installed = None
    if tracking.capture_owner == "install":
        tracking.capture_owner = None


def installed() -> bool:
    return _installed is not None and _installed.active


# ---------------------------------------------------------------------------- NaN/Inf checks


class DeviceFlags:
    """Finiteness flags computed on a GPU, read back once their CUDA event has completed (no synchronisation).

    Each flag (True: finite) is copied without blocking into a slot of a small pinned buffer, with the slot's own
    event recorded after it (buffer views and events are made once); a slot is read only after its event reports
    completion. If the GPU falls a whole buffer behind, the oldest flag is waited for (the only wait there is).
    """

    SLOTS = 64

    def __init__(self, event_factory: Callable[[], Any] | None = None) -> None:
        self.items: deque = deque()
        self.found: list[dict[str, Any]] = []
        self.host = None
        self.slots: list[Any] = []  # a view of each element of `host`
        self.events: list[Any] = []
        self.slot = 0
        self.event_factory = event_factory

    @property
    def pending(self) -> bool:
        return bool(self.items or self.found)

    def push(self, finite: Any, info: dict[str, Any]) -> None:
        if self.host is None:
            torch = sys.modules["torch"]
            self.host = torch.ones(self.SLOTS, dtype=torch.bool, pin_memory=torch.cuda.is_available())
            self.slots = list(self.host.unbind())
            make = self.event_factory or torch.cuda.Event
            self.events = [make() for _ in range(self.SLOTS)]
        if len(self.items) >= self.SLOTS - 1:
            self.items[0][0].synchronize()
            self._collect()
        slot = self.slot
        self.slot = (slot + 1) % self.SLOTS
        self.slots[slot].copy_(finite, non_blocking=True)
        event = self.events[slot]
        event.record()
        self.items.append((event, slot, info))

    def _collect(self) -> None:
        while self.items and self.items[0][0].query():
            _, slot, info = self.items.popleft()
            if not bool(self.host[slot]):
                self.found.append(info)

    def ready(self) -> list[dict[str, Any]]:
        """Infos of completed checks that found NaN/Inf, oldest first."""
        self._collect()
        found, self.found = self.found, []
        return found


def sentinel_for(params: list[Any]) -> list[tuple[Any, Any, int]]:
    """The parameters whose gradients are peeked at every step (the last and the first), each with the view
    of memory that reads the first value of its CPU gradient and the shift from an address to an index
    (None: read through torch)."""
    chosen = [params[-1], params[0]] if len(params) > 1 else list(params)
    out = []
    for param in chosen:
        view, shift = READERS.get(str(param.dtype), (None, 0))
        if param.is_cuda or param.is_meta or param.numel() == 0:
            view = None
        out.append((param, view, shift))
    return out


def _mark_triage_hook(fn: Callable) -> Callable:
    fn._triage_hook = True  # type: ignore[attr-defined]
    return fn


class NonFiniteMonitor:
    """Checks the loss, the model's output and the gradients for NaN/Inf; the first one found is an incident."""

    def __init__(self, tracker: Tracker, on_nan: str = "report", model: Any = None) -> None:
        if on_nan not in ON_NAN:
            raise ValueError(f"on_nan must be one of {ON_NAN}, not {on_nan!r}")
        self.tracker = tracker
        self.on_nan = on_nan
        self.model = model
        self.fired = on_nan == "ignore"  # a monitor told to ignore never checks
        self.flags = DeviceFlags()
        self.stride = 1
        self.since = 0
        self.last_full_at: float | None = None
        self.step_interval: float | None = None

    # -- per-step checks (kept to a few microseconds on the CPU)

    def check(self, tensor: Any, what: str) -> None:
        if self.fired or self.on_nan == "ignore":
            return
        import torch

        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() or tensor.numel() == 0:
            return
        if tensor.device.type == "cpu":
            value = tensor.detach()
            number = value.item() if value.numel() == 1 else value.sum(dtype=torch.float32).item()
            if not math.isfinite(number):
                if value.numel() > 1 and bool(torch.isfinite(value).all()):
                    return  # a finite tensor whose sum overflowed
                self.fire(what, f"{what} = {self._describe(value)}" if value.numel() == 1 else self._describe(value))
        elif tensor.device.type == "cuda":
            self.flags.push(torch.isfinite(tensor.detach()).all(), self._snapshot(what))
            self.poll()

    def step_hook(self, params: list[Any], tracker: Tracker) -> Callable[[Any, Any, Any], None]:
        """The optimizer pre-step hook for `params`: checks the gradients, then counts the step.

        Every step it reads the first value of the last and of the first parameter's gradient; all
        gradients are checked at a stride chosen so that those full checks take GRADIENT_CHECK_BUDGET of
        the step time. A NaN/Inf in the forward pass makes the loss non-finite, and with it the gradient
        of the parameters nearest the loss (usually the last registered: the output layer; ReLU-like
        masks can zero the others exactly). A NaN born in backward reaches the parameters upstream of it,
        the first one's included, though maybe not the value read here: the strided check finds those. On a
        GPU only the last parameter is peeked at (a flag read back later): each peek there costs kernels.
        Right after backward() each Python-level call costs microseconds (cold caches), so the hook is
        one frame, its lookups bound in advance and a CPU float32/64 value read by its address.
        """
        monitor, check_all, peek, flags = self, self._check_all, self._peek, self.flags
        sentinel = sentinel_for(params) or [(None, None, 0)]
        (last, last_view, last_shift), (first, first_view, first_shift) = sentinel[0], sentinel[-1]

        def before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
            if not monitor.fired:
                monitor.since += 1
                if monitor.since >= monitor.stride:
                    check_all(params, adapt=True)
                elif last is not None:
                    grad = last.grad
                    if grad is not None and not (
                        isfinite(last_view[grad.data_ptr() >> last_shift])
                        if last_view is not None and grad.is_cpu else peek(grad)
                    ):
                        check_all(params, adapt=False)
                    else:
                        grad = first.grad
                        # (on a GPU a peek is kernels and a copy: there the last one's flag and the strided check do)
                        if grad is not None and grad.is_cpu and not (
                            isfinite(first_view[grad.data_ptr() >> first_shift])
                            if first_view is not None else peek(grad)
                        ):
                            check_all(params, adapt=False)
                if flags.items or flags.found:  # DeviceFlags.pending, without a property's frame
                    monitor.poll()
            # Tracker.on_step inline: one Python frame less per step, where each costs microseconds.
            if not tracker.suspended:
                tracker.steps += 1
                if tracker.optimizer is None:
                    tracker.optimizer = optimizer
                for listener in tracker.listeners:
                    listener("step", tracker.steps)

        return before_step

    def _peek(self, grad: Any) -> bool:
        """False when the first value of a gradient is NaN/Inf; on a GPU it is flagged and read later."""
        if grad.is_cuda:
            torch = sys.modules["torch"]
            self.flags.push(torch.isfinite(grad.reshape(-1)[0]), self._snapshot("gradients"))
            return True
        if not grad.is_cpu or not grad.is_floating_point() or not grad.numel():
            return True  # a device triage cannot read without a copy (mps, xpu, meta): the strided check's
        return math.isfinite(float(grad.reshape(-1)[0]))

    def _check_all(self, params: list[Any], adapt: bool) -> None:
        torch = sys.modules["torch"]
        started = time.perf_counter()
        if adapt:
            if self.last_full_at is not None and self.since:
                self.step_interval = (started - self.last_full_at) / self.since
            self.last_full_at, self.since = started, 0
        by_device: dict[Any, list] = {}
        for param in params:
            grad = param.grad
            if grad is not None and grad.is_floating_point():
                by_device.setdefault(grad.device, []).append(grad)
        for device, group in by_device.items():
            total = torch.stack(torch._foreach_norm(group)).sum()
            if device.type == "cpu":
                norm = total.item()
                _note_grad_norm(norm)
                if not math.isfinite(norm):
                    bad = self._bad_gradients(params)  # exact: a norm of large finite values can overflow
                    if bad:
                        self.fire("gradients", self._gradient_summary(bad, params), gradients=bad)
                        return
            elif device.type == "cuda":
                _note_device_grad_norm(total)
                self.flags.push(torch.isfinite(total), self._snapshot("gradients"))
        cost = time.perf_counter() - started
        if adapt and self.step_interval:
            self.stride = min(max(1, math.ceil(cost / (GRADIENT_CHECK_BUDGET * self.step_interval))), 1000)

    @staticmethod
    def _gradient_summary(bad: list[str], params: list[Any]) -> str:
        total = sum(1 for p in params if p.grad is not None)
        if len(bad) == total:
            return f"all {total} gradients (a non-finite loss does this)"
        return f"{len(bad)} of {total} gradients: {', '.join(bad[:5])}" + (", ..." if len(bad) > 5 else "")

    def poll(self) -> None:
        if self.flags.pending:
            for info in self.flags.ready():
                value, bad = "NaN/Inf (found by an asynchronous check)", None
                if info["what"] == "gradients":
                    bad, value = self._gradients_now(value)
                self.fire(info["what"], value, gradients=bad, snapshot=info)
                break

    def _gradients_now(self, value: str) -> tuple[list[str] | None, str]:
        """Which gradients are non-finite when a GPU flag is read (a few steps after it was set; reading them
        synchronises once, at the incident), and the summary the CPU check would give."""
        model = self._model()
        if model is None:
            return None, value
        try:
            params = list(model.parameters())
            bad = self._bad_gradients(params)
        except RuntimeError:  # the device cannot be read after a CUDA error
            return None, value
        return (bad, f"{self._gradient_summary(bad, params)}, found by an asynchronous check") if bad else (None, value)

    # -- the incident

    def _snapshot(self, what: str) -> dict[str, Any]:
        t = self.tracker
        return {"what": what, "step": t.steps, "batch_index": t.batch_index, "model_call": t.model_call}

    def _describe(self, tensor: Any) -> str:
        import torch

        if tensor.numel() == 1:
            return str(tensor.item())
        nan = int(torch.isnan(tensor).sum())
        inf = int(torch.isinf(tensor).sum())
        return f"{nan} NaN and {inf} Inf of {tensor.numel()} values"

    def _bad_gradients(self, params: list[Any]) -> list[str]:
        import torch

        model = self._model()
        names = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
        bad = []
        with torch.no_grad():
            for index, param in enumerate(params):
                grad = param.grad
                if grad is not None and grad.is_floating_point() and not bool(torch.isfinite(grad).all()):
                    bad.append(names.get(id(param), f"parameter {index}"))
        return bad

    def _model(self) -> Any:
        """The watched model, or (for auto_track) the module owning the optimizer's parameters, found once."""
        model = self.model or self.tracker.model
        if model is None and self.tracker.optimizer is not None:
            from .probes.runner import _model_from_optimizer

            model = self.model = _model_from_optimizer(self.tracker.optimizer)
        return model

    def fire(self, what: str, value: str, gradients: list[str] | None = None,
             snapshot: dict[str, Any] | None = None) -> None:
        if self.fired:
            return
        self.fired = True
        if self.on_nan == "ignore":
            return
        step = snapshot["step"] if snapshot else self.tracker.steps
        batch_index = snapshot["batch_index"] if snapshot else self.tracker.batch_index
        message = f"non-finite {what} at step {step}" + (f" (batch {batch_index})" if batch_index is not None else "")
        try:
            incident = self._incident(what, value, step, batch_index, gradients or [], snapshot)
            if incident_handler is not None:
                incident_handler(incident, self.tracker)
            else:
                diagnose_live(incident, None, self.tracker)
        except Exception as failure:
            if os.environ.get("TRIAGE_DEBUG"):
                raise
            print(f"triage: {message}; could not diagnose it: {type(failure).__name__}: {failure}", file=sys.stderr)
        if self.on_nan == "raise":
            raise NonFiniteError(f"{message}: {value}")

    def _incident(self, what: str, value: str, step: int, batch_index: int | None, gradients: list[str],
                  snapshot: dict[str, Any] | None) -> Any:
        from .incident import Incident
        from .probes.context import ProbeContext
        from .probes.nonfinite import trace_forward

        t = self.tracker
        model = self._model()
        call = (snapshot or {}).get("model_call") or t.model_call
        ctx = ProbeContext(incident=Incident(kind="nan", source="run"), model=model, batch=t.batch,
                           model_args=call[0] if call else None, model_kwargs=dict(call[1]) if call else {},
                           loss_fn=t.loss_fn, loss_args=t.loss_call[0] if t.loss_call else None,
                           loss_kwargs=dict(t.loss_call[1]) if t.loss_call else {})
        trace = trace_forward(ctx)
        at = f"at step {step}" + (f" (batch {batch_index})" if batch_index is not None else "")
        lines = [f"triage: non-finite {what} {at}: {value}"]
        if trace.parameters:
            lines.append(f"triage: parameters already non-finite {at}: {', '.join(trace.parameters[:10])}")
        if trace.loss is not None and what != "loss":
            lines.append(f"triage: step {step} replayed on CPU copies gives loss = {trace.loss}")
        if trace.op:
            lines.append(f"triage: first non-finite value {at}: {trace.op}")
        if trace.module:
            lines.append(f"triage: first module with a non-finite output {at}: {trace.module} ({trace.kind})")
        if snapshot is not None:
            lines.append(f"triage: found by an asynchronous check, {t.steps - step} step(s) later")
        facts = {"nan": {"what": what, "value": value, "step": step, "batch_index": batch_index,
                         "nonfinite_gradients": gradients,
                         "nonfinite_parameters": trace.parameters, "first_nonfinite_module": trace.module,
                         "first_nonfinite_op": trace.op, "replayed_loss": trace.loss}}
        if snapshot is None and not trace.parameters:
            _add_origin(ctx, at, lines, facts)
        _add_trend(t, model, lines, facts)
        return Incident(kind="nan", source="run", log_lines=lines, facts=facts)


def _note_grad_norm(norm: float) -> None:
    """Hand a gradient norm the NaN check computed anyway to the run's loss trend (loss_watch.py)."""
    from . import loss_watch

    if loss_watch.TREND is not None:
        loss_watch.TREND.note_grad_norm(norm)


def _note_device_grad_norm(norm: Any) -> None:
    """The same for a GPU norm, kept on its device until an incident reads it."""
    from . import loss_watch

    if loss_watch.TREND is not None:
        loss_watch.TREND.note_device_grad_norm(norm)


def _add_origin(ctx: Any, at: str, lines: list[str], facts: dict[str, Any]) -> None:
    """Replay the user's statements that led here (the hook's caller, live on the stack) to find where NaN/Inf was
    born; kept in loss_watch for a crash that follows (its frames will be others)."""
    from . import loss_watch
    from .probes.nonfinite import find_origin
    from .probes.source_step import user_frames

    origin, replayed = find_origin(user_frames(None), include_failing=False, ctx=ctx)
    if origin is None:
        return
    facts["nan_origin"] = loss_watch.ORIGIN = {**origin.facts(), "found_at": at, "replayed": replayed,
                                               "line": origin.line()}
    lines.append(f"triage: NaN/Inf origin {at}: {origin.line()}")


def _add_trend(tracker: Tracker, model: Any, lines: list[str], facts: dict[str, Any]) -> None:
    """The loss trend and gradient clipping up to now (loss_watch.py), as facts and lines the rules match."""
    from . import loss_watch

    trend, trend_lines = loss_watch.evidence(tracker.optimizer, model)
    if trend:
        facts["loss_trend"] = trend
        lines.extend(trend_lines)


# ---------------------------------------------------------------------------- watch / track


class watch:
    """`with triage.watch(model=..., optimizer=..., loss_fn=...):` gives triage the live training objects.

    An optimizer hook counts steps and checks gradients for NaN/Inf before each
    step (a NaN/Inf loss makes every gradient non-finite); nothing is added to the
    model's own calls, which keeps the cost within 1% of a small CPU step. With
    `record_calls=True` (or without an optimizer) module hooks also record the
    arguments of the model's and the loss's latest calls and check the loss value
    itself, at a few microseconds per call. `on_nan`: "report" prints a diagnosis
    once and lets training go on, "raise" also raises NonFiniteError, "ignore" turns
    the checks off. Unless the runner or install() already captures failures,
    install() is active for the duration. After an exception the Tracker keeps its
    references for the crash path.
    """

    def __init__(self, model: Any = None, optimizer: Any = None, loss_fn: Any = None, on_nan: str = "report",
                 record_calls: bool = False, tracker: Tracker | None = None, health: bool = False) -> None:
        self.tracker = tracker or TRACKER
        # health=True: the training-health checks (triage/health.py) watch this block and report when it ends.
        self.health = health
        self._health_undo: Callable[[], None] | None = None
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.record_calls = record_calls or optimizer is None
        self.monitor = NonFiniteMonitor(self.tracker, on_nan, model)
        self._handles: list[Any] = []
        self._saved: dict[str, Any] = {}
        self._installed_here = False

    def __enter__(self) -> watch:
        t = self.tracker
        keys = ("model", "optimizer", "loss_fn", "model_call", "loss_call")
        self._saved = {k: getattr(t, k) for k in keys}
        t.model = self.model if self.model is not None else t.model
        t.optimizer = self.optimizer if self.optimizer is not None else t.optimizer
        t.loss_fn = self.loss_fn if self.loss_fn is not None else t.loss_fn
        t.watch_active = True
        self._hook()
        self._start_health()
        if tracking.capture_owner is None and not installed():
            install()
            self._installed_here = True
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.tracker.watch_active = False
        self._finish_health(judge=exc is None)
        if exc is None:
            for key, value in self._saved.items():
                setattr(self.tracker, key, value)
            if self._installed_here:
                uninstall()
        return False

    def _start_health(self) -> None:
        from . import health

        if self.health and health.MONITOR is None:  # under the runner its own monitor already watches
            self._health_undo = health.start(self.tracker).undo  # type: ignore[attr-defined]

    def _finish_health(self, judge: bool) -> None:
        """Judge the block that just ended (unless it raised) and report its findings as a `silent` incident."""
        if self._health_undo is None:
            return
        from . import health

        monitor, self._health_undo, undo = health.MONITOR, None, self._health_undo
        undo()
        health.MONITOR = None
        if not judge or monitor is None:
            return
        main = sys.modules.get("__main__")
        incident = health.silent_incident(monitor, self.tracker.steps, getattr(main, "__dict__", None))
        if incident is not None:
            if incident_handler is not None:
                incident_handler(incident, self.tracker)
            else:
                diagnose_live(incident, None, self.tracker)

    def _hook(self) -> None:
        from torch import nn

        t, monitor = self.tracker, self.monitor
        checks = monitor.on_nan != "ignore"
        if self.record_calls and isinstance(self.model, nn.Module):
            @_mark_triage_hook
            def record_model(module, args, kwargs):
                t.model_call = (args, kwargs)

            self._handles.append(self.model.register_forward_pre_hook(record_model, with_kwargs=True))
        if self.record_calls and isinstance(self.loss_fn, nn.Module):
            @_mark_triage_hook
            def record_loss(module, args, kwargs, output):
                t.loss_call = (args, kwargs)
                t.last_loss = output
                if checks:
                    monitor.check(output, "loss")

            self._handles.append(self.loss_fn.register_forward_hook(record_loss, with_kwargs=True))
        elif self.record_calls and checks and isinstance(self.model, nn.Module):
            @_mark_triage_hook
            def check_output(module, args, output):
                from .probes.step import first_tensor

                monitor.check(first_tensor(output), "model output")

            self._handles.append(self.model.register_forward_hook(check_output))
        if self.optimizer is not None and hasattr(self.optimizer, "register_step_pre_hook"):
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            # One pre-step hook does it all (each hook call costs): the step is counted as it begins.
            self._handles.append(self.optimizer.register_step_pre_hook(monitor.step_hook(params, t)))


def track(loader: Iterable, tracker: Tracker | None = None) -> Iterator[Any]:
    """`for batch in triage.track(loader):` yields the loader's batches unchanged, telling triage each one."""
    t = tracker or TRACKER
    t.loader = loader
    iterator = iter(loader)
    try:
        iterator._triage_tracked = True  # the DataLoader hook of auto_track() leaves this iterator to us
    except AttributeError:
        pass
    on_batch = t.on_batch
    for batch in iterator:
        on_batch(batch, loader)
        yield batch


# ---------------------------------------------------------------------------- automatic tracking (the runner)


def _fire_on_nonfinite_loss(monitor: NonFiniteMonitor) -> None:
    """A non-finite loss seen by the run's loss trend (every backward(), optimizer or not) is the NaN check's
    incident at once, before backward spreads it into the gradients and the next step into the weights."""
    from . import loss_watch

    if loss_watch.TREND is not None and loss_watch.TREND.on_nonfinite is None:
        loss_watch.TREND.on_nonfinite = lambda call, value: monitor.fire("loss", f"loss = {value} at backward() call {call}")


def auto_track(tracker: Tracker | None = None, on_nan: str = "report") -> Callable[[], None]:
    """Feed the Tracker from every DataLoader and optimizer in the process, with no change to the script.

    DataLoader iterators report each batch; a global optimizer hook counts steps,
    remembers the optimizer and checks gradients for NaN/Inf at an adaptive
    stride. Returns a function that removes all of it.
    """
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    from torch.utils.data import DataLoader
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    t = tracker or TRACKER
    monitor = NonFiniteMonitor(t, on_nan)
    _fire_on_nonfinite_loss(monitor)
    original_next = _BaseDataLoaderIter.__next__
    original_iter = DataLoader.__iter__

    def __iter__(self):
        iterator = original_iter(self)
        try:
            iterator._triage_loader = self
        except AttributeError:
            pass
        return iterator

    def __next__(self):
        batch = original_next(self)
        if not getattr(self, "_triage_tracked", False):
            t.on_batch(batch, getattr(self, "_triage_loader", self))
        return batch

    hook_of: dict[int, Callable[[Any, Any, Any], None]] = {}

    def before_step(optimizer, args, kwargs):
        if t.watch_active or t.suspended:
            return  # watch() follows this loop itself; a probe's replay is not the user's step
        hook = hook_of.get(id(optimizer))
        if hook is None:
            hook = hook_of[id(optimizer)] = monitor.step_hook([p for g in optimizer.param_groups for p in g["params"]], t)
        hook(optimizer, args, kwargs)  # counted as it begins, as in watch()

    DataLoader.__iter__ = __iter__
    _BaseDataLoaderIter.__next__ = __next__
    pre = register_optimizer_step_pre_hook(before_step)

    def undo() -> None:
        if DataLoader.__iter__ is __iter__:
            DataLoader.__iter__ = original_iter
        if _BaseDataLoaderIter.__next__ is __next__:
            _BaseDataLoaderIter.__next__ = original_next
        pre.remove()

    return undo
