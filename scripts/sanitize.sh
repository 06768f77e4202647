#!/usr/bin/env bash
# The sanitized host build (docs/testing.md, "Sanitized build"): the host code, the tests and
# the plugins built with AddressSanitizer (leak detection on) and UndefinedBehaviorSanitizer,
# CUDA off, then the fast tests: everything but the GPU tests, the tests labelled slow (the
# corpus replay) and those labelled static (checks of the sources that run no compiled code).
# Fails when a test fails and when any sanitizer report shows in the tests' output.
# Usage: scripts/sanitize.sh [BUILD_DIR]   (default: build-san). Run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build-san}

t0=$SECONDS
scripts/build.sh "$build_dir" -DMLAFUZZ_ENABLE_CUDA=OFF -DMLAFUZZ_SANITIZE=address,undefined \
  -DMLAFUZZ_BUILD_BENCH=OFF
echo "sanitize: build: $((SECONDS - t0)) s"

# Every process inherits these, the campaign's worker processes too. A report ends the process
# (-fno-sanitize-recover, halt_on_error) with status 86, which no mlafuzz command exits with: a
# test that expects exit 1 (findings) or a fault from a worker does not pass on a sanitizer's
# exit by accident. Reports go to stderr, where the check below finds them.
export ASAN_OPTIONS=detect_leaks=1:check_initialization_order=1:strict_init_order=1:exitcode=86
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=86
# The property test on a few dozen generated cases (600 unsanitized): the same code paths.
export MLAFUZZ_PROPERTY_CASES=${MLAFUZZ_PROPERTY_CASES:-48}
# The other tests whose time goes into volume (generated cases, campaign lengths, the largest
# corpus cases) take their smaller volume over the same code paths (docs/testing.md, "Sanitized
# build", lists them); the unsanitized run of .ci/run keeps the full volume.
export MLAFUZZ_TEST_QUICK=${MLAFUZZ_TEST_QUICK:-1}

# Longest tests first (see .ci/run): seeded from the sanitized build's measured costs.
mkdir -p "$build_dir/Testing/Temporary"
[ -f "$build_dir/Testing/Temporary/CTestCostData.txt" ] ||
  cp .ci/ctest_costs_sanitized.txt "$build_dir/Testing/Temporary/CTestCostData.txt"
t1=$SECONDS
status=0
# Not the Slurm test: it checks daemons and the nightly script over half a minute of campaigns,
# which the unsanitized run of .ci/run already does.
# -j3 on two cores: see .ci/run.
ctest --test-dir "$build_dir" --output-on-failure -j3 -LE 'gpu|slow|slurm|static' || status=$?
echo "sanitize: tests: $((SECONDS - t1)) s"
# Reports of processes whose exit status a test does not see (e.g. a worker whose failure the
# campaign records as a finding) still reach the test's output.
log=$build_dir/Testing/Temporary/LastTest.log
if grep -nE 'runtime error:|ERROR: (Address|Leak)Sanitizer|SUMMARY: (Address|Leak|UndefinedBehavior)Sanitizer' \
  "$log"; then
  echo "sanitize: sanitizer reports in the test output above (all of it: $log)"
  status=1
fi
exit "$status"
