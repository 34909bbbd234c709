"""Explain-path speed, as ratios against baselines measured in the same run.

1. Cold start on a small log vs `python -c "import yaml, jinja2, regex, rich"` (target: <= 2x).
2. A 200 MB training log with the traceback at the end vs `grep -c Traceback` (target: <= 20x),
   with peak memory against the file size.

Run: python benchmarks/bench_explain.py [--size-mb 200] [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMALL_LOG = ROOT / "tests" / "fixtures" / "ipython8.log"
PEAK_WRAPPER = (
    "import re, runpy, sys; sys.argv = sys.argv[1:]\n"
    "try:\n    runpy.run_module('triage', run_name='__main__')\n"
    "except SystemExit:\n    pass\n"
    "sys.stderr.write('VmHWM=' + re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
)


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
    return time.perf_counter() - started


def interleaved(commands: dict[str, list[str]], repeat: int, env: dict[str, str]) -> dict[str, float]:
    """Median wall time of each command, runs interleaved so machine noise hits all alike."""
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for name, command in commands.items():
        timed(command, env)  # warm the page cache and .pyc files
    for _ in range(repeat):
        for name, command in commands.items():
            samples[name].append(timed(command, env))
    return {name: statistics.median(values) for name, values in samples.items()}


def make_training_log(path: Path, size_mb: int) -> None:
    noise = b"".join(
        b"\x1b[32mINFO\x1b[0m 2024-05-02 10:14:%02d epoch 3 step %6d | loss 0.41%02d | lr 3.0e-04 | 812 samples/s\n"
        % (n % 60, n, n % 100)
        for n in range(20000)
    )
    with open(path, "wb") as handle:
        for _ in range(size_mb * 1024 * 1024 // len(noise)):
            handle.write(noise)
        handle.write(SMALL_LOG.read_bytes())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    python = sys.executable

    print("cold start (median of %d, interleaved)" % args.repeat)
    cold = interleaved(
        {
            "import yaml, jinja2, regex, rich": [python, "-c", "import yaml, jinja2, regex, rich"],
            "triage explain small.log": [python, "-m", "triage", "explain", str(SMALL_LOG)],
        },
        args.repeat,
        env,
    )
    base, ours = cold.values()
    for name, seconds in cold.items():
        print(f"  {name:<36} {seconds * 1000:8.1f} ms")
    print(f"  ratio: {ours / base:.2f}x (target <= 2x)")

    grep = shutil.which("grep")
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "train.log"
        make_training_log(big, args.size_mb)
        size = big.stat().st_size
        print(f"\n{size / 2**20:.0f} MB log, traceback at the end (median of {max(3, args.repeat // 2)}, interleaved)")
        large = interleaved(
            {
                "grep -c Traceback": [grep, "-c", "Traceback", str(big)],
                "triage explain": [python, "-m", "triage", "explain", str(big)],
            },
            max(3, args.repeat // 2),
            env,
        )
        base, ours = large.values()
        for name, seconds in large.items():
            print(f"  {name:<36} {seconds * 1000:8.1f} ms")
        print(f"  ratio: {ours / base:.2f}x (target <= 20x)")
        done = subprocess.run([python, "-c", PEAK_WRAPPER, "triage", "explain", str(big)], capture_output=True, env=env)
        peak_kib = int(re.search(rb"VmHWM=(\d+)", done.stderr).group(1))
        print(f"  peak memory: {peak_kib / 1024:.0f} MB for a {size / 2**20:.0f} MB file ({peak_kib * 1024 / size:.2f}x the file size)")
        leading = subprocess.run([python, "-m", "triage", "explain", "--format", "json", str(big)], capture_output=True, env=env)
        found = re.search(rb'"rule": "([^"]+)"', leading.stdout)
        print(f"  leading diagnosis: {found.group(1).decode() if found else 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
