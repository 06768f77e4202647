#!/bin/bash
# Issue 13's measurement on one GPU, in one go: the same binary with batching and residency off
# (the per-call path: one request per call, every input uploaded from pageable memory) and on,
# default and production profiles, 1/2/4 workers per GPU, every property, seed 21, and the host
# models for comparison; "proto1" lines turn worker protocol 2 off (inputs copied into the bulk
# area, replies widened in the worker: the second round's path). README "GPU campaign
# throughput" quotes its output.
#
#   bench/campaign/gpu_before_after.sh MLAFUZZ SECONDS
# Logs and reports go under $OUT (default a temp folder); the table is printed.
set -uo pipefail
MLAFUZZ=$1
S=${2:-20}
HERE=$(cd "$(dirname "$0")" && pwd)
OFF=MLAFUZZ_WORKER_BATCH=0,MLAFUZZ_CUDA_RESIDENT=0
P1=MLAFUZZ_WORKER_ARENA=0,MLAFUZZ_WORKER_RAW_OUTPUTS=0
B=cuda-mma,cuda-simt
"$HERE/gpu_throughput.sh" "$MLAFUZZ" "$S" \
  "before-def-2:$B:all:default:2:$OFF" \
  "after-def-1:$B:all:default:1" \
  "after-def-2:$B:all:default:2" \
  "proto1-def-2:$B:all:default:2:$P1" \
  "after-def-4:$B:all:default:4" \
  "batch-only-def-2:$B:all:default:2:MLAFUZZ_CUDA_RESIDENT=0" \
  "resident-only-def-2:$B:all:default:2:MLAFUZZ_WORKER_BATCH=0" \
  "before-prod-2:$B:all:production:2:$OFF" \
  "after-prod-2:$B:all:production:2" \
  "proto1-prod-2:$B:all:production:2:$P1" \
  "after-prod-4:$B:all:production:4" \
  "host-def:cpu-mma,cpu-simt:all:default:-"
