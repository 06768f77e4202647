#!/bin/bash
# GPU campaign throughput: cases/s of `mlafuzz fuzz` on the GPU kernels for the configurations
# bench/RESULTS.md's table lists, one after another on the same GPU with the same seed,
# plus the time breakdown of the worker calls (report.json campaign.time_breakdown).
#
#   bench/campaign/gpu_throughput.sh MLAFUZZ SECONDS CONFIG...
# CONFIG is NAME:BACKENDS:PROPERTIES:PROFILE:WORKERS[:ENV] (PROPERTIES "all" for every property,
# WORKERS "-" to leave --workers-per-gpu out, e.g. for a binary that predates it; ENV an optional
# comma-separated list of NAME=VALUE set for that run; JOBS=N there passes --jobs N instead), e.g.
#   both-all:cuda-mma,cuda-simt:all:default:4
#   not-resident:cuda-mma,cuda-simt:all:default:2:MLAFUZZ_CUDA_RESIDENT=0
# (MLAFUZZ_CUDA_RESIDENT=0: every input uploaded from pageable memory on every call.)
# Prints one line per configuration; logs and reports go under $OUT (default a temp folder).
set -uo pipefail
MLAFUZZ=$1
SECONDS_PER_RUN=$2
shift 2
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
for config in "$@"; do
  IFS=: read -r name backends props profile workers envs <<<"$config"
  args=(fuzz --seed 21 --profile "$profile" --time "${SECONDS_PER_RUN}s" --backends "$backends"
        --report "$OUT/$name" --corpus "$OUT/corpus-$name" --progress plain --shrink-time 0)
  [[ $props != all ]] && args+=(--properties "$props")
  [[ $workers != - ]] && args+=(--workers-per-gpu "$workers")
  env_args=()
  if [[ -n ${envs:-} ]]; then
    IFS=, read -ra all_env <<<"$envs"
    for e in "${all_env[@]}"; do
      if [[ $e == JOBS=* ]]; then args+=(--jobs "${e#JOBS=}"); else env_args+=("$e"); fi
    done
  fi
  env "${env_args[@]}" "$MLAFUZZ" "${args[@]}" >"$OUT/$name.log" 2>&1
  rc=$?
  python3 - "$OUT/$name/report.json" "$name" "$rc" <<'PY'
import json, sys
path, name, rc = sys.argv[1:4]
try:
    c = json.load(open(path))["campaign"]
except (OSError, ValueError) as e:
    print(f"{name:>16}: no report ({e}); exit {rc}")
    sys.exit(0)
line = (f"{name:>16}: {c['cases']:>6} cases in {c['duration_s']:6.1f} s = "
        f"{c['cases_per_s']:7.1f} cases/s (exit {rc})")
cb = c.get("case_breakdown", {})
if cb.get("cases"):  # the campaign side of a case (absent from older reports)
    n = cb["cases"]
    steps = " ".join(f"{k}={1e3 * v / n:.1f}" for k, v in cb.items() if k != "cases")
    line += f"\n{'':>18}per case (ms): {steps}"
tb = c.get("time_breakdown", {})
for backend, t in tb.items():
    n = max(t["calls"], 1)
    phases = " ".join(f"{k}={1e6 * v / n:.0f}" for k, v in t.items()
                      if k not in ("calls", "requests") and v > 0)
    line += (f"\n{'':>18}{backend}: {t['calls']} calls in {t.get('requests', '?')} requests, "
             f"us/call {phases}")
print(line)
PY
done
