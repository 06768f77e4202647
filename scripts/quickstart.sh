#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install, build, then run the float64 oracle (and
# the host models, compared against it) on every case in corpus/cases.
# Exit status: 0 when every case ran and every comparison passed.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
scripts/build.sh "$build_dir"

status=0
for c in corpus/cases/*.json; do
  echo "== $c"
  "$build_dir/mlafuzz" run --case "$c" --backends oracle,cpu-simt,cpu-mma || status=1
done
exit $status
