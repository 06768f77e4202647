#!/bin/bash
# triton-simt and triton-mma on the GPU machine in one device call: the corpus through
# `mlafuzz run` (each against the oracle, triton-mma vs triton-simt), a short campaign with every
# property, and the kernel timing. Run from the root of a checkout, with CARRY a folder laid out
# as an install tree (bin/mlafuzz, share/mlafuzz/{python,triton}) plus bench_triton.py:
#   CARRY=build-triton-carry OUT=/tmp/out bash scripts/gpu_triton.sh
# Every step has its own time limit, so what ran is always written under $OUT.
set -u
C=${CARRY:-build-triton-carry}
M=$C/bin/mlafuzz
L=${OUT:-/tmp/triton-out}
mkdir -p "$L"
export MLAFUZZ_PYTHON=${MLAFUZZ_PYTHON:-python3}
{
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
} > "$L/versions.txt" 2>&1
"$M" list-backends > "$L/list_backends.txt" 2>&1
t0=$(date +%s)
timeout 60 "$M" run --case corpus/cases/model1_b4_topk512.json --backends triton-mma,triton-simt \
  > "$L/run_first.txt" 2>&1
echo "first run exit $? in $(( $(date +%s) - t0 )) s" >> "$L/steps.txt"
t0=$(date +%s)
ls corpus/cases/*.json corpus/regression/*.json | timeout 70 xargs -P 6 -I{} sh -c \
  'n=$(basename {} .json); timeout 60 '"$M"' run --case {} --backends triton-mma,triton-simt > '"$L"'/run_$n.txt 2>&1; echo "$n exit $?"' \
  > "$L/corpus_summary.txt" 2>&1
echo "corpus exit $? in $(( $(date +%s) - t0 )) s" >> "$L/steps.txt"
t0=$(date +%s)
timeout 115 "$M" fuzz --backends triton-mma,triton-simt --time 90s --seed 21 \
  --corpus "$L/fuzz_corpus" --report "$L/fuzz_report" --progress plain > "$L/fuzz.txt" 2>&1
echo "fuzz exit $? in $(( $(date +%s) - t0 )) s" >> "$L/steps.txt"
t0=$(date +%s)
# The installed kernels (the package folder share/mlafuzz/triton), loaded as the worker loads them.
PYTHONPATH=$C/share/mlafuzz/python MLAFUZZ_TRITON_DIR=$C/share/mlafuzz/triton timeout 45 \
  python3 "$C/bench_triton.py" > "$L/bench.txt" 2>&1
echo "bench exit $? in $(( $(date +%s) - t0 )) s" >> "$L/steps.txt"
cat "$L/steps.txt"
