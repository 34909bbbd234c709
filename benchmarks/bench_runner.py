"""Runner benchmarks: wall-time cost of `python -m triage` on a succeeding script, and time to a report.

    python benchmarks/bench_runner.py [--runs N] [--device cuda] [--overhead-only]

1. Overhead: a small CPU training run of a few seconds (DataLoader, optimizer
   steps, so the progress hooks fire on every batch) under plain python and under
   triage, interleaved; prints the median wall times and their ratio (target: at
   most 1.05).
2. Time to report: a script that trains a few steps and then raises; the script
   writes the wall-clock time of the raise, and the time to the process's exit
   is measured under both (triage: traceback + capture + diagnosis + report
   folder + summary; target: under 1 s more than plain python). Also printed: the
   stage timings from report.json, and the same for a segfault, which the parent
   reports.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

TRAINING = """\
import time
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread: steadier timings on a shared 2-core machine
x = torch.randn(8192, 64)
y = (x[:, :8].sum(dim=1) > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2)).to("DEVICE")
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
steps = 0
for epoch in range(EPOCHS):
    for features, labels in loader:
        features, labels = features.to("DEVICE"), labels.to("DEVICE")
        loss = torch.nn.functional.cross_entropy(model(features), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
print(f"{steps} steps, final loss {loss.item():.4f}")
"""

FAILING = """\
import sys, time
import torch
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.Linear(100, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
images = torch.randn(16, 3, 12, 12)
with open(sys.argv[1], "w") as handle:
    handle.write(repr(time.time()))
logits = model(images)   # 8*10*10 = 800 features reach a Linear(100, 10)
"""

SEGFAULT = """\
import sys, time, ctypes
import torch
with open(sys.argv[1], "w") as handle:
    handle.write(repr(time.time()))
ctypes.string_at(0)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("TRIAGE_DEBUG", None)
    return env


def _timed(command: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=_env(), check=False)
    return time.perf_counter() - started, result


def _cpu_timed(command: list[str], cwd: Path) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall seconds and CPU seconds (user + system, the process and its children) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds, result = _timed(command, cwd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), result


def overhead(folder: Path, runs: int, epochs: int, device: str = "cpu") -> None:
    script = folder / "train.py"
    script.write_text(TRAINING.replace("EPOCHS", str(epochs)).replace("DEVICE", device))
    plain_times, triage_times, plain_cpu, triage_cpu = [], [], [], []
    _timed([sys.executable, str(script)], folder)  # warm the page cache
    for _ in range(runs):
        seconds, cpu, plain = _cpu_timed([sys.executable, str(script)], folder)
        plain_times.append(seconds)
        plain_cpu.append(cpu)
        seconds, cpu, triaged = _cpu_timed([sys.executable, "-m", "triage", str(script)], folder)
        triage_times.append(seconds)
        triage_cpu.append(cpu)
        assert plain.returncode == triaged.returncode == 0, triaged.stderr
        assert plain.stdout == triaged.stdout, f"stdout differs:\n{plain.stdout}\n--- under triage:\n{triaged.stdout}"
        assert plain.stderr == triaged.stderr, f"stderr differs:\n{plain.stderr}\n--- under triage:\n{triaged.stderr}"
    plain_median, triage_median = statistics.median(plain_times), statistics.median(triage_times)
    print(f"succeeding script on {device} ({plain.stdout.strip()}), {runs} runs each, interleaved:")
    print(f"  plain python     median {plain_median:.3f} s wall, {statistics.median(plain_cpu):.3f} s CPU"
          f"  (runs: {', '.join(f'{t:.2f}' for t in plain_times)})")
    print(f"  python -m triage median {triage_median:.3f} s wall, {statistics.median(triage_cpu):.3f} s CPU"
          f"  (runs: {', '.join(f'{t:.2f}' for t in triage_times)})")
    print(f"  ratio triage/plain: {triage_median / plain_median:.3f} wall (target <= 1.05), "
          f"{statistics.median(triage_cpu) / statistics.median(plain_cpu):.3f} CPU")
    start = [sys.executable, "-c", "pass"]
    python_start = statistics.median(_timed(start, folder)[0] for _ in range(5))
    print(f"  (for scale: starting an empty python takes {python_start:.3f} s here)")


def time_to_report(folder: Path, runs: int) -> None:
    # Reports and markers go outside the working folder: the rule cache's key includes its modification time.
    elsewhere = Path(tempfile.mkdtemp(prefix="bench-runner-out-"))
    for name, source, code in (("shape error", FAILING, 1), ("segfault", SEGFAULT, -11)):
        script = folder / f"{name.replace(' ', '_')}.py"
        script.write_text(source)
        marker = elsewhere / "raised_at"
        plain_after, triage_after, stages = [], [], []
        for run in range(runs):
            _, plain = _timed([sys.executable, str(script), str(marker)], folder)
            plain_after.append(time.time() - float(marker.read_text()))
            out = elsewhere / f"report-{name}-{run}"
            _, triaged = _timed([sys.executable, "-m", "triage", "--report-dir", str(out), str(script), str(marker)], folder)
            triage_after.append(time.time() - float(marker.read_text()))
            assert plain.returncode == triaged.returncode == code, triaged.stderr
            stages.append(json.loads((out / "report.json").read_text()).get("timings", {}))
        extra = statistics.median(triage_after) - statistics.median(plain_after)
        print(f"{name}: from the failure to the end of the process (median of {runs}; the first run loads the rules"
              " without the cache):")
        print(f"  plain python {statistics.median(plain_after):.3f} s, python -m triage {statistics.median(triage_after):.3f} s"
              f"  -> capture + report add {extra:.3f} s  (target < 1 s)")
        keys = sorted({key for stage in stages for key in stage})
        print("  stages (median): " + ", ".join(f"{key} {statistics.median(s.get(key, 0.0) for s in stages):.3f} s" for key in keys))
        print("  first run: " + ", ".join(f"{key} {stages[0].get(key, 0.0):.3f} s" for key in keys)
              + f"; {triage_after[0] - plain_after[0]:.3f} s added")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3, help="epochs of the succeeding script (sets its length)")
    parser.add_argument("--device", default="cpu", help="where the succeeding script trains (cuda: the GPU path's flags)")
    parser.add_argument("--overhead-only", action="store_true", help="skip the time-to-report runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-runner-") as tmp:
        folder = Path(tmp)
        overhead(folder, args.runs, args.epochs, args.device)
        if not args.overhead_only:
            print()
            time_to_report(folder, max(3, args.runs // 2 + 1))


if __name__ == "__main__":
    main()
