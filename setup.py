"""Builds the mlafuzz executable with CMake and ships it inside the Python package.

Offline, with Debian's setuptools (docs/python.md, "Install")::

    python3 -m venv --system-site-packages ~/.venvs/mlafuzz
    ~/.venvs/mlafuzz/bin/pip install --no-build-isolation .

The executable lands in ``mlafuzz/_native/bin/mlafuzz`` and the shipped Triton kernels in
``mlafuzz/_native/share/mlafuzz/triton`` (where the executable looks for them); the metadata is
in pyproject.toml. setuptools' own build folders are ``build-pip/`` (``build/`` is CMake's).

Environment:
    MLAFUZZ_CMAKE_BUILD_DIR: an existing CMake build folder of this source tree; the executable
        is brought up to date there (``cmake --build DIR --target mlafuzz``) and taken from it
        instead of configuring a fresh build.
    MLAFUZZ_CMAKE_ARGS: more arguments for a fresh configure, e.g. ``-DMLAFUZZ_ENABLE_CUDA=OFF``
        (by default CUDA kernels are built when nvcc is found, as scripts/build.sh does).
    MLAFUZZ_BUILD_JOBS: parallel jobs of the build (default 2).
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
PIP_BUILD = "build-pip"


class BinaryDistribution(Distribution):
    """The wheel holds a compiled executable: platform-specific, not pure Python."""

    def has_ext_modules(self) -> bool:
        return True


def _cmake_home(build_dir: str) -> str:
    with open(os.path.join(build_dir, "CMakeCache.txt"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("CMAKE_HOME_DIRECTORY:"):
                return line.split("=", 1)[1].strip()
    return ""


class BuildWithExecutable(build_py):
    """build_py, then the mlafuzz executable built with CMake and copied into the package."""

    def run(self) -> None:
        super().run()
        exe = self._cmake_build()
        native = os.path.join(self.build_lib, "mlafuzz", "_native")
        os.makedirs(os.path.join(native, "bin"), exist_ok=True)
        target = os.path.join(native, "bin", "mlafuzz")
        shutil.copyfile(exe, target)
        os.chmod(target, 0o755)
        triton = os.path.join(native, "share", "mlafuzz", "triton")
        os.makedirs(triton, exist_ok=True)
        for py in glob.glob(os.path.join(ROOT, "kernels", "triton", "*.py")):
            shutil.copyfile(py, os.path.join(triton, os.path.basename(py)))

    def _run(self, cmd: list) -> None:
        print("mlafuzz setup.py:", " ".join(shlex.quote(c) for c in cmd), flush=True)
        subprocess.run(cmd, check=True)

    def _cmake_build(self) -> str:
        if shutil.which("cmake") is None:
            raise SystemExit(
                "mlafuzz: building the executable needs CMake, a C++20 compiler and the Debian "
                "packages scripts/build.sh lists (it installs them); or install the Python "
                "package alone: pip install ./python")
        jobs = os.environ.get("MLAFUZZ_BUILD_JOBS", "2")
        given = os.environ.get("MLAFUZZ_CMAKE_BUILD_DIR")
        if given:
            build_dir = os.path.abspath(given)
            if not os.path.isfile(os.path.join(build_dir, "CMakeCache.txt")):
                raise SystemExit(f"mlafuzz: MLAFUZZ_CMAKE_BUILD_DIR={given} is not a configured "
                                 "CMake build folder (no CMakeCache.txt)")
            home = _cmake_home(build_dir)
            if os.path.realpath(home) != os.path.realpath(ROOT):
                raise SystemExit(f"mlafuzz: MLAFUZZ_CMAKE_BUILD_DIR={given} builds {home}, not "
                                 f"this source tree {ROOT}")
        else:
            build_temp = self.get_finalized_command("build").build_temp
            build_dir = os.path.join(os.path.abspath(build_temp), "cmake")
            if not os.path.isfile(os.path.join(build_dir, "CMakeCache.txt")):
                cmd = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                       "-DMLAFUZZ_BUILD_TESTS=OFF", "-DMLAFUZZ_BUILD_BENCH=OFF"]
                if shutil.which("ninja"):
                    cmd += ["-G", "Ninja"]
                cmd += shlex.split(os.environ.get("MLAFUZZ_CMAKE_ARGS", ""))
                self._run(cmd)
        self._run(["cmake", "--build", build_dir, "--target", "mlafuzz", "-j", jobs])
        return os.path.join(build_dir, "mlafuzz")


os.makedirs(os.path.join(ROOT, PIP_BUILD), exist_ok=True)
setup(
    distclass=BinaryDistribution,
    cmdclass={"build_py": BuildWithExecutable},
    options={"build": {"build_base": PIP_BUILD}, "egg_info": {"egg_base": PIP_BUILD}},
)
