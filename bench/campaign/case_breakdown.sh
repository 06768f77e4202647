#!/bin/bash
# The campaign's CPU time per case by step (report.json campaign.case_breakdown divided by the
# cases) and each step's ratio to the oracle's, for one or more builds run back to back on the
# same machine: on a loaded machine compare the ratios of runs made in the same round.
# Usage: bench/campaign/case_breakdown.sh SECONDS ROUNDS MLAFUZZ [MLAFUZZ...]
#   (host models: --backends cpu-mma,cpu-simt --seed 21 --jobs 1, profiles default and
#   production; BACKENDS, SEED and PROFILES in the environment override them).
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 SECONDS ROUNDS MLAFUZZ [MLAFUZZ...]" >&2
  exit 2
fi
SECONDS_PER_RUN=$1
ROUNDS=$2
shift 2
BINS=()
for bin in "$@"; do BINS+=("$(realpath "$bin")"); done
BACKENDS=${BACKENDS:-cpu-mma,cpu-simt}
SEED=${SEED:-21}
PROFILES=${PROFILES:-default production}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
echo "host $(hostname), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
for round in $(seq 1 "$ROUNDS"); do
  for profile in $PROFILES; do
    for bin in "${BINS[@]}"; do
      dir="$OUT/r$round-$profile-$(echo "$bin" | tr '/' '_')"
      (cd "$OUT" && "$bin" fuzz --backends "$BACKENDS" --seed "$SEED" --jobs 1 \
        --time "${SECONDS_PER_RUN}s" --profile "$profile" --report "$dir" \
        --corpus "$dir-corpus" --progress plain > "$dir.log" 2>&1) || [ $? -eq 1 ]
      python3 - "$dir/report.json" "$round" "$profile" "$bin" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["campaign"]
b = c["case_breakdown"]
n = b["cases"]
ms = {k: 1e3 * v / n for k, v in b.items() if k != "cases"}
o = ms["oracle"]
side = sum(ms[k] for k in ("materialize", "oracle", "bounds", "variants", "checks"))
print(f"round {sys.argv[2]} {sys.argv[3]:>10} {sys.argv[4]}: {n} cases; per case ms "
      + " ".join(f"{k} {ms[k]:.2f}" for k in ("oracle", "bounds", "checks", "materialize",
                                              "variants", "clean_runs", "variant_runs"))
      + f"; /oracle: bounds {ms['bounds'] / o:.2f}x checks {ms['checks'] / o:.2f}x"
      + f" campaign side {side / o:.2f}x")
PY
    done
  done
done
