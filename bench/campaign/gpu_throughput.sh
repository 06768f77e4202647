#!/bin/bash
# GPU campaign throughput (issue 13): cases/s of `mlafuzz fuzz` on the GPU kernels for the
# configurations the README's table lists, one after another on the same GPU with the same seed,
# plus the time breakdown of the worker calls (report.json campaign.time_breakdown).
#
#   bench/campaign/gpu_throughput.sh MLAFUZZ SECONDS CONFIG...
# CONFIG is NAME:BACKENDS:PROPERTIES:PROFILE:WORKERS (PROPERTIES "all" for every property,
# WORKERS "-" to leave --workers-per-gpu out, e.g. for a binary that predates it), e.g.
#   both-all:cuda-mma,cuda-simt:all:default:4
# Prints one line per configuration; logs and reports go under $OUT (default a temp folder).
set -uo pipefail
MLAFUZZ=$1
SECONDS_PER_RUN=$2
shift 2
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
for config in "$@"; do
  IFS=: read -r name backends props profile workers <<<"$config"
  args=(fuzz --seed 21 --profile "$profile" --time "${SECONDS_PER_RUN}s" --backends "$backends"
        --report "$OUT/$name" --corpus "$OUT/corpus-$name" --progress plain --shrink-time 0)
  [[ $props != all ]] && args+=(--properties "$props")
  [[ $workers != - ]] && args+=(--workers-per-gpu "$workers")
  "$MLAFUZZ" "${args[@]}" >"$OUT/$name.log" 2>&1
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
tb = c.get("time_breakdown", {})
for backend, t in tb.items():
    n = max(t["calls"], 1)
    phases = " ".join(f"{k}={1e6 * v / n:.0f}" for k, v in t.items() if k != "calls" and v > 0)
    line += f"\n{'':>18}{backend}: {t['calls']} calls, us/call {phases}"
print(line)
PY
done
