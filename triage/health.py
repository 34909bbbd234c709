"""Training-health checks: a run that finishes but does not learn, diverges or leaks, turned into a `silent` Incident.

One hook on `torch.autograd.backward` sees every `loss.backward()`. On most
steps it only counts and compares the count with the next one at which work is
due (one integer, rescheduled whenever work runs); every few steps, before
backward runs (the caches are still warm from the forward), it reads the loss
(a CPU scalar by its address, a GPU one summed on the device: no sync) and the
process or CUDA memory; at a few sampled steps it walks the autograd graph
(which parameters it reaches, the loss it ends in, custom autograd Functions,
ReLU outputs) and, after backward, the gradients (at a stride budgeted against
the step time). Series are kept in a bounded number of buckets whose width
doubles as the run grows.
At the end of the run `findings()` reads it all once; each finding says how many
steps it watched and the threshold it used, in a `triage: silent: CHECK: ...`
line the knowledge base (knowledge_base/learning.yaml) matches.
"""

from __future__ import annotations

import math
import os
import sys
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

from .graph_walk import autograd_nodes
from .live_objects import live_objects

MAX_POINTS = 256  # loss and memory buckets kept; pairs merge when full
LOSS_EVERY_START = 4  # a bucket's width in backward calls at the start (the loss is read once per bucket)
MAX_LOSS_EVERY = 8  # once buckets span several steps, the loss is sampled in them rather than read every step
MEMORY_EVERY = 32  # memory is read at bucket ends, and at most every this many backward calls
MAX_GRAD_POINTS = 64  # grad-norm samples kept
GRAD_STRIDE_START = 8  # backward calls between grad-norm samples, doubling as samples fill up...
GRAD_SAMPLE_BUDGET = 0.001  # ...or as the samples' cost requires, to stay under this share of the step time
MAX_GRAD_STRIDE = 1024
MIN_GRAD_SAMPLES = 4  # taken at the starting stride whatever they cost: the zero-gradient check needs a few
CLEAR_CHECK_EVERY = 16  # backward calls between checks that the last step's gradients were cleared
GRAPH_SAMPLES_DENSE = 8  # the first backward graphs are all walked, then the 16th, 32nd, ...
MAX_GRAPH_NODES = 20_000
MIN_STEPS = 32  # fewer backward calls than this: too short a run to judge the loss
BACKWARD_WITHOUT_STEP_MIN = 10
CHANCE_TOLERANCE = 0.015  # the loss ends within this share of log C and never falls below it by more
FLAT_TOLERANCE = 0.01  # start-to-end change under this share of the loss
DIVERGE_RATIO = 2.0  # end loss at least this multiple of the start loss...
DIVERGE_RISES = 5  # ...rising between at least this many of the 7 window pairs
LEAK_MIN_BYTES = 32 * 2**20
LEAK_MIN_R2 = 0.9
LEAK_SKIP_FRACTION = 0.2  # warm-up (allocator, first batches) ignored by the memory fit
MAX_NAMES = 6
FUNCTION_TOLERANCE = 1e-3
MAX_FLOW_ROWS = 40


def _compact(points: list[list[float]]) -> None:
    """Merge neighbouring buckets pairwise: x of the later one, y the mean."""
    merged = []
    for index in range(0, len(points) - 1, 2):
        first, second = points[index], points[index + 1]
        merged.append([second[0], (first[1] + second[1]) / 2])
    if len(points) % 2:
        merged.append(points[-1])
    points[:] = merged


@dataclass
class Finding:
    """One thing wrong with training, as the line the knowledge base matches."""

    check: str
    line: str
    facts: dict[str, Any] = field(default_factory=dict)


