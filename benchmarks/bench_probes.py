"""How long each probe takes on a small real failure of its kind (CPU), through the probe runner; and the peak
memory of a script whose failing batch is 1 GiB, under triage against plain python (target: at most 1.5x).

    python benchmarks/bench_probes.py            # both
    python benchmarks/bench_probes.py --memory   # the memory figure only

Each case is a real failure on the CPU (a device-side assert is simulated by its
message, with the bug in the data), as in the tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from triage.diagnosis import Diagnosis  # noqa: E402
from triage.incident import ExceptionInfo, Incident  # noqa: E402
from triage.probes.context import ProbeContext  # noqa: E402
from triage.probes.runner import context_from_failure, run_probes  # noqa: E402
from triage.tracking import Tracker  # noqa: E402
from triage.wrapper import incident_from_exception  # noqa: E402

CUDA_ASSERT = ("CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously reported at some "
               "other API call, so the stacktrace below might be incorrect.")
OOM = ("CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a total capacity of 23.65 GiB of which 11.06 MiB "
       "is free. Of the allocated memory 22.90 GiB is allocated by PyTorch, and 194.87 MiB is reserved by PyTorch "
       "but unallocated.")


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2, self.conv3 = nn.Conv2d(3, 16, 3), nn.Conv2d(16, 32, 3), nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(256, 10)

    def forward(self, x):
        return self.fc1(self.conv3(F.relu(self.conv2(F.relu(self.conv1(x))))).flatten(1))


class TextModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(10, 8), nn.Linear(8, 3)

    def forward(self, ids):
        return self.head(self.embed(ids).mean(1))


class LogNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 1)

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(torch.log(h - h.max()))


class Inplace(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.out = nn.Linear(4, 8), nn.Linear(8, 1)

    def forward(self, x):
        y = torch.sigmoid(self.fc(x))
        y += 1
        return self.out(y)


class Labels(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        return {i: i for i in range(64) if i != 37}[index]


def failure(fn, *args):
    try:
        fn(*args)
    except Exception as exc:
        return exc
    raise AssertionError("no failure")


def cases(report_dir: Path):
    conv, images = ConvNet(), torch.randn(8, 3, 10, 10)
    exc = failure(conv, images)
    yield "shape: 10x10 images into a net built for 8x8", "shape", ["shape_trace", "cpu_rerun", "save_batch"], \
        context_from_failure(incident_from_exception(exc), exc, report_dir,
                             Tracker(model=conv, batch=(images, torch.zeros(8, dtype=torch.long)), batch_index=3))

    text, ids = TextModel(), torch.tensor([[1, 2, 3], [4, 12, 5]])
    info = ExceptionInfo("RuntimeError", CUDA_ASSERT)
    yield "cuda-assert (simulated): token 12 in a 10-row embedding", "cuda-assert", ["cpu_rerun", "index_range"], \
        ProbeContext(incident=Incident(source="run", exception=info, exceptions=[info]),
                     exception=RuntimeError(CUDA_ASSERT), model=text, batch=(ids, torch.tensor([0, 1])),
                     loss_fn=nn.CrossEntropyLoss(), model_args=(torch.empty(2, 3, dtype=torch.long, device="meta"),))

    seq = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)).to("meta")
    exc = failure(seq, torch.randn(3, 4))
    yield "device: CPU input into a meta model", "device", ["device_census"], \
        context_from_failure(incident_from_exception(exc), exc, None, Tracker())
    seq = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    exc = failure(seq, torch.randn(3, 4, dtype=torch.float64))
    yield "dtype: Double input into Float weights", "dtype", ["dtype_census"], \
        context_from_failure(incident_from_exception(exc), exc, None, Tracker())

    log_net = LogNet()
    yield "nan: log of a negative", "nan", ["anomaly_rerun"], \
        ProbeContext(incident=Incident(kind="nan", source="run"), model=log_net, loss_fn=nn.MSELoss(),
                     batch=(torch.randn(4, 4), torch.randn(4, 1)))
    net = Inplace()
    x, y = torch.randn(2, 4), torch.randn(2, 1)
    exc = failure(lambda: nn.MSELoss()(net(x), y).backward())
    yield "inplace: y += 1 after sigmoid", "inplace", ["anomaly_rerun"], \
        context_from_failure(incident_from_exception(exc), exc, None,
                             Tracker(model=net, loss_fn=nn.MSELoss(), batch=(x, y)))

    loader = DataLoader(Labels(), batch_size=8, num_workers=2)
    tracker = Tracker()
    exc = failure(lambda: [tracker.on_batch(b, loader) for b in loader])
    yield "dataloader: KeyError for index 37 in a worker", "dataloader", ["workers0_rerun"], \
        context_from_failure(incident_from_exception(exc), exc, None, tracker)

    mlp = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 10))
    info = ExceptionInfo("torch.OutOfMemoryError", OOM)
    yield "oom: 22 MiB requested, 11 MiB free (public log text)", "oom", ["memory_breakdown"], \
        ProbeContext(incident=Incident(source="run", exception=info, exceptions=[info]), model=mlp,
                     optimizer=torch.optim.Adam(mlp.parameters()), batch=(torch.randn(32, 64),))


# A script whose failing batch is 1 GiB of float32 (262144 rows of 1024 features) into a Linear layer built for
# 1000 features: every probe of the shape diagnosis runs on it.
BIG_BATCH_SCRIPT = """
import torch
from torch import nn

