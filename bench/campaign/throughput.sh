#!/bin/bash
# Campaign throughput (cases/s) for the default case mix and for the original production shapes
# (H = 64; topk 128 with P = 256, topk 512 with P = 64; B up to 32), as bench/RESULTS.md
# quotes it. Usage: bench/campaign/throughput.sh [MLAFUZZ] [SECONDS] [BACKENDS]
set -euo pipefail
MLAFUZZ=${1:-build/mlafuzz}
SECONDS_PER_RUN=${2:-60}
BACKENDS=${3:-available}
OUT=$(mktemp -d)
for profile in default production; do
  "$MLAFUZZ" fuzz --profile "$profile" --time "${SECONDS_PER_RUN}s" --backends "$BACKENDS" \
    --report "$OUT/$profile" --corpus "$OUT/corpus-$profile" --progress plain \
    --shrink-time 0 > "$OUT/$profile.log" 2>&1 || [ $? -eq 1 ]
  python3 - "$OUT/$profile/report.json" "$profile" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
c = r["campaign"]
print(f"{sys.argv[2]:>10}: {c['cases']} cases in {c['duration_s']:.1f} s = "
      f"{c['cases_per_s']:.2f} cases/s; oracle {c['oracle_seconds']:.1f} s of "
      f"{c['eval_seconds']:.1f} s evaluation; backends {','.join(c['backends'])}; "
      f"host {c['host']}")
PY
done
rm -rf "$OUT"
