#!/bin/sh
# A plugin that crashes, hangs or calls exit(3), fuzzed next to a correct one, through the
# campaign's worker isolation: each call becomes a fault finding, the campaign runs every case and
# writes its report, the correct plugin is evaluated throughout. Exit 1 from mlafuzz fuzz =
# findings. Then `run` and `repro` (isolated as well): the exit(3) plugin is a
# FAULT and exit 1, never 3; with --in-process it ends mlafuzz with its 3.
# Usage: plugin_isolation_test.sh MLAFUZZ CPU_PLUGIN FAULTY_DIR
set -u
mlafuzz=$1 cpu=$2 faulty=$3
work=$(mktemp -d) && trap 'rm -rf "$work"' EXIT
# A sanitized build (MLAFUZZ_SANITIZE): the crashing plugin must kill its worker with the real
# SIGSEGV that this test checks for, not with AddressSanitizer's report and exit status.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}handle_segv=0"
failures=0

check() {  # check NAME PATTERN: the log of campaign NAME has a line matching PATTERN
  if ! grep -q -e "$2" "$work/$1.log"; then
    echo "FAIL: $1: no line matching: $2"
    sed 's/^/  | /' "$work/$1.log" | tail -30
    failures=$((failures + 1))
  fi
}

for fault in crash hang exit; do
  "$mlafuzz" fuzz --backends "plugin:$faulty/libfaulty_$fault.so,plugin:$cpu" --cases 3 --jobs 1 \
    --shrink-time 0 --case-timeout 2s --corpus "$work/corpus-$fault" --report "$work/report-$fault" \
    --progress plain >"$work/$fault.log" 2>&1
  rc=$?
  [ "$rc" -eq 1 ] || { echo "FAIL: $fault: exit $rc, want 1 (findings)"; failures=$((failures + 1)); }
  [ -f "$work/report-$fault/report.json" ] || { echo "FAIL: $fault: no report"; failures=$((failures + 1)); }
  check "$fault" "3 cases"
  check "$fault" "fault on plugin:faulty-"
  if grep -q "plugin:cpu-fp32-example: FAIL" "$work/$fault.log"; then
    echo "FAIL: $fault: the correct plugin failed next to the broken one"
    failures=$((failures + 1))
  fi
done
check crash "killed by signal 11"
check hang "no reply within the case timeout (hang)"
check exit "exited with status 3"

expect_rc() {  # expect_rc WANT NAME COMMAND...: run COMMAND, log it as NAME, check its status
  want=$1 name=$2
  shift 2
  "$@" >"$work/$name.log" 2>&1
  rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "FAIL: $name: exit $rc, want $want: $*"
    sed 's/^/  | /' "$work/$name.log" | tail -20
    failures=$((failures + 1))
  fi
}
case_file=$(dirname "$0")/data/small_case.json
for fault in exit crash; do
  expect_rc 1 "run-$fault" "$mlafuzz" run --case "$case_file" --backends "plugin:$faulty/libfaulty_$fault.so"
  check "run-$fault" "FAULT: worker for plugin:"
done
check run-exit "exited with status 3"
expect_rc 1 run-hang "$mlafuzz" run --case "$case_file" --case-timeout 1s \
  --backends "plugin:$faulty/libfaulty_hang.so"
check run-hang "no reply within the case timeout (hang)"
expect_rc 3 run-in-process "$mlafuzz" run --case "$case_file" --in-process \
  --backends "plugin:$faulty/libfaulty_exit.so"
entry=$(find "$work/corpus-exit" -name '*.json' | head -1)
if [ -z "$entry" ]; then
  echo "FAIL: the exit campaign saved no corpus entry"
  failures=$((failures + 1))
else
  expect_rc 1 repro-exit "$mlafuzz" repro "$entry"
  check repro-exit "exited with status 3"
  check repro-exit "the finding persists"
fi

[ "$failures" -eq 0 ] && echo "crash, hang and exit(3) isolated in fuzz, run and repro" && exit 0
exit 1
