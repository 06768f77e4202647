#!/bin/bash
# A campaign on a Python kernel against the same campaign on the C example plugin
# (bench/RESULTS.md, "Python bridge"): same seed, cases, one thread, no shrinking. Twice: with
# the real kernels (numpy fp32 vs examples/cpu_plugin), and with kernels that only write zeros
# (numpy_decode.py:decode_zeros vs tests/plugins' faulty_zeros), which takes the kernels' own
# time out and leaves the harness plus the bridge.
# Usage (source root): bench/python/campaign.sh [BUILD_DIR] [CASES]
set -euo pipefail
BUILD=${1:-build}
CASES=${2:-200}
OUT=$(mktemp -d) && trap 'rm -rf "$OUT"' EXIT
run() {  # run LABEL BACKEND
  "$BUILD/mlafuzz" fuzz --backends "$2" --cases "$CASES" --jobs 1 --seed 21 --shrink-time 0 \
    --corpus "$OUT/corpus-$1" --report "$OUT/$1" --progress plain > "$OUT/$1.log" 2>&1 ||
    [ $? -eq 1 ]
  python3 - "$OUT/$1/report.json" "$1" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["campaign"]
print(f"{sys.argv[2]:>14}: {c['cases']} cases in {c['duration_s']:.2f} s = {c['cases_per_s']:.2f} cases/s")
PY
}
run numpy "python:examples/python/numpy_decode.py:decode"
run c-plugin "plugin:$BUILD/examples/libmlafuzz_cpu_plugin.so"
run numpy-zeros "python:examples/python/numpy_decode.py:decode_zeros"
run c-zeros "plugin:$BUILD/tests/plugins/faulty/libfaulty_zeros.so"
