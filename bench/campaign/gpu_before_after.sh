#!/bin/bash
# GPU campaign throughput on one GPU, in one go: the CUDA backends with input residency off
# (MLAFUZZ_CUDA_RESIDENT=0: every input uploaded from pageable memory) and on, default and
# production profiles, 1/2/4 workers per GPU, every property, seed 21, and the host models for
# comparison. The earlier paths this script once compared (one request per call, worker
# protocol 1) are gone from mlafuzz; their numbers stay in bench/results/.
#
#   bench/campaign/gpu_before_after.sh MLAFUZZ SECONDS
# Logs and reports go under $OUT (default a temp folder); the table is printed.
set -uo pipefail
MLAFUZZ=$1
S=${2:-20}
HERE=$(cd "$(dirname "$0")" && pwd)
B=cuda-mma,cuda-simt
"$HERE/gpu_throughput.sh" "$MLAFUZZ" "$S" \
  "after-def-1:$B:all:default:1" \
  "after-def-2:$B:all:default:2" \
  "after-def-4:$B:all:default:4" \
  "not-resident-def-2:$B:all:default:2:MLAFUZZ_CUDA_RESIDENT=0" \
  "after-prod-2:$B:all:production:2" \
  "after-prod-4:$B:all:production:4" \
  "host-def:cpu-mma,cpu-simt:all:default:-"