x = torch.randn(262144, 1024)
nn.Sequential(nn.Linear(1000, 10))(x)
"""


def _tree(root: int) -> list[int]:
    """root and its descendants, from /proc/<pid>/task/*/children."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                    todo += [int(child) for child in f.read().split()]
        except OSError:
            continue
    return found


def _pss(pid: int) -> int:
    """Proportional set size: pages shared by fork (copy-on-write) are counted once across the processes."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0


def peak_memory(command: list[str], cwd: str) -> tuple[int, int]:
    """(peak of the summed PSS of the process tree, sampled every 10 ms; the exit status)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while process.poll() is None:
        peak = max(peak, sum(_pss(pid) for pid in _tree(process.pid)))
        time.sleep(0.01)
    return peak, process.returncode


def memory() -> None:
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "big_batch.py"
        script.write_text(textwrap.dedent(BIG_BATCH_SCRIPT))
        python, python_status = peak_memory([sys.executable, str(script)], folder)
        triaged, triage_status = peak_memory([sys.executable, "-m", "triage", "--report-dir", f"{folder}/report",
                                              str(script)], folder)
        print(f"\n1 GiB failing batch, peak memory (PSS of the process tree): python {python / 1024**3:.2f} GiB "
              f"(exit {python_status}), triage {triaged / 1024**3:.2f} GiB (exit {triage_status}): "
              f"{triaged / python:.2f}x (target <= 1.5x)")
        report = Path(folder, "report", "report.md")
        if report.exists():
            for line in report.read_text().splitlines():
                if "Experiment" in line or "experiment" in line[:40]:
                    print("  " + line.strip()[:160])


def main() -> int:
    if "--memory" in sys.argv:
        memory()
        return 0
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread; seconds per probe as the runner timed it")
    with tempfile.TemporaryDirectory() as folder:
        for title, category, probes, ctx in cases(Path(folder)):
            diagnosis = Diagnosis(f"{category}.bench", category, 0.9, title, "", "", probe_names=probes)
            started = time.perf_counter()
            run_probes([diagnosis], ctx)
            print(f"\n{title} ({time.perf_counter() - started:.2f} s)")
            for outcome in diagnosis.probes:
                print(f"  {outcome.name:16s} {outcome.status:10s} {outcome.seconds:6.3f} s  {outcome.detail[:150]}")
    memory()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
