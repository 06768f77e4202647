#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install, build, run the float64 oracle (and the
# host models, compared against it) on every case in corpus/cases, then the one-minute default
# campaign (`mlafuzz fuzz`: generated cases, every property, every available backend; report in
# reports/quickstart).
# Exit status: 0 when every case ran, every comparison passed and the campaign found nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
scripts/build.sh "$build_dir"

status=0
cases=(corpus/cases/*.json)
failed=()
for c in "${cases[@]}"; do
  echo "== $c"
  "$build_dir/mlafuzz" run --case "$c" --backends oracle,cpu-simt,cpu-mma || failed+=("$c")
done
if ((${#failed[@]})); then
  echo "${#cases[@]} corpus cases: ${#failed[@]} fail: ${failed[*]}"
  status=1
else
  echo "${#cases[@]} corpus cases: all pass"
fi

"$build_dir/mlafuzz" fuzz --report reports/quickstart --corpus reports/quickstart/corpus || status=1
exit $status
