"""What the training-loop wrapper costs on small CPU training loops, against the bare loop.

Two identical models train in turns, in blocks of BLOCK consecutive steps (as a
real loop runs, each step after one of its own): model B inside
`triage.watch(...)` with its batches from `triage.track(...)`, model A bare.
Each step is timed on its own and paired with the same step of the other
model's neighbouring block, so machine noise (other processes, frequency
changes) falls on both alike; a phase's figure is the trimmed mean of its
per-pair ratios. Each round measures the same two models twice, once with B
bare (the noise: what the pairing alone gives) and once with B watched, and
reports the difference; the figure printed is the median of the rounds, with
their spread. The figure errs high: the wrapper budgets its strided full
gradient check (GRADIENT_CHECK_BUDGET) against the wall-clock interval between
B's steps, which here holds A's steps too, so that check runs twice as often as
it would in a loop of its own.

(The runner's `auto_track()` hooks every DataLoader and optimizer in the
process, so it cannot be paired per step; it does the same per-step work as
watch+track, and the runner's own benchmark measures it on whole scripts.)

The runner's recorder of outermost module calls wraps nn.Module.__call__ until the first optimizer step, then
only the classes of the modules called from outside a forward (the model's, the loss's): B's model and loss get
classes of their own, so the recorder, installed once, is paired per step the same way (`--calls-only`).

    python benchmarks/bench_wrapper.py [--steps 3000] [--rounds 5] [--threads 1] [--calls-only]   (about 10 minutes)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import triage  # noqa: E402


MODELS = {
    "MLP 784-256-10": (lambda: nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)), (784,)),
    "CNN conv8-conv16-fc on 28x28": (lambda: nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 7 * 7, 10)), (1, 28, 28)),
}


def make(name: str, seed: int = 0):
    torch.manual_seed(seed)
    build, shape = MODELS[name]
    data = TensorDataset(torch.randn(2048, *shape), torch.randint(0, 10, (2048,)))
    return build(), data


def optimizer_for(model):
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def timed_step(batches, model, optimizer, loss_fn) -> float:
    started = time.thread_time()
    x, y = next(batches)
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return time.thread_time() - started


def endless(loader):
    while True:
        yield from loader


def endless_tracked(loader):
    while True:
        yield from triage.track(loader)


BLOCK = 10  # consecutive steps of one model before the other's turn


def phase(steps: int, bare: tuple, other: tuple, around_other=contextlib.nullcontext) -> tuple[float, float]:
    """(overhead of `other` against `bare`, bare seconds/step) over `steps` paired steps; each loop is
    (batches, model, optimizer, loss). `around_other` is entered for each of `other`'s blocks only."""
    times: tuple[list[float], list[float]] = ([], [])
    for block in range(steps // BLOCK):
        order = ((bare, times[0], contextlib.nullcontext), (other, times[1], around_other))
        for loop, out, around in order if block % 2 else order[::-1]:  # alternate which block runs first
            with around():
                for _ in range(BLOCK):
                    out.append(timed_step(*loop))
    return overhead(*times), statistics.median(times[0])


def overhead(bare: list[float], watched: list[float]) -> float:
    """Trimmed mean (middle half) of the per-pair ratios, minus one: slow drifts cancel within a pair."""
    ratios = sorted(w / b for b, w in zip(bare, watched))
    k = len(ratios) // 4
    return statistics.mean(ratios[k:len(ratios) - k]) - 1


@contextlib.contextmanager
def recording_calls(steps_of: list):
    """The runner's recorder of outermost module calls (runner/hooks.py), with the step count the runner's own
    optimizer hook keeps (the recorder watches it: after the first step only the model's and the loss's
    classes carry its wrapper)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from triage.runner.hooks import record_outer_calls
    from triage.tracking import Tracker

    tracker = Tracker()
    undo = record_outer_calls(tracker)
    counting = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: setattr(tracker, "steps",
                                                                                         tracker.steps + 1))
    try:
        for loop in steps_of:  # the first steps, in which it finds the classes called from outside a forward
            timed_step(*loop)
            timed_step(*loop)
        yield
    finally:
        counting.remove()
        undo()


def endless_held(loader):
    """Batches as the runner's DataLoader hook sees them: a Tracker of their own holds each until the next one."""
    from triage.tracking import Tracker

    tracker = Tracker()
    while True:
        yield from triage.track(loader, tracker=tracker)


def calls_round(name: str, steps: int) -> tuple[float, float]:
    """(noise, with the call recorder) for a fresh pair of identical loops over a DataLoader whose batches are held
    as under the runner (its DataLoader hook keeps the last batch). B's model and loss are subclasses of their
    own, as a script's model class is, so that installed once for the whole phase the recorder wraps B's alone."""
    model_a, data = make(name)
    model_b = copy.deepcopy(model_a)
    model_b.__class__ = type("Model", (type(model_a),), {})
    loss_b = type("Loss", (nn.CrossEntropyLoss,), {})()
    a = (endless_held(DataLoader(data, batch_size=64)), model_a, optimizer_for(model_a), nn.CrossEntropyLoss())
    b = (endless_held(DataLoader(data, batch_size=64)), model_b, optimizer_for(model_b), loss_b)
    phase(200, a, b)  # warm-up
    noise = phase(steps, a, b)[0]
    with recording_calls([b]):
        return noise, phase(steps, a, b)[0]


def one_round(name: str, source: str, steps: int, watched_first: bool) -> tuple[float, float, float]:
    """(noise, watched, bare seconds/step) for a fresh pair of identical models fed the same batches."""
    model_a, data = make(name)
    model_b = copy.deepcopy(model_a)
    if source == "dataloader":
        loader_a, loader_b = DataLoader(data, batch_size=64), DataLoader(data, batch_size=64)
    else:
        loader_a = [(data.tensors[0][i:i + 64], data.tensors[1][i:i + 64]) for i in range(0, len(data), 64)]
        loader_b = list(loader_a)
    a = (endless(loader_a), model_a, optimizer_for(model_a), nn.CrossEntropyLoss())
    optimizer_b, loss_b = optimizer_for(model_b), nn.CrossEntropyLoss()
    b_bare = (endless(loader_b), model_b, optimizer_b, loss_b)
    b_watched = (endless_tracked(loader_b), model_b, optimizer_b, loss_b)

    def watched() -> float:
        with triage.watch(model=model_b, optimizer=optimizer_b, loss_fn=loss_b):
            return phase(steps, a, b_watched)[0]

    phase(200, a, b_bare)  # warm-up
    if watched_first:
        with_triage = watched()
        noise, step = phase(steps, a, b_bare)
    else:
        noise, step = phase(steps, a, b_bare)
        with_triage = watched()
    return noise, with_triage, step


def time_inside(name: str, steps: int) -> tuple[float, float, float]:
    """(µs per step spent in triage's per-step code, of which µs in the training-health checks, bare step µs):
    the step hook, track()'s batch record, and the health monitor's work around backward() (which the runner
    installs; it is global, so it cannot be paired per step like watch+track)."""
    from triage import health, wrapper
    from triage.tracking import TRACKER, Tracker

    spent, in_health = [0], [0]
    originals = (wrapper.NonFiniteMonitor.step_hook, Tracker.on_batch)

    def timed(function, counter):
        def inner(*args, **kwargs):
            started = time.perf_counter_ns()
            try:
                return function(*args, **kwargs)
            finally:
                counter[0] += time.perf_counter_ns() - started
        return inner

    wrapper.NonFiniteMonitor.step_hook = lambda self, params, tracker: timed(originals[0](self, params, tracker), spent)
    Tracker.on_batch = timed(originals[1], spent)
    # The health hook wraps torch.autograd.backward: its cost is the hooked call's time minus the real backward's.
    real_backward = torch.autograd.backward
    in_real = [0]
    torch.autograd.backward = timed(real_backward, in_real)
    monitor = health.HealthMonitor(TRACKER)
    undo = monitor.install()
    torch.autograd.backward = timed(torch.autograd.backward, in_health)
    try:
        model, data = make(name)
        optimizer, loss_fn = optimizer_for(model), nn.CrossEntropyLoss()
        batches = endless_tracked(DataLoader(data, batch_size=64))
        times = []
        with triage.watch(model=model, optimizer=optimizer, loss_fn=loss_fn):
            for i in range(steps + 50):
                if i == 50:
                    spent[0] = in_health[0] = in_real[0] = 0
                times.append(timed_step(batches, model, optimizer, loss_fn))
    finally:
        torch.autograd.backward = real_backward
        undo()
        wrapper.NonFiniteMonitor.step_hook, Tracker.on_batch = originals
    health_ns = in_health[0] - in_real[0]
    return (spent[0] + health_ns) / steps / 1000, health_ns / steps / 1000, statistics.median(times[50:]) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000, help="paired steps per phase on the MLP (CNN: a quarter)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls-only", action="store_true",
                        help="only the runner's recorder of outermost module calls, paired per step like watch+track")
    parser.add_argument("--inside-only", action="store_true",
                        help="only the µs spent inside triage's per-step code (hooks, track(), health checks)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"small CPU training loops, batch 64, SGD+momentum, CrossEntropyLoss; torch {torch.__version__}, "
          f"{args.threads} thread(s); step times are this thread's CPU time; {args.rounds} rounds")
    for name in MODELS:
        steps = args.steps if name.startswith("MLP") else max(args.steps // 4, 200)
        if not args.inside_only:
            rounds = [calls_round(name, steps) for _ in range(args.rounds)]
            costs = [recorded - noise for noise, recorded in rounds]
            print(f"{name}, dataloader: the runner's call recorder overhead {100 * statistics.median(costs):+.2f}% "
                  f"(median of rounds {', '.join(f'{100 * c:+.2f}%' for c in costs)}; {steps} paired steps each; "
                  f"the pairing alone: {', '.join(f'{100 * r[0]:+.2f}%' for r in rounds)})")
        if args.calls_only:
            continue
        for source in () if args.inside_only else ("dataloader", "list of batches"):
            kind = "dataloader" if source == "dataloader" else "list"
            rounds = [one_round(name, kind, steps, watched_first=bool(r % 2)) for r in range(args.rounds)]
            costs = [watched - noise for noise, watched, _ in rounds]
            print(f"{name}, {source}: bare {statistics.median(r[2] for r in rounds) * 1e6:.0f} µs/step; "
                  f"watch+track overhead {100 * statistics.median(costs):+.2f}% (median of rounds "
                  f"{', '.join(f'{100 * c:+.2f}%' for c in costs)}; {steps} paired steps each; "
                  f"the pairing alone, both loops bare: {', '.join(f'{100 * r[0]:+.2f}%' for r in rounds)})")
        inside, health_us, step_us = time_inside(name, steps)
        print(f"{name}, dataloader: {inside:.1f} µs per step inside triage's hooks and track() (wall clock, "
              f"timers included) = {100 * inside / step_us:.2f}% of a {step_us:.0f} µs step; of it the "
              f"training-health checks: {health_us:.1f} µs = {100 * health_us / step_us:.2f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
