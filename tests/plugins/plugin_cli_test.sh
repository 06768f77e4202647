#!/bin/sh
# Plugins through the command line: plugin-info and run accept a plugin like a built-in backend;
# a broken plugin gives a clear message and exit code 2 (bad input), a wrong kernel exit 1.
# Envelopes: plugin-info prints them, fuzz --envelope narrows a campaign, a bad file or an empty
# intersection is exit 2.
# Usage: plugin_cli_test.sh MLAFUZZ CPU_PLUGIN FAULTY_DIR CASE_JSON VARIANT_DIR ENVELOPE_JSON
set -u
mlafuzz=$1 cpu=$2 faulty=$3 case=$4 variants=$5 envelope=$6
out=$(mktemp) && work=$(mktemp -d) && trap 'rm -rf "$out" "$work"' EXIT
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
expect 2 "plugin $faulty/libfaulty_abi_v3.so: ABI version 3, mlafuzz supports 1 and 2" \
  "$mlafuzz" plugin-info "$faulty/libfaulty_abi_v3.so"
expect 2 "plugin $faulty/libfaulty_abi_v0.so: ABI version 0, mlafuzz supports 1 and 2" \
  "$mlafuzz" plugin-info "$faulty/libfaulty_abi_v0.so"
expect 0 "ABI version: 2" "$mlafuzz" plugin-info "$cpu"
expect 0 "refuses extra_cache, extra_topk_length" "$mlafuzz" plugin-info "$cpu"
expect 2 "plugin $faulty/libfaulty_missing_run.so: missing symbol mlafuzz_plugin_run" \
  "$mlafuzz" plugin-info "$faulty/libfaulty_missing_run.so"
expect 2 "plugin /nonexistent/libk.so: cannot open: No such file or directory" \
  "$mlafuzz" plugin-info /nonexistent/libk.so
# plugin-info's "use it as" line runs as pasted, from another directory.
use=$(cd / && "$mlafuzz" plugin-info "$cpu" | sed -n 's/^use it as: //p')
expect 0 "^0 finding(s)" sh -c "cd / && $use --cases 2 --report $work/use --corpus $work/use-corpus"

# run: the plugin next to the oracle; a correct plugin passes, a wrong one fails the case.
expect 0 "verdict PASS" "$mlafuzz" run --case "$case" --backends "plugin:$cpu"
# run names a plugin by its declared name, as fuzz does (not by the path it was given).
expect 0 "^plugin:cpu-fp32-example out \[" "$mlafuzz" run --case "$case" --backends "plugin:$cpu"
expect 0 "^plugin:cpu-fp32-example vs oracle:" "$mlafuzz" run --case "$case" --backends "plugin:$cpu"
expect 1 "verdict FAIL" "$mlafuzz" run --case "$case" --backends "plugin:$faulty/libfaulty_zeros.so"
expect 2 "ABI version 3, mlafuzz supports 1 and 2" \
  "$mlafuzz" run --case "$case" --backends "plugin:$faulty/libfaulty_abi_v3.so"
expect 2 "missing symbol mlafuzz_plugin_run" \
  "$mlafuzz" run --case "$case" --backends "oracle,plugin:$faulty/libfaulty_missing_run.so"
expect 1 "simulated launch failure" \
  "$mlafuzz" run --case "$case" --backends "plugin:$faulty/libfaulty_run_error.so"

# ABI version 1 and envelopes.
flash="$variants/libvariant_flashmla.so"
expect 0 "ABI version: 1" "$mlafuzz" plugin-info "$variants/libabi_v1_plugin.so"
expect 0 "envelope:    none declared" "$mlafuzz" plugin-info "$variants/libabi_v1_plugin.so"
expect 0 "topk multiple of 64" "$mlafuzz" plugin-info "$flash"
expect 0 "all but batch (checked within the tolerance bound)" \
  "$mlafuzz" plugin-info "$variants/libvariant_batch_order_inexact.so"
expect 0 "verdict PASS" "$mlafuzz" run --case "$case" --backends "plugin:$variants/libabi_v1_plugin.so"
fuzz() { "$mlafuzz" fuzz --cases 3 --jobs 1 --progress plain --corpus "$work/c" --report "$work/r" "$@"; }
expect 0 "generating inside the envelope: layouts model1; nope_dim {448}" \
  fuzz --backends oracle,cpu-simt --envelope "$envelope"
expect 0 "plugin:flashmla-like  *run  *3  *0  *0" fuzz --backends "plugin:$flash"
echo '{"layouts": ["v32"]}' >"$work/v32.json"
expect 2 "admit no case: no layout" fuzz --backends "plugin:$flash" --envelope "$work/v32.json"
echo '{"head": {"max": 4}}' >"$work/typo.json"
expect 2 "envelope $work/typo.json: envelope.head: unknown key" \
  fuzz --backends oracle --envelope "$work/typo.json"
echo '{"heads": ' >"$work/broken.json"
expect 2 "envelope $work/broken.json: not valid JSON" \
  fuzz --backends oracle --envelope "$work/broken.json"
expect 2 "/nonexistent/env.json" fuzz --backends oracle --envelope /nonexistent/env.json

[ "$failures" -eq 0 ] && echo "all plugin CLI checks passed" && exit 0
echo "$failures plugin CLI check(s) failed"
exit 1
