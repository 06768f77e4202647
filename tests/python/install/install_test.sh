#!/usr/bin/env bash
# python_install: the install of docs/python.md ("Install") for real, in a temporary venv, then
# what a new user runs: the three-line pytest file on a planted-bug kernel, from another
# directory, with no MLAFUZZ_* variable and no PYTHONPATH. Checks the AssertionError (one bug
# group, the counterexample inline, a reproduce command) and runs that command as pasted. Then
# the package alone (pip install ./python) says where it looked for the executable.
# Usage: install_test.sh SOURCE_DIR BUILD_DIR PYTHON   (the build folder's executable is reused:
# MLAFUZZ_CMAKE_BUILD_DIR; exit 77 = skipped: no venv/setuptools/wheel/pytest for PYTHON).
set -euo pipefail
root=$1
build=$2
python=$3
here=$(cd "$(dirname "$0")" && pwd)
reproduce="ctest --test-dir $build -R python_install --output-on-failure"
fail() {
  echo "FAIL: $*"
  echo "reproduce: $reproduce"
  exit 1
}
if ! "$python" -c "import venv, ensurepip, setuptools, wheel, pytest, numpy" 2>/dev/null; then
  echo "skipped: $python lacks venv/ensurepip, setuptools, wheel, pytest or numpy" \
       "(apt-get install python3-venv python3-setuptools python3-wheel python3-pytest python3-numpy)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Nothing from the caller's environment: a user's shell after the install.
clean=(env -i "PATH=/usr/bin:/bin" "HOME=$work" "TMPDIR=$work" "LANG=C.UTF-8")

# 1. The documented install, with the build folder's executable (the documented variable).
"${clean[@]}" "$python" -m venv --system-site-packages "$work/venv"
(cd "$root" && "${clean[@]}" "MLAFUZZ_CMAKE_BUILD_DIR=$build" \
   "$work/venv/bin/pip" install --no-build-isolation .) > "$work/pip.log" 2>&1 \
  || { cat "$work/pip.log"; fail "pip install --no-build-isolation . failed"; }
venv_python=$work/venv/bin/python

# 2. The console script, python -m mlafuzz, and the package finding its own executable.
cd /
"${clean[@]}" "$work/venv/bin/mlafuzz" list-backends > "$work/list.txt" 2>&1 \
  || { cat "$work/list.txt"; fail "the mlafuzz console script"; }
grep -q "^oracle " "$work/list.txt" || fail "mlafuzz list-backends lists no oracle"
"${clean[@]}" "$venv_python" -m mlafuzz --help > "$work/help.txt" 2>&1 \
  || { cat "$work/help.txt"; fail "python -m mlafuzz --help"; }
found=$("${clean[@]}" "$venv_python" -c "import mlafuzz.testing as t; print(t.find_mlafuzz())")
case "$found" in
  "$work"/venv/lib/*/site-packages/mlafuzz/_native/bin/mlafuzz) ;;
  *) fail "find_mlafuzz() gave $found, not the executable inside the installed package" ;;
esac
"${clean[@]}" "$venv_python" -c "import os, mlafuzz; \
assert os.path.isfile(os.path.join(os.path.dirname(mlafuzz.__file__), 'py.typed'))" \
  || fail "py.typed is not installed"

# 3. The three-line test file, run from another directory.
mkdir -p "$work/project/tests" "$work/elsewhere"
cp "$here/my_kernel.py" "$root/examples/python/numpy_decode.py" "$work/project/tests/"
printf '%s\n' "import mlafuzz" "from my_kernel import decode" \
  "def test_decode(): mlafuzz.testing.fuzz(decode, cases=300)" > "$work/project/tests/test_decode.py"
cd "$work/elsewhere"
set +e
"${clean[@]}" "$venv_python" -m pytest -q -p no:cacheprovider "$work/project/tests/test_decode.py" \
  > "$work/pytest.txt" 2>&1
rc=$?
set -e
cat "$work/pytest.txt"
[ "$rc" -eq 1 ] || fail "pytest exited with $rc, expected 1 (a test failed)"
grep -q "^E   AssertionError: mlafuzz: 1 bug(s) in python:$work/project/tests/my_kernel.py:decode" \
  "$work/pytest.txt" || fail "the AssertionError does not announce one bug in the kernel"
[ "$(grep -c '^E   \[[0-9]*\] ' "$work/pytest.txt")" -eq 1 ] || fail "not exactly one bug group"
grep -q '^E   \[1\] python:.*:decode | bound excess | ' "$work/pytest.txt" \
  && grep -q '^E       fails tolerance; ' "$work/pytest.txt" \
  || fail "the group is not the tolerance failure (bound excess)"
grep -Eq '^E       counterexample: B=1 H=1 topk=[0-9]+; (model1|v32) nope=' "$work/pytest.txt" \
  || fail "no minimal counterexample inline"
grep -Eq '^E       out\[b=0,h=0,d=[0-9]+\] value .* error/bound' "$work/pytest.txt" \
  || fail "no failing element"
grep -q "_worker.py\|mlafuzz/testing.py" "$work/pytest.txt" && fail "the helper's frames show"
cmd=$(sed -n 's/^E       reproduce: //p' "$work/pytest.txt" | head -1)
case "$cmd" in
  "$work/venv/bin/mlafuzz repro /"*) ;;
  *) fail "the reproduce command '$cmd' does not start with the console script's absolute path" ;;
esac

# 4. The reproduce command as pasted, in a shell that has nothing of the test's environment.
cd /
set +e
"${clean[@]}" bash -c "$cmd" > "$work/repro.txt" 2>&1
rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q "the finding persists" "$work/repro.txt" \
  || { cat "$work/repro.txt"; fail "the pasted reproduce command exited $rc"; }

# 5. The package alone: no executable, and a message that says where it looked.
"${clean[@]}" "$python" -m venv --system-site-packages "$work/pure"
# A copy of ./python: setuptools writes its build folders beside the package's pyproject.toml.
cp -r "$root/python" "$work/python"
rm -rf "$work/python/build" "$work/python/"*.egg-info
(cd "$work" && "${clean[@]}" "$work/pure/bin/pip" install --no-build-isolation ./python) \
  > "$work/pip-pure.log" 2>&1 || { cat "$work/pip-pure.log"; fail "pip install ./python"; }
set +e
"${clean[@]}" "$work/pure/bin/python" -m mlafuzz list-backends > "$work/pure.txt" 2>&1
rc=$?
set -e
cat "$work/pure.txt"
[ "$rc" -eq 2 ] || fail "python -m mlafuzz without an executable exited $rc, expected 2"
grep -q "cannot find the mlafuzz executable; looked at:" "$work/pure.txt" \
  && grep -q "_native/bin/mlafuzz: absent" "$work/pure.txt" && grep -q "MLAFUZZ_BIN: not set" \
  "$work/pure.txt" || fail "the package alone does not say where it looked"
echo "install, console script, python -m mlafuzz, three-line pytest from elsewhere, pasted" \
     "reproduce command and the package alone: all as documented"
