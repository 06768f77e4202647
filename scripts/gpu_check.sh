#!/usr/bin/env bash
# One call on the GPU machine (docs/testing.md): GPU tests, compute-sanitizer memcheck and
# racecheck on a small sample, and the kernel benchmark. Run from the repository root with a
# build folder that holds tests/kernels/cuda/gpu_tests and bench/kernels/bench_kernels (built
# elsewhere, carried along). Logs go to $OUT (default /tmp/mlafuzz-gpu-check).
#
#   scripts/gpu_check.sh [BUILD_DIR] [all|tests|sanitize|bench]...
set -u
BUILD=${1:-build-dev}
shift || true
STEPS=${*:-all}
OUT=${OUT:-/tmp/mlafuzz-gpu-check}
mkdir -p "$OUT"
export MLAFUZZ_CORPUS_DIR=${MLAFUZZ_CORPUS_DIR:-$PWD/corpus/cases}
TESTS=$BUILD/tests/kernels/cuda/gpu_tests
BENCH=$BUILD/bench/kernels/bench_kernels
want() { [[ " $STEPS " == *" all "* || " $STEPS " == *" $1 "* ]]; }
summary=()

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
  --format=csv >"$OUT/nvidia-smi.txt" 2>&1
cat "$OUT/nvidia-smi.txt"

# Tests and sanitizers run side by side (the random-recipe tests spend most of their time in
# the CPU oracle and host models); the benchmark runs alone afterwards.
pids=()
if want tests; then
  echo "=== gpu_tests (6 processes)"
  i=0
  for f in '*/cuda_simt' '*/cuda_mma' '*/cuda_mma_h64' '*/cuda_mma_small' '*/cuda_mma_split*' \
    '-Backends/*'; do
    timeout 200 "$TESTS" --gtest_brief=1 "--gtest_filter=$f" >"$OUT/gpu_tests.$i.part" 2>&1 &
    pids+=("$!:gpu_tests[$f]")
    i=$((i + 1))
  done
fi
if want sanitize; then
  for tool in memcheck racecheck; do
    if [[ $tool == memcheck ]]; then
      filter='*RandomRecipes*:*Poison*:*OutsideTheEnvelope*:GpuFormats.*'
      n=6
    else
      filter='*CudaKernel.RandomRecipes*:*CudaKernel.Poison*'
      n=3
    fi
    # Exact device allocations: memcheck then sees a read one byte past any buffer.
    MLAFUZZ_CUDA_EXACT_ALLOC=1 MLAFUZZ_GPU_CASES=$n timeout 200 compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$TESTS" --gtest_brief=1 "--gtest_filter=$filter" >"$OUT/$tool.log" 2>&1 &
    pids+=("$!:$tool")
  done
fi
for pt in "${pids[@]}"; do
  wait "${pt%%:*}"
  summary+=("${pt#*:} rc=$?")
done
if want tests; then
  cat "$OUT"/gpu_tests.*.part >"$OUT/gpu_tests.log" && rm -f "$OUT"/gpu_tests.*.part
  grep -E '^\[(tightness|seed|corpus|original)\]|^  (out|lse)|FAILED|Failure|PASSED|SKIPPED|tests ran' \
    "$OUT/gpu_tests.log" | head -90
fi
if want sanitize; then
  grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|tests ran|PASSED|FAILED' "$OUT/memcheck.log" \
    "$OUT/racecheck.log" | head -20
fi

if want profile; then
  echo "=== ncu (B=32 topk=512, second launch of each kernel)"
  timeout 200 ncu --clock-control none --launch-skip 0 --launch-count 6 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    "$BENCH" --profile >"$OUT/ncu.log" 2>&1
  rc=$?
  grep -E 'simt_per_head|mma_head_tiled|Duration|Registers|Achieved Occupancy|Stall|Issued Ipc|Compute \(SM\) Throughput|Memory Throughput|One or More|No Eligible|stalled|issue_stalled|Active Warps|Eligible Warps|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit|Shared Memory' \
    "$OUT/ncu.log" | head -120
  summary+=("ncu rc=$rc")
fi

if want bench; then
  echo "=== bench_kernels"
  timeout 150 "$BENCH" --markdown "$OUT/bench.md" >"$OUT/bench.log" 2>&1
  rc=$?
  cat "$OUT/bench.log"
  summary+=("bench rc=$rc")
fi

echo "=== summary: ${summary[*]}"
