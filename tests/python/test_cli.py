"""Describing python: backends, and clear errors (exit 2) for every way loading can fail."""

from __future__ import annotations

import json
import os
import venv

import pytest

from conftest import FAULTY, NUMPY_KERNEL, SMALL_CASE, describe, mlafuzz_cmd


def test_plugin_info_describes_the_kernel() -> None:
    proc = mlafuzz_cmd("plugin-info", f"{NUMPY_KERNEL}:decode")
    assert proc.returncode == 0, describe(proc)
    for want in ("name:        numpy-fp32", "device:      cpu", "precision:   simt-fp32",
                 "supports():  defined", "available:   yes"):
        assert want in proc.stdout, describe(proc)


def test_list_backends_describes_named_backends() -> None:
    proc = mlafuzz_cmd("list-backends", "--backends", f"{NUMPY_KERNEL}:decode,oracle")
    assert proc.returncode == 0, describe(proc)
    row = [line for line in proc.stdout.splitlines() if line.startswith(NUMPY_KERNEL)]
    assert row and "available" in row[0] and "numpy-fp32" in row[0], describe(proc)


@pytest.mark.parametrize("backend, message", [
    ("python:examples/python/no_such_file.py:decode", "no such file"),
    (f"{NUMPY_KERNEL}:no_such_function", "has no function 'no_such_function'; its kernels: "),
    (f"{FAULTY}:not_decorated", "is not an mlafuzz kernel; decorate it with @mlafuzz.kernel"),
    ("python:no_such_module_xyz:decode", "cannot import no_such_module_xyz"),
    (f"{NUMPY_KERNEL}", "name the function after a colon"),
], ids=["file", "function", "decorator", "module", "no-function"])
def test_bad_backend_is_a_clear_error(backend: str, message: str) -> None:
    for args in (["run", "--case", SMALL_CASE, "--backends", backend],
                 ["fuzz", "--backends", backend, "--cases", "1", "--report", os.devnull + "x"],
                 ["plugin-info", backend]):
        proc = mlafuzz_cmd(*args)
        assert proc.returncode == 2, describe(proc)
        assert message in proc.stdout, describe(proc)


def test_missing_interpreter_is_a_clear_error() -> None:
    proc = mlafuzz_cmd("--python", "/nonexistent/python3", "run", "--case", SMALL_CASE,
                       "--backends", f"{NUMPY_KERNEL}:decode")
    assert proc.returncode == 2, describe(proc)
    assert "python interpreter /nonexistent/python3 is not an executable file" in proc.stdout
    assert "--python PATH or MLAFUZZ_PYTHON" in proc.stdout, describe(proc)


ENVELOPE_KERNEL = "python:tests/python/envelope_kernels.py:decode"


def test_plugin_info_prints_the_declared_envelope_and_claims() -> None:
    proc = mlafuzz_cmd("plugin-info", ENVELOPE_KERNEL)
    assert proc.returncode == 0, describe(proc)
    for want in ("envelope:    declared", "nope_dim {448}", "heads [1, 64]",
                 "topk multiple of 64", "page_stride multiple of 16",
                 "all but batch (checked within the tolerance bound)"):
        assert want in proc.stdout, describe(proc)
    assert "extra cache: joint (one online softmax" in proc.stdout, describe(proc)


def test_plugin_info_shows_a_declared_lse_merged_pipeline() -> None:
    proc = mlafuzz_cmd("plugin-info", "python:tests/python/envelope_kernels.py:decode_lse_merged")
    assert proc.returncode == 0, describe(proc)
    assert "extra cache: lse_merged (each list alone" in proc.stdout, describe(proc)


def test_plugin_info_shows_the_token_tile() -> None:
    proc = mlafuzz_cmd("plugin-info", "python:tests/python/envelope_kernels.py:decode_tile8")
    assert proc.returncode == 0, describe(proc)
    assert "token tile:  8 tokens (declared)" in proc.stdout, describe(proc)
    proc = mlafuzz_cmd("plugin-info", ENVELOPE_KERNEL)
    assert "token tile:  the precision's default" in proc.stdout, describe(proc)


def test_a_declared_token_tile_enters_the_tolerance_bound(tmp_path) -> None:
    # The same outputs under two declarations: 8-token tiles count more softmax rescales than
    # fp32_simt's default 32, so every bound is at least as large and the tightness lower.
    tiled = "python:tests/python/envelope_kernels.py:decode_tile8"
    proc = mlafuzz_cmd("fuzz", "--backends", f"{ENVELOPE_KERNEL},{tiled}", "--cases", "6",
                       "--jobs", "1", "--seed", "3", "--properties", "run,tolerance",
                       "--progress", "plain", "--corpus", str(tmp_path / "c"),
                       "--report", str(tmp_path / "r"))
    assert proc.returncode == 0, describe(proc)
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    tight = {r["backend"]: r["tightness"]["max"] for r in report["results"]
             if r["property"] == "tolerance"}
    assert 0 < tight[tiled] < tight[ENVELOPE_KERNEL], tight


def test_fuzz_generates_inside_a_python_kernels_envelope(tmp_path) -> None:
    proc = mlafuzz_cmd("fuzz", "--backends", ENVELOPE_KERNEL, "--cases", "4", "--jobs", "1",
                       "--progress", "plain", "--corpus", str(tmp_path / "c"),
                       "--report", str(tmp_path / "r"))
    assert proc.returncode == 0, describe(proc)
    assert "generating inside the envelope: layouts model1; nope_dim {448}" in proc.stdout, \
        describe(proc)
    run = [line.split() for line in proc.stdout.splitlines()
           if line.split()[:2] == [ENVELOPE_KERNEL, "run"]]
    # backend, property, cases, n/a, failures: every case applicable and passing.
    assert run and run[0][2:5] == ["4", "0", "0"], describe(proc)


