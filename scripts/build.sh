#!/usr/bin/env bash
# Installs what is missing on Debian 12 (apt), then configures and builds mlafuzz.
# Usage: scripts/build.sh [BUILD_DIR [CMAKE_ARGS...]]   (default: build). Shared by .ci/run,
# quickstart.sh and sanitize.sh (which passes its options as CMAKE_ARGS).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
shift $(($# > 0))

# python3-venv, -setuptools and -wheel: the offline `pip install --no-build-isolation .` of
# docs/python.md, which the python_install test runs. flake8 and mypy: the python_flake8 and
# python_mypy tests. ccache: the compiler launcher below.
packages=(cmake ninja-build g++ git librapidcheck-dev libgtest-dev libgmock-dev libeigen3-dev
          nlohmann-json3-dev libcli11-dev libfmt-dev python3-numpy python3-pytest python3-venv
          python3-setuptools python3-wheel flake8 mypy ccache)
# More packages for the caller's tests, e.g. .ci/run's "slurm-wlm munge" (the Slurm test).
read -r -a extra <<<"${MLAFUZZ_EXTRA_PACKAGES:-}"
packages+=("${extra[@]}")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi

# The CUDA toolkit's usual home is not always on PATH; CMake enables the kernels when it finds
# nvcc and builds everything else without it.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

# ccache: a rebuild (CI after a previous run, another clone) compiles only what changed. Paths
# under the base directory (default: this checkout) are hashed relative to it, so a clone in
# another folder hits the same cache entries.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
            -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@"
# -j2: the reference machines have two cores, and the CUDA kernels take a lot of memory.
cmake --build "$build_dir" -j"${MLAFUZZ_JOBS:-2}"
