#!/bin/sh
# The tree `cmake --install` lays out (component mlafuzz_tools: bin/mlafuzz,
# share/mlafuzz/{python,triton}): its python: backends start (the mlafuzz package is complete,
# settings.json included) and the shipped Triton kernels load from share/mlafuzz/triton as the
# package they are (relative imports), run from another directory.
# Usage: installed_tree_test.sh BUILD_DIR WORK_DIR PYTHON
set -u
build=$1 work=$2 python=$3
again="reproduce: ctest --test-dir $build -R python_installed_tree --output-on-failure"
rm -rf "$work"
if ! cmake --install "$build" --prefix "$work" --component mlafuzz_tools > "$work.log" 2>&1; then
  cat "$work.log"
  echo "FAIL: cmake --install failed; $again"
  exit 1
fi
cd /
check() {  # check WHAT EXPECTED COMMAND...: the command's output must hold EXPECTED
  what=$1 expected=$2
  shift 2
  out=$(env -u MLAFUZZ_PYTHON_PACKAGE_DIR -u MLAFUZZ_TRITON_DIR MLAFUZZ_PYTHON="$python" "$@" 2>&1)
  if ! printf '%s\n' "$out" | grep -qF -- "$expected"; then
    printf '%s\n' "$out"
    echo "FAIL: $what: no '$expected' in the output of: $*; $again"
    exit 1
  fi
}
check "an installed python: backend" "name:        triton-mma" \
  "$work/bin/mlafuzz" plugin-info "python:$work/share/mlafuzz/triton/triton_mma.py:decode"
check "the triton-simt alias of the installed tree" "triton-simt" \
  "$work/bin/mlafuzz" list-backends --backends triton-simt
if env -u MLAFUZZ_PYTHON_PACKAGE_DIR MLAFUZZ_PYTHON="$python" "$work/bin/mlafuzz" list-backends \
    --backends triton-simt 2>&1 | grep -q "did not answer"; then
  echo "FAIL: the installed tree's Python worker did not start; $again"
  exit 1
fi
echo "the installed tree's python: backends and Triton kernels load"
