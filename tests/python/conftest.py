"""Shared fixtures of the python: backend tests (run from ctest: tests/python/CMakeLists.txt).

Environment: MLAFUZZ_BIN (the mlafuzz under test), MLAFUZZ_PYTHON (the workers' interpreter),
PYTHONPATH containing python/ (this source tree's package).
"""

from __future__ import annotations

import os
import subprocess
from typing import List

import pytest

import mlafuzz.testing
from mlafuzz import _settings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUMPY_KERNEL = "python:examples/python/numpy_decode.py"
FAULTY = "python:tests/python/faulty_kernels.py"
SMALL_CASE = os.path.join(ROOT, "tests", "plugins", "data", "small_case.json")  # B=2, H=3


def full_or_quick(full: int, quick: int) -> int:
    """`quick` where MLAFUZZ_TEST_QUICK=1 (the sanitized run, scripts/sanitize.sh), else `full`:
    for the tests whose time goes into volume (generated cases) over code paths that a smaller
    volume takes too. docs/testing.md, "Sanitized build", lists them."""
    return quick if _settings.flag("MLAFUZZ_TEST_QUICK", False) else full


@pytest.fixture(autouse=True)
def _in_source_root(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Backend names are relative to the source root; mlafuzz.testing.fuzz keeps the kernels'
    corpus folders in the test's temporary folder (not beside the test files)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("MLAFUZZ_CORPUS_ROOT", str(tmp_path / "mlafuzz-corpus"))


def mlafuzz_cmd(*args: str) -> subprocess.CompletedProcess:
    """Runs the mlafuzz under test; stdout and stderr together in .stdout."""
    return subprocess.run([mlafuzz.testing.find_mlafuzz(), *args], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)


def describe(proc: subprocess.CompletedProcess) -> str:
    args = proc.args if isinstance(proc.args, str) else " ".join(proc.args)
    return f"exit {proc.returncode}; output:\n{proc.stdout}\ncommand: {args}"


def lines_with(text: str, word: str) -> List[str]:
    return [line for line in text.splitlines() if word in line]
