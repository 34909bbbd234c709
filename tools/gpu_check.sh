#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: measure the runner's overhead on a small GPU training loop, run triage on the
# corpus scripts that fail only there (and the NaN script that must be caught there too), and keep every report
# (each run's stderr goes to a file, as a job's log does). Usage: tools/gpu_check.sh [OUT_DIR]
# Writes OUT_DIR/gpu.log (each run's output and status) and OUT_DIR/reports.tgz (reports and JSON).
set -u
out=${1:-${OUT:-/tmp/gpu-check}}
work=$(mktemp -d)
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRIAGE_DEBUG=1
log=$out/gpu.log
{
  nvidia-smi -L
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_device_name(0))"
} >"$log" 2>&1
# What the per-step hooks and the GPU flags cost a small GPU training loop (its runs must print what plain python does).
python3 benchmarks/bench_runner.py --device cuda --runs "${GPU_CHECK_BENCH_RUNS:-3}" --epochs 12 --overhead-only >>"$log" 2>&1
for script in corpus/scripts/gpu/*.py corpus/scripts/positional_buffer_on_cpu.py; do
  name=$(basename "$script" .py)
  started=$(date +%s%N)
  (cd "$(dirname "$script")" && timeout 150 python3 -m triage --report-dir "$work/$name" --json "$work/$name.json" "$(basename "$script")") >"$work/$name.out" 2>&1
  code=$?
  echo "== $name: exit $code, $(( ($(date +%s%N) - started) / 1000000 )) ms" >>"$log"
  cat "$work/$name.out" >>"$log"
done
tar czf "$out/reports.tgz" -C "$work" .
echo "== done" >>"$log"
