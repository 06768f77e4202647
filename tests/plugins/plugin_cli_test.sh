#!/bin/sh
# Plugins through the command line: plugin-info and run accept a plugin like a built-in backend;
# a broken plugin gives a clear message and exit code 2 (bad input), a wrong kernel exit 1.
# Usage: plugin_cli_test.sh MLAFUZZ CPU_PLUGIN FAULTY_DIR CASE_JSON
set -u
mlafuzz=$1 cpu=$2 faulty=$3 case=$4
out=$(mktemp) && trap 'rm -f "$out"' EXIT
failures=0

# expect RC PATTERN CMD...: runs CMD, checks its exit code and that its output matches PATTERN.
expect() {
  want_rc=$1 pattern=$2
  shift 2
  "$@" >"$out" 2>&1
  rc=$?
  if [ "$rc" -ne "$want_rc" ] || ! grep -q -e "$pattern" "$out"; then
    echo "FAIL: $* -> exit $rc (want $want_rc), output:"
    sed 's/^/  | /' "$out"
    echo "  (wanted a line matching: $pattern)"
    failures=$((failures + 1))
  else
    echo "ok: $* -> exit $rc"
  fi
}

expect 0 "backend:     plugin:cpu-fp32-example" "$mlafuzz" plugin-info "$cpu"
expect 0 "precision:   simt-fp32" "$mlafuzz" plugin-info "$cpu"
expect 2 "plugin $faulty/libfaulty_abi_v2.so: ABI version 2, mlafuzz supports 1" \
  "$mlafuzz" plugin-info "$faulty/libfaulty_abi_v2.so"
expect 2 "plugin $faulty/libfaulty_missing_run.so: missing symbol mlafuzz_plugin_run" \
  "$mlafuzz" plugin-info "$faulty/libfaulty_missing_run.so"
expect 2 "plugin /nonexistent/libk.so: cannot open: No such file or directory" \
  "$mlafuzz" plugin-info /nonexistent/libk.so

# run: the plugin next to the oracle; a correct plugin passes, a wrong one fails the case.
expect 0 "out PASS" "$mlafuzz" run --case "$case" --backends "plugin:$cpu"
# run names a plugin by its declared name, as fuzz does (not by the path it was given).
expect 0 "^plugin:cpu-fp32-example out \[" "$mlafuzz" run --case "$case" --backends "plugin:$cpu"
expect 0 "^plugin:cpu-fp32-example vs oracle:" "$mlafuzz" run --case "$case" --backends "plugin:$cpu"
expect 1 "out FAIL" "$mlafuzz" run --case "$case" --backends "plugin:$faulty/libfaulty_zeros.so"
expect 2 "ABI version 2, mlafuzz supports 1" \
  "$mlafuzz" run --case "$case" --backends "plugin:$faulty/libfaulty_abi_v2.so"
expect 2 "missing symbol mlafuzz_plugin_run" \
  "$mlafuzz" run --case "$case" --backends "oracle,plugin:$faulty/libfaulty_missing_run.so"
expect 1 "simulated launch failure" \
  "$mlafuzz" run --case "$case" --backends "plugin:$faulty/libfaulty_run_error.so"

[ "$failures" -eq 0 ] && echo "all plugin CLI checks passed" && exit 0
echo "$failures plugin CLI check(s) failed"
exit 1