def test_a_finding_on_a_relative_path_replays_from_any_directory(tmp_path) -> None:
    # The campaign is given python:tests/python/faulty_kernels.py:... (relative to the source
    # root); the corpus entry records the file's absolute path, so repro works from elsewhere.
    import json
    import subprocess

    import mlafuzz.testing

    corpus = tmp_path / "corpus"
    proc = mlafuzz_cmd("fuzz", "--backends", f"{FAULTY}:decode_raises", "--cases", "3",
                       "--jobs", "1", "--seed", "4", "--shrink-time", "0", "--properties", "run",
                       "--corpus", str(corpus), "--report", str(tmp_path / "report"))
    assert proc.returncode == 1, describe(proc)
    entries = sorted(corpus.glob("*.json"))
    assert entries, describe(proc)
    finding = json.loads(entries[0].read_text())["finding"]
    source = finding["backend_source"]
    assert source == f"python:{os.path.join(os.getcwd(), 'tests/python/faulty_kernels.py')}" \
        ":decode_raises", finding
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    replay = subprocess.run([mlafuzz.testing.find_mlafuzz(), "repro", str(entries[0])],
                            cwd=elsewhere, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, check=False)
    assert replay.returncode == 1, describe(replay)
    assert "the finding persists" in replay.stdout, describe(replay)
    assert f"--backends {source}" in replay.stdout, describe(replay)


def _worker_file(tmp_path, monkeypatch: pytest.MonkeyPatch, variable: str, pattern: str):
    """Runs the numpy kernel on the small case with variable=tmp_path/out; the one file it left."""
    monkeypatch.setenv(variable, str(tmp_path / "out"))
    proc = mlafuzz_cmd("run", "--case", SMALL_CASE, "--backends", f"{NUMPY_KERNEL}:decode")
    assert proc.returncode == 0, describe(proc)
    files = list((tmp_path / "out").glob(pattern))
    assert len(files) == 1, (files, describe(proc))
    return files[0]


def test_worker_timing_is_written(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = [_worker_file(tmp_path, monkeypatch, "MLAFUZZ_WORKER_TIMING", "timing-*.txt")]
    rows = [line for line in files[0].read_text().splitlines() if line.startswith("cpu ")]
    # small_case.json: B=2; one group of warm host calls, each phase with a median.
    assert len(rows) == 1 and rows[0].startswith("cpu 2 "), files[0].read_text()
    for phase in ("parse=", "arrays=", "kernel=", "reply=", "total="):
        assert phase in rows[0], rows[0]
    # The kernel's own phase is part of the total, and every figure is a number of microseconds.
    cells = dict(c.split("=") for c in rows[0].split(": ")[-1].split())
    assert float(cells["total"]) >= float(cells["kernel"]) > 0, rows[0]


def test_worker_profile_is_written(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pstats  # noqa: PLC0415

    profile = _worker_file(tmp_path, monkeypatch, "MLAFUZZ_WORKER_PROFILE", "worker-*.prof")
    stats = pstats.Stats(str(profile))
    # The kernel's own function is in it: the profile covers the calls, not just the start.
    assert any(name == "attend" for (_, _, name) in stats.stats), sorted(stats.stats)[:20]


def test_an_interpreter_without_numpy_is_one_message_not_a_traceback(tmp_path) -> None:
    """An interpreter that cannot import numpy (pyenv, conda): the reason names the module and
    --python, on one line, and the worker's traceback does not reach the terminal."""
    venv.create(tmp_path / "bare", with_pip=False, system_site_packages=False)
    bare = str(tmp_path / "bare" / "bin" / "python3")
    proc = mlafuzz_cmd("--python", bare, "list-backends", "--backends", "triton-simt,oracle")
    assert proc.returncode == 0, describe(proc)
    assert "cannot import the module 'numpy'" in proc.stdout, describe(proc)
    assert "--python PATH or MLAFUZZ_PYTHON" in proc.stdout, describe(proc)
    assert "Traceback" not in proc.stdout, describe(proc)
    proc = mlafuzz_cmd("--python", bare, "run", "--case", SMALL_CASE,
                       "--backends", f"{NUMPY_KERNEL}:decode")
    assert proc.returncode == 2, describe(proc)
    assert "cannot import the module 'numpy'" in proc.stdout, describe(proc)
    assert "Traceback" not in proc.stdout, describe(proc)


def test_a_kernel_file_inside_a_package_imports_its_siblings_relatively(tmp_path) -> None:
    """python:DIR/numpy/kernel.py:decode, DIR/numpy a package (its __init__.py): the file is a
    module of that package (`from .helpers import ...` works), the folder's name shadows
    nothing (`import numpy` in it is still numpy), as for kernels/triton and the triton
    library, and the package's __init__.py is not run (the file loads as it did alone)."""
    pkg = tmp_path / "numpy"
    (pkg / "inner").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('a package __init__.py mlafuzz runs')\n")
    (pkg / "inner" / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("PRECISION = 'fp32_simt'\n")
    (pkg / "inner" / "kernel.py").write_text(
        "import numpy as np\n"
        "import mlafuzz\n"
        "from ..helpers import PRECISION\n\n\n"
        "@mlafuzz.kernel(name='packaged-' + np.__name__, precision=PRECISION)\n"
        "def decode(call):\n"
        "    '''A kernel in a subpackage.'''\n")
    proc = mlafuzz_cmd("plugin-info", f"python:{pkg}/inner/kernel.py:decode")
    assert proc.returncode == 0, describe(proc)
    assert "name:        packaged-numpy" in proc.stdout, describe(proc)
    assert "precision:   simt-fp32" in proc.stdout, describe(proc)