class HealthMonitor:
    """Watches backward() calls in this process; `findings()` judges the run once it has ended."""

    def __init__(self, tracker: Any = None) -> None:
        self.tracker = tracker
        self.backwards = 0
        self.losses: list[list[float]] = []  # [backward index, mean loss of the bucket]
        self.memory: list[list[float]] = []  # [backward index, bytes]
        self.grad_norms: list[list[float]] = []  # [backward index, total gradient norm]
        self.layer_grads: dict[str, list[float]] = {}  # parameter name -> [mean |grad|, max |grad|] (last sample)
        self.zero_grad_samples: dict[int, int] = {}  # id(param) -> samples in which its gradient was exactly 0
        self.grad_samples = 0
        self.stride = LOSS_EVERY_START
        self.every = LOSS_EVERY_START  # the loss is read at every `every`-th backward: 4, then up to 8
        self.grad_stride = GRAD_STRIDE_START
        self._last_grad_sample: tuple[float, int] | None = None  # (time, backward count) of the last sample
        self._bucket_sum = 0.0
        self._device_sum: Any = None  # the bucket's loss sum as a CUDA scalar, for a loss that lives on the GPU
        self._bucket_count = 0
        self.graph_samples = 0
        self.leaves: dict[int, weakref.ref] = {}  # parameters any sampled graph reached
        self.classes: int | None = None
        self.softmax_before_ce: dict[str, Any] | None = None
        self.custom_functions: dict[str, type] = {}
        self.relu_zero_fraction: list[tuple[list[int], float]] = []
        self.cuda_memory = False
        # Optimizers that took a step (the ones that train), by id: a dict lookup per step, where WeakSet.add made a
        # new weak reference every step.
        self.stepped: dict[int, weakref.ref] = {}
        self.next_due = 1  # the backward count at which before_backward next has something to do
        self._readers: dict[Any, tuple[Any, int]] = {}  # torch dtype -> (memory view, address shift) for CPU scalars
        # (optimizer steps counted then, a parameter) at a sampled backward: were its gradients cleared before the next?
        self.pending_clear_check: tuple[int, weakref.ref, weakref.ref] | None = None
        self._sentinel: tuple[weakref.ref, weakref.ref] | None = None  # (optimizer, its smallest parameter)
        self.carried = 0  # sampled backward pairs with a step between them and the gradient still there
        self.cleared = 0
        self.function_inputs: dict[str, int] = {}
        self._statm = _open_statm()
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    # ------------------------------------------------------------------ the hook

    def install(self) -> Callable[[], None]:
        """Wrap torch.autograd.backward (Tensor.backward calls it); returns the function that unwraps it."""
        import torch

        from .host_memory import READERS

        self._readers = {getattr(torch, name.split(".")[1]): reader for name, reader in READERS.items()}
        original = torch.autograd.backward
        monitor = self
        tracker = self.tracker
        from . import loss_watch

        trend = loss_watch.TREND  # the loss of every backward() call, for the NaN/Inf diagnosis (loss_watch.py)

        def backward(tensors, *args, **kwargs):
            if tracker is not None and tracker.suspended:
                return original(tensors, *args, **kwargs)  # a probe's replay, not the user's step
            count = monitor.backwards = monitor.backwards + 1
            if trend is not None:
                trend.read_loss(tensors)  # every backward's loss: the NaN/divergence watch (loss_watch.py)
            # Everything is read before backward, where the caches are still warm from the forward; on most
            # steps none of it is due and these comparisons are the whole cost.
            if count < monitor.next_due and (trend is None or not trend.wants_gradients):
                return original(tensors, *args, **kwargs)
            post = False
            if count >= monitor.next_due:
                try:
                    post = monitor.before_backward(tensors, count)
                except Exception:
                    monitor.next_due = count + monitor.every  # a failing read must not run on every later step
                    if os.environ.get("TRIAGE_DEBUG"):
                        raise
            result = original(tensors, *args, **kwargs)
            if trend is not None and trend.wants_gradients:
                trend.read_gradients(monitor.leaves.values())
            if post:
                try:
                    monitor.after_backward(count)
                except Exception:
                    if os.environ.get("TRIAGE_DEBUG"):
                        raise
            return result

        backward._triage_hook = True  # type: ignore[attr-defined]
        backward.__wrapped__ = original  # type: ignore[attr-defined]
        torch.autograd.backward = backward
        from torch.optim.optimizer import register_optimizer_step_post_hook

        stepped = self.stepped

        def step_taken(optimizer, args, kwargs) -> None:
            if id(optimizer) not in stepped:
                stepped[id(optimizer)] = weakref.ref(optimizer)

        handle = register_optimizer_step_post_hook(step_taken)

        def undo() -> None:
            handle.remove()
            if torch.autograd.backward is backward:
                torch.autograd.backward = original

        return undo

    def walk_graph(self, loss: Any, count: int) -> None:
        """Walk the graph of `loss` (before backward frees it): leaves, the loss function, custom Functions."""
        self.graph_samples += 1
        # ReLU outputs are counted (a pass over each activation) in the 2nd graph and then in the 16th, 32nd, ...
        read_relus = count == 2 or count >= 16
        for node in autograd_nodes([loss.grad_fn], MAX_GRAPH_NODES):
            name = type(node).__name__
            if name == "AccumulateGrad":
                leaf = node.variable
                key = id(leaf)
                if key not in self.leaves:
                    self.leaves[key] = weakref.ref(leaf)
                continue
            forward_cls = getattr(node, "_forward_cls", None)
            if forward_cls is not None:
                self.custom_functions.setdefault(forward_cls.__qualname__, forward_cls)
                self.function_inputs.setdefault(forward_cls.__qualname__, len(node.next_functions))
            elif name == "NllLossBackward0" and self.classes is None:
                self._read_loss_node(node)
            elif name == "ReluBackward0" and read_relus:
                self._read_relu(node)

    def _read_loss_node(self, node: Any) -> None:
        scores = node._saved_self  # the log-probabilities: [N, C] (or [N, C, ...])
        if scores.dim() >= 2:
            self.classes = int(scores.shape[1])
        elif scores.dim() == 1:
            self.classes = int(scores.shape[0])
        producer = node.next_functions[0][0] if node.next_functions else None
        if producer is not None and type(producer).__name__ == "LogSoftmaxBackward0":
            before = producer.next_functions[0][0] if producer.next_functions else None
            if before is not None and type(before).__name__ == "SoftmaxBackward0":
                self.softmax_before_ce = {"shape": list(scores.shape), "classes": self.classes}

    def _read_relu(self, node: Any) -> None:
        if len(self.relu_zero_fraction) >= 64:
            return
        output = node._saved_result
        if output.numel():
            zeros = float((output == 0).sum()) / output.numel()
            self.relu_zero_fraction.append((list(output.shape), zeros))

    def before_backward(self, tensors: Any, count: int) -> bool:
        """Before the `count`-th backward: the zero_grad check, the graph (sampled), the loss (every `every`-th)
        and memory; returns whether gradients are to be read after this backward."""
        if self.pending_clear_check is not None:
            self.check_cleared()
        loss = tensors[0] if type(tensors) in (tuple, list) else tensors
        if count <= GRAPH_SAMPLES_DENSE or not count & (count - 1):  # the first graphs, then the 16th, 32nd, ...
            if getattr(loss, "grad_fn", None) is not None:
                self.walk_graph(loss, count)
        post = False
        if not count % self.every:
            self._read_loss(loss, count)
            post = not count % self.grad_stride or not count % CLEAR_CHECK_EVERY
        self._schedule(count)
        return post

    def _schedule(self, count: int) -> None:
        """The next backward count with work due: a loss read (a multiple of `every`, on which gradient samples and
        zero_grad checks also fall), a graph walk (the first few, then powers of two) or a pending zero_grad check."""
        if self.pending_clear_check is not None or count < GRAPH_SAMPLES_DENSE:
            self.next_due = count + 1
            return
        next_read = (count // self.every + 1) * self.every
        self.next_due = min(next_read, 1 << count.bit_length())  # 1 << bit_length: the next power of two

    def _read_loss(self, loss: Any, count: int) -> None:
        reader = self._readers.get(loss.dtype)
        if reader is not None and loss.is_cpu and loss.numel() == 1:
            # The value read by its address (the wrapper's reader): float(loss) costs several times more.
            number = reader[0][loss.data_ptr() >> reader[1]]
            if number - number == 0:  # finite: NaN/Inf are the NaN check's to report
                self._bucket_sum += number
                self._bucket_count += 1
        elif loss.is_cuda and loss.numel() == 1:
            # Summed on the device, read when the run is judged: no host-device synchronisation per step.
            value = loss.detach()  # a view: no kernel; the sum below is one small kernel, out of place
            self._device_sum = value if self._device_sum is None else self._device_sum + value
            self._bucket_count += 1
        if count % self.stride:
            return
        if self._bucket_count:
            total = self._bucket_sum if self._device_sum is None else self._device_sum
            self.losses.append([count, total / self._bucket_count])
        self._bucket_sum, self._bucket_count, self._device_sum = 0.0, 0, None
        if not count % max(self.stride, MEMORY_EVERY):
            memory = self._memory()
            if memory is not None:
                self.memory.append([count, memory])
        if len(self.losses) >= MAX_POINTS:
            _compact(self.losses)
            _compact(self.memory)
            self.stride *= 2
            self.every = min(self.stride, MAX_LOSS_EVERY)

    def after_backward(self, count: int) -> None:
        """After a backward whose gradients are due: their norms (sampled) and the zero_grad check's sentinel."""
        if not count % self.grad_stride:
            self._sample_gradients(count)
        if not count % CLEAR_CHECK_EVERY and self.pending_clear_check is None:
            self._arm_clear_check()
            if self.pending_clear_check is not None:
                self.next_due = count + 1

    def _memory(self) -> float | None:
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_initialized():
            self.cuda_memory = True
            return float(cuda.memory_allocated())
        if self._statm is None:
            return None
        try:
            return float(int(os.pread(self._statm, 64, 0).split()[1]) * self._page)
        except (OSError, ValueError, IndexError):
            return None

    def _sample_gradients(self, count: int) -> None:
        """Gradient norms now; the next sample is as far off as keeps these samples within GRAD_SAMPLE_BUDGET."""
        started = time.perf_counter()
        self._measure_gradients(count)
        now = time.perf_counter()
        if self._last_grad_sample is not None and self.grad_samples >= MIN_GRAD_SAMPLES:
            interval = (now - self._last_grad_sample[0]) / max(1, count - self._last_grad_sample[1])
            wanted = (now - started) / (GRAD_SAMPLE_BUDGET * interval) if interval > 0 else 1
            while self.grad_stride < min(wanted, MAX_GRAD_STRIDE):  # powers of two: samples fall on read steps
                self.grad_stride *= 2
        self._last_grad_sample = (now, count)

    def _measure_gradients(self, count: int) -> None:
        torch = sys.modules["torch"]
        grads = []
        for key, ref in self.leaves.items():
            param = ref()
            grad = getattr(param, "grad", None)
            if grad is not None and grad.is_floating_point():
                grads.append((key, grad))
        if not grads:
            return
        with torch.no_grad():
            # One host copy of all the norms: a float() per parameter is a synchronisation and a call each.
            norms = torch.stack([n.float() for n in torch._foreach_norm([g for _, g in grads])]).tolist()
        total = math.sqrt(sum(n * n for n in norms))
        for (key, _), norm in zip(grads, norms):
            if norm == 0.0:
                self.zero_grad_samples[key] = self.zero_grad_samples.get(key, 0) + 1
        self.grad_samples += 1
        self.grad_norms.append([count, total])
        _note_grad_norm(total)
        if len(self.grad_norms) >= MAX_GRAD_POINTS:
            self.grad_norms[:] = self.grad_norms[1::2]
            self.grad_stride *= 2

    def _arm_clear_check(self) -> None:
        """Pick the stepping optimizer's smallest parameter (its check is the cheapest) to see if zero_grad() runs."""
        optimizer = getattr(self.tracker, "optimizer", None)
        if optimizer is None:
            return
        if self._sentinel is None or self._sentinel[0]() is not optimizer:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            if not params:
                return
            self._sentinel = (weakref.ref(optimizer), weakref.ref(min(params, key=lambda p: p.numel())))
        param = self._sentinel[1]()
        if param is not None and param.grad is not None:
            self.pending_clear_check = (self.tracker.steps, self._sentinel[1], weakref.ref(param.grad))

    def check_cleared(self) -> None:
        """Right before a backward: if a step ran since the sampled one, its gradient tensor should be gone or zero."""
        steps_then, param_ref, grad_ref = self.pending_clear_check
        if self.tracker.steps == steps_then:
            return  # gradient accumulation: no step in between, keeping the gradient is the point
        self.pending_clear_check = None
        param, grad = param_ref(), grad_ref()
        if param is not None and grad is not None and param.grad is grad and bool(grad.abs().sum() > 0):
            self.carried += 1
        else:
            self.cleared += 1

    def layer_gradients(self, names: dict[int, str]) -> list[dict[str, Any]]:
        """Mean and max |grad| per parameter as they stand now (the run has ended): the gradient-flow chart."""
        torch = sys.modules["torch"]
        rows = []
        with torch.no_grad():
            for key, name in names.items():
                param = self.leaves.get(key, lambda: None)()
                grad = getattr(param, "grad", None)
                if grad is None or not grad.is_floating_point() or not grad.numel():
                    rows.append({"name": name, "mean": 0.0, "max": 0.0, "has_grad": key in self.leaves})
                    continue
                magnitude = grad.detach().abs()
                rows.append({"name": name, "mean": float(magnitude.mean()), "max": float(magnitude.max()), "has_grad": True})
        return rows

    # ------------------------------------------------------------------ judging the run

    def findings(self, steps: int, main_globals: dict[str, Any] | None = None) -> list[Finding]:
        """Every check that fails for the run that just ended; `steps` is the optimizer steps the Tracker counted."""
        found: list[Finding] = []
        if self.backwards == 0:
            return found
        self.settle()
        # The optimizers that stepped; when none did, every live one (an earlier phase's optimizer is not this run's).
        optimizers = [o for o in (ref() for ref in self.stepped.values()) if o is not None] or _live_optimizers()
        names = _parameter_names(main_globals)
        optimized = {id(p): (index, group_index, group) for index, opt in enumerate(optimizers)
                     for group_index, group in enumerate(opt.param_groups) for p in group["params"]}
        watched = self.backwards
        if steps == 0 and self.backwards >= BACKWARD_WITHOUT_STEP_MIN:
            opts = ", ".join(f"{type(o).__name__} over {sum(len(g['params']) for g in o.param_groups)} tensors"
                             for o in optimizers) or "none found"
            found.append(Finding("backward-without-step",
                                 f"triage: silent: backward-without-step: {self.backwards} backward() calls and 0 optimizer "
                                 f"steps (watched {watched} backward calls; threshold: {BACKWARD_WITHOUT_STEP_MIN} "
                                 f"backward calls with no step); optimizers: {opts}",
                                 {"backwards": self.backwards, "steps": steps, "optimizers": opts}))
        found += self._optimizer_membership(optimizers, optimized, names, steps, main_globals)
        found += self._zero_gradients(names)
        if self.carried >= 3 and self.cleared == 0:
            found.append(Finding("gradients-not-cleared",
                                 f"triage: silent: gradients-not-cleared: the gradients were still there at the next "
                                 f"backward() after an optimizer step in {self.carried} of {self.carried} checks: "
                                 f"optimizer.zero_grad() is never called, so each step adds all earlier gradients "
                                 f"(watched {watched} backward calls; threshold: 3 checks, none cleared)",
                                 {"checks": self.carried}))
        found += self._loss_checks()
        found += self._memory_check(main_globals)
        if self.softmax_before_ce is not None:
            shape = self.softmax_before_ce["shape"]
            found.append(Finding("softmax-before-cross-entropy",
                                 f"triage: silent: softmax-before-cross-entropy: the input of cross_entropy "
                                 f"(shape {shape}, {self.classes} classes) is the output of softmax: LogSoftmax "
                                 f"is applied to probabilities (seen in {self.graph_samples} sampled graphs)",
                                 dict(self.softmax_before_ce)))
        for name, cls in sorted(self.custom_functions.items()):
            error = backward_mismatch(cls, self.function_inputs.get(name, 1))
            if error is not None:
                found.append(Finding("custom-function-backward",
                                     f"triage: silent: custom-function-backward: autograd.Function {name} "
                                     f"({_defined_at(cls)}): its backward disagrees with a finite difference of its "
                                     f"forward: {error} (checked once in float64 at the end of the run; threshold: "
                                     f"relative error {FUNCTION_TOLERANCE:g})", {"function": name, "error": error}))
        return found

    def _optimizer_membership(self, optimizers: list, optimized: dict, names: dict[int, str], steps: int,
                              main_globals: dict[str, Any] | None) -> list[Finding]:
        if not optimizers or self.graph_samples == 0:
            return []
        torch = sys.modules["torch"]
        found = []
        outside = [key for key, ref in self.leaves.items()
                   if key not in optimized and isinstance(ref(), torch.nn.Parameter)]
        if outside and steps > 0:
            shown = [names.get(key, f"a {tuple(self.leaves[key]().shape)} parameter") for key in outside]
            count_in = len(optimized)
            found.append(Finding("params-not-in-optimizer",
                                 f"triage: silent: params-not-in-optimizer: {len(outside)} parameters get gradients but "
                                 f"are in no optimizer's param_groups: {_names(shown)} (the optimizers hold {count_in} "
                                 f"other tensors; watched {self.graph_samples} backward graphs; threshold: any)",
                                 {"parameters": shown, "optimizer_tensors": count_in}))
        if self.graph_samples < 3:
            return found
        never = []
        frozen_groups = []
        for opt in optimizers:
            for group_index, group in enumerate(opt.param_groups):
                params = group["params"]
                if params and all(not p.requires_grad for p in params) and any(
                        q.requires_grad for g in opt.param_groups for q in g["params"]):
                    frozen_groups.append((type(opt).__name__, group_index, group.get("lr"), params))
                never += [p for p in params if p.requires_grad and id(p) not in self.leaves]
        if never:
            shown = [names.get(id(p), f"a {tuple(p.shape)} parameter no module holds any more") for p in never]
            found.append(Finding("no-gradient",
                                 f"triage: silent: no-gradient: {len(never)} of {len(optimized)} optimized parameters "
                                 f"never got a gradient although requires_grad=True: {_names(shown)} (watched "
                                 f"{self.graph_samples} backward graphs; threshold: absent from all of them)",
                                 {"parameters": shown}))
        for opt_name, group_index, lr, params in frozen_groups:
            shown = [names.get(id(p), f"a {tuple(p.shape)} parameter") for p in params]
            stray = _stray_requires_grad(params, main_globals)
            hint = f"; module {', '.join(stray)} has a plain attribute requires_grad=True" if stray else ""
            found.append(Finding("frozen-param-group",
                                 f"triage: silent: frozen-param-group: {opt_name} param group {group_index} (lr={lr}) "
                                 f"holds {len(params)} parameters, all with requires_grad=False: {_names(shown)}{hint} "
                                 f"(watched {self.graph_samples} backward graphs; threshold: a whole group frozen)",
                                 {"group": group_index, "lr": lr, "parameters": shown, "stray_attribute": stray}))
        return found

    def _zero_gradients(self, names: dict[int, str]) -> list[Finding]:
        if self.grad_samples < 3:
            return []
        dead = [key for key, count in self.zero_grad_samples.items() if count >= self.grad_samples - 1]
        if not dead:
            return []
        shown = [names.get(key, "a parameter") for key in dead]
        relus = [(shape, fraction) for shape, fraction in self.relu_zero_fraction if fraction >= 0.99]
        relu_text = ""
        if relus:
            shape, fraction = relus[0]
            relu_text = f"; ReLU outputs of shape {shape} are {fraction:.0%} zeros in {len(relus)} sampled graphs"
        return [Finding("zero-gradient",
                        f"triage: silent: zero-gradient: {len(dead)} parameters got gradients that are exactly 0: "
                        f"{_names(shown)} (in {self.grad_samples - 1}+ of {self.grad_samples} sampled steps; threshold: "
                        f"norm == 0){relu_text}",
                        {"parameters": shown, "dead_relu": bool(relus)})]

    def _loss_checks(self) -> list[Finding]:
        values = [y for _, y in self.losses]
        if self.backwards < MIN_STEPS or len(values) < 8:
            return []
        window = max(1, len(values) // 8)
        windows = [sum(values[i:i + window]) / len(values[i:i + window]) for i in range(0, window * 8, window)]
        start, end = windows[0], windows[-1]
        watched = self.backwards
        rises = sum(later > earlier for earlier, later in zip(windows, windows[1:]))
        if start > 0 and end >= DIVERGE_RATIO * start and rises >= DIVERGE_RISES:
            return [Finding("loss-diverging",
                            f"triage: silent: loss-diverging: the loss grew from {start:.4g} to {end:.4g} (x{end / start:.3g}) "
                            f"over {watched} steps, rising in {rises} of 7 windows (threshold: x{DIVERGE_RATIO:g} and "
                            f"rising in {DIVERGE_RISES} of 7)", {"start": start, "end": end, "steps": watched})]
        if self.classes and self.classes > 1:
            chance = math.log(self.classes)
            # A slow learner can sit near log C too: it is still falling in the second half of the run.
            late_slope, _ = _linear_fit([[index, value] for index, value in enumerate(windows[4:])])
            late_drop = -late_slope * 4
            if (abs(end - chance) <= CHANCE_TOLERANCE * chance and min(windows) >= chance * (1 - CHANCE_TOLERANCE)
                    and late_drop < FLAT_TOLERANCE * chance):
                return [Finding("loss-at-chance",
                                f"triage: silent: loss-at-chance: the loss stays at {end:.4f}, log({self.classes}) = "
                                f"{chance:.4f} for {self.classes} classes, from {start:.4f} at the start, over "
                                f"{watched} steps, never below {min(windows):.4f}, {late_drop:+.4f} in the second half "
                                f"(threshold: every window within {CHANCE_TOLERANCE:.1%} of log C or above it, and the "
                                f"second half gaining under {FLAT_TOLERANCE:.0%} of log C)",
                                {"loss": end, "chance": chance, "classes": self.classes, "steps": watched})]
        scale = max(abs(start), abs(end), 1e-12)
        if abs(start - end) <= FLAT_TOLERANCE * scale and max(windows) - min(windows) <= 2 * FLAT_TOLERANCE * scale:
            return [Finding("loss-flat",
                            f"triage: silent: loss-flat: the loss did not move: {start:.4g} at the start, {end:.4g} at "
                            f"the end of {watched} steps (threshold: change under {FLAT_TOLERANCE:.0%})",
                            {"start": start, "end": end, "steps": watched})]
        if start > 0 and end > start * (1 + 5 * FLAT_TOLERANCE) and rises >= DIVERGE_RISES:
            return [Finding("loss-rising",
                            f"triage: silent: loss-rising: the loss rose from {start:.4g} to {end:.4g} over {watched} "
                            f"steps, rising in {rises} of 7 windows (threshold: +{5 * FLAT_TOLERANCE:.0%} and rising in "
                            f"{DIVERGE_RISES} of 7)", {"start": start, "end": end, "steps": watched})]
        return []

    def _memory_check(self, main_globals: dict[str, Any] | None) -> list[Finding]:
        points = self.memory[int(len(self.memory) * LEAK_SKIP_FRACTION):]
        if len(points) < 8:
            return []
        slope, r2 = _linear_fit(points)
        growth = slope * (points[-1][0] - points[0][0])
        if growth < LEAK_MIN_BYTES or r2 < LEAK_MIN_R2:
            return []
        holders = _graph_holders(main_globals or {})
        held = "; held by: " + "; ".join(h["text"] for h in holders) if holders else ""
        what = "CUDA allocated memory" if self.cuda_memory else "process memory (RSS)"
        return [Finding("memory-growing",
                        f"triage: silent: memory-growing: {what} grew {growth / 2**20:.1f} MiB over "
                        f"{int(points[-1][0] - points[0][0])} steps ({slope / 2**20:.3f} MiB per step, linear fit "
                        f"R2={r2:.2f}; watched {self.backwards} steps; threshold: {LEAK_MIN_BYTES // 2**20} MiB and "
                        f"R2 >= {LEAK_MIN_R2}){held}",
                        {"growth_bytes": growth, "per_step_bytes": slope, "r2": r2, "holders": holders})]

    def settle(self) -> None:
        """Bring loss values kept on the GPU to the host, in one copy (the run has ended)."""
        device = [index for index, (_, y) in enumerate(self.losses) if not isinstance(y, float)]
        if device:
            torch = sys.modules["torch"]
            values = torch.stack([self.losses[i][1].reshape(()) for i in device]).cpu().tolist()
            for index, value in zip(device, values):
                self.losses[index][1] = float(value)
            # A bucket that held a NaN/Inf loss is the NaN check's to report, not a point of the curve.
            self.losses[:] = [point for point in self.losses if math.isfinite(point[1])]

    def series(self, names: dict[int, str] | None = None) -> dict[str, Any]:
        """The curves for the report (plain data): loss, grad norm, memory per step, gradient flow per parameter."""
        self.settle()
        return {
            "backwards": self.backwards,
            "loss": [list(p) for p in self.losses],
            "grad_norm": [list(p) for p in self.grad_norms],
            "memory": [list(p) for p in self.memory],
            "memory_kind": "cuda_allocated" if self.cuda_memory else "rss",
            "gradient_flow": self.layer_gradients(names or {}),
            "classes": self.classes,
        }


def backward_mismatch(cls: type, inputs: int, seed: int = 0) -> str | None:
    """A directional-derivative check of a custom autograd.Function in float64: how its backward disagrees, or None.

    One random input and direction: <backward(v), d> must equal (f(x + eps d) - f(x - eps d)) / 2 eps, with v a
    random weight on the output. Cheaper than gradcheck (one backward, two forwards), enough to flag a wrong sign
    or scale; the gradcheck probe runs the full check. Returns None too when the Function cannot be called that way.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    args = [torch.randn(4, 5, dtype=torch.float64, generator=generator, requires_grad=True) for _ in range(max(1, inputs))]
    directions = [torch.randn(4, 5, dtype=torch.float64, generator=generator) for _ in args]
    try:
        with torch.enable_grad():
            output = cls.apply(*args)
            if not isinstance(output, torch.Tensor) or not output.requires_grad:
                return None
            weight = torch.randn(output.shape, dtype=torch.float64, generator=generator)
            grads = torch.autograd.grad((output * weight).sum(), args, allow_unused=True)
        analytic = sum(float((g * d).sum()) for g, d in zip(grads, directions) if g is not None)
        eps = 1e-6
        with torch.no_grad():
            plus = cls.apply(*[a + eps * d for a, d in zip(args, directions)])
            minus = cls.apply(*[a - eps * d for a, d in zip(args, directions)])
        numeric = float(((plus - minus) * weight).sum()) / (2 * eps)
    except Exception:
        return None
    scale = max(abs(numeric), abs(analytic), 1e-12)
    if abs(analytic - numeric) / scale <= FUNCTION_TOLERANCE:
        return None
    return f"directional derivative {analytic:.6g} from backward, {numeric:.6g} from the forward"


def _defined_at(cls: type) -> str:
    import inspect

    try:
        return f"{os.path.basename(inspect.getsourcefile(cls) or '?')}:{inspect.getsourcelines(cls)[1]}"
    except (OSError, TypeError):
        return getattr(cls, "__module__", "?")


def _names(names: list[str]) -> str:
    return ", ".join(names[:MAX_NAMES]) + (f", ... ({len(names)} in all)" if len(names) > MAX_NAMES else "")


def _linear_fit(points: list[list[float]]) -> tuple[float, float]:
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    syy = sum((y - mean_y) ** 2 for _, y in points)
    if sxx == 0 or syy == 0:
        return 0.0, 0.0
    return sxy / sxx, (sxy * sxy) / (sxx * syy)


def _note_grad_norm(total: float) -> None:
    """Hand a sampled gradient norm to the NaN/Inf diagnosis's trend (loss_watch.py), when it keeps one."""
    from . import loss_watch

    if loss_watch.TREND is not None:
        loss_watch.TREND.note_grad_norm(total)


def _open_statm() -> int | None:
    try:
        return os.open("/proc/self/statm", os.O_RDONLY)
    except OSError:
        return None


def _live_optimizers() -> list[Any]:
    from torch.optim import Optimizer

    return live_objects(Optimizer)


def _parameter_names(main_globals: dict[str, Any] | None) -> dict[int, str]:
    """id(parameter) -> its name as the user writes it: `model.fc.weight`, from the script's global modules."""
    from torch import nn

    names: dict[int, str] = {}
    modules = _global_modules(main_globals)
    if not modules:  # a script that keeps its model in a function: the largest live module, unnamed
        live = live_objects(nn.Module)
        modules = [("", max(live, key=lambda m: sum(1 for _ in m.parameters())))] if live else []
    for prefix, module in sorted(modules, key=lambda item: -sum(1 for _ in item[1].parameters())):
        for name, param in module.named_parameters():
            names.setdefault(id(param), f"{prefix}.{name}" if prefix else name)
    return names


def _stray_requires_grad(params: list, main_globals: dict[str, Any] | None) -> list[str]:
    """Modules holding these parameters with `requires_grad` set as a plain attribute (module.requires_grad = True)."""
    from torch import nn

    wanted = {id(p) for p in params}
    module_names: dict[int, str] = {}
    for prefix, module in _global_modules(main_globals):
        for name, sub in module.named_modules():
            module_names.setdefault(id(sub), ".".join(filter(None, [prefix, name])))
    return [module_names.get(id(obj), type(obj).__name__) for obj in live_objects(nn.Module)
            if "requires_grad" in obj.__dict__ and any(id(p) in wanted for p in obj.parameters())]


def _global_modules(main_globals: dict[str, Any] | None) -> list[tuple[str, Any]]:
    from torch import nn

    return [(name, value) for name, value in (main_globals or {}).items()
            if isinstance(value, nn.Module) and not name.startswith("_")]


def _graph_holders(main_globals: dict[str, Any]) -> list[dict[str, Any]]:
    """The script's globals that keep autograd graphs alive: containers of tensors with grad_fn, or one long graph."""
    torch = sys.modules["torch"]
    holders = []
    for name, value in main_globals.items():
        if name.startswith("__"):
            continue
        items = None
        if isinstance(value, (list, tuple)) or type(value).__name__ == "deque":
            items = list(value)
        elif isinstance(value, dict):
            items = list(value.values())
        if items is not None:
            tensors = [t for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]
            if len(tensors) >= 8:
                kind = type(value).__name__
                holders.append({"name": name, "count": len(tensors), "kind": kind,
                                "text": f"`{name}`, a {kind} of {len(tensors)} tensors with grad_fn (each keeps its "
                                        f"step's autograd graph alive)"})
        elif isinstance(value, torch.Tensor) and value.grad_fn is not None:
            nodes = _count_nodes(value.grad_fn)
            if nodes >= 1000:
                holders.append({"name": name, "count": nodes, "kind": "tensor",
                                "text": f"`{name}`, a tensor whose autograd graph has {nodes}"
                                        f"{'+' if nodes >= MAX_GRAPH_NODES else ''} nodes (accumulated across steps)"})
    return holders


def _count_nodes(root: Any) -> int:
    return sum(1 for _ in autograd_nodes([root], MAX_GRAPH_NODES))


# ---------------------------------------------------------------------------- the run's end

MONITOR: HealthMonitor | None = None


def start(tracker: Any = None) -> HealthMonitor:
    """Install the health hook for this process (the runner calls this right after `import torch`)."""
    global MONITOR
    MONITOR = HealthMonitor(tracker)
    MONITOR.undo = MONITOR.install()  # type: ignore[attr-defined]
    return MONITOR


def silent_incident(monitor: HealthMonitor, steps: int, main_globals: dict[str, Any] | None = None) -> Any:
    """The `silent` Incident for a run that ended with findings, or None when training looked healthy."""
    findings = monitor.findings(steps, main_globals)
    if not findings:
        return None
    from .incident import Incident

    names = _parameter_names(main_globals)
    # Every parameter of the model in its own order: those the graph never reached show as "no gradient".
    leaf_names = dict(list(names.items())[:MAX_FLOW_ROWS])
    facts = {"health": {"findings": [{"check": f.check, "line": f.line, **f.facts} for f in findings],
                        "steps": steps, **monitor.series(leaf_names)}}
    return Incident(kind="silent", source="run", log_lines=[f.line for f in findings], facts=facts)
