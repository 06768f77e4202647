#!/bin/bash
# The python: bridge on the GPU machine: the PyTorch example kernel
# (examples/python/torch_decode.py) through every property, a 5-minute campaign, and the
# bridge's per-call cost with a torch kernel that returns at once; plus the CPU pytest suite.
# Logs go to $OUT (default ./gpu_python_out). Needs python3 with torch (CUDA), numpy, pytest.
# Usage (source root): scripts/gpu_python.sh [BUILD_DIR] [check|campaign|all]
#   check: versions, plugin-info, run, every property on 400 cases, bridge costs, pytest
#   campaign: the 5-minute campaign alone (each part fits in a 10-minute command)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
PART=${2:-all}
OUT=${OUT:-$PWD/gpu_python_out}
mkdir -p "$OUT"
export MLAFUZZ_PYTHON=${MLAFUZZ_PYTHON:-$(command -v python3)}
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
KERNEL=python:examples/python/torch_decode.py:decode
status=0
step() {  # step NAME COMMAND...: runs, logs to $OUT/NAME.log, records the exit code
  local name=$1
  shift
  echo "== $name: $*" | tee -a "$OUT/summary.txt"
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "   exit $rc" | tee -a "$OUT/summary.txt"
  tail -5 "$OUT/$name.log" | sed 's/^/   | /' | tee -a "$OUT/summary.txt"
  return $rc
}
if [ ! -x "$BUILD/mlafuzz" ] || [ ! -x "$BUILD/bench/python/bench_python_bridge" ]; then
  step build scripts/build.sh "$BUILD" || exit 1
fi
step versions "$MLAFUZZ_PYTHON" -c \
  "import sys, numpy, torch; print(sys.version, numpy.__version__, torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))" ||
  exit 1
if [ "$PART" != campaign ]; then
step plugin_info "$BUILD/mlafuzz" plugin-info "$KERNEL" || status=1
step run_small "$BUILD/mlafuzz" run --case tests/plugins/data/small_case.json --backends "$KERNEL" ||
  status=1
# Every property on 400 generated cases (fixed seed), findings shrunk and saved.
step every_property "$BUILD/mlafuzz" fuzz --backends "$KERNEL" --cases 400 --seed 21 \
  --jobs 8 --corpus "$OUT/corpus-properties" --report "$OUT/report-properties" --progress plain ||
  status=1
# Bridge cost: torch no-op kernel, then the numpy one for comparison on this host.
step bridge_torch "$BUILD/bench/python/bench_python_bridge" \
  python:examples/python/torch_decode.py:decode_noop 50 || status=1
step bridge_numpy "$BUILD/bench/python/bench_python_bridge" \
  python:examples/python/numpy_decode.py:decode_noop 50 || status=1
step campaign_bench bench/python/campaign.sh "$BUILD" 300 || status=1
step pytest_cpu env MLAFUZZ_BIN="$BUILD/mlafuzz" "$MLAFUZZ_PYTHON" -m pytest -q \
  -p no:cacheprovider tests/python || status=1
fi
if [ "$PART" != check ]; then
  # The 5-minute campaign, every property, default profile.
  step campaign_5m "$BUILD/mlafuzz" fuzz --backends "$KERNEL" --time 5m --seed 22 --jobs 8 \
    --corpus "$OUT/corpus-5m" --report "$OUT/report-5m" --progress plain || status=1
fi
echo "logs in $OUT (summary.txt first); exit $status" | tee -a "$OUT/summary.txt"
exit $status
