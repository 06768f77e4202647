"""`mlafuzz mutants --backends python:...`: the planted bugs a Python module declares (MUTANTS +
mutant_<name>) are each scored in a worker process, with bounded budgets (case and shrink
evaluation counts, never wall-clock)."""

from __future__ import annotations

import json
import os
import re
import sys

from conftest import NUMPY_KERNEL, SMALL_CASE, describe, mlafuzz_cmd

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import numpy_decode  # noqa: E402

BUDGET = ["--max-cases", "400", "--shrink-evals", "60", "--budget", "100000",
          "--shrink-budget", "100000", "--seed", "1"]


def _report(tmp_path, *backends: str, extra=()):
    out = tmp_path / "mutants.json"
    proc = mlafuzz_cmd("mutants", "--backends", ",".join(backends), *BUDGET, *extra,
                       "--json", str(out))
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def test_every_numpy_mutant_is_killed(tmp_path) -> None:
    proc, report = _report(tmp_path, f"{NUMPY_KERNEL}:decode")
    print(proc.stdout)
    assert proc.returncode == 0, describe(proc)
    assert report is not None, describe(proc)
    assert report["backend_kind"] == "python", describe(proc)
    listed = {m["mutant"]: m for m in report["mutants"]}
    assert list(listed) == list(numpy_decode.MUTANTS), describe(proc)
    assert len(listed) >= 4
    for name, m in listed.items():
        assert m["status"] == "killed", f"{name}: {m}\n{describe(proc)}"
        assert m["control_passed"], f"{name}: {m}"
        assert m["backend"].endswith(f"numpy_decode.py:decode~{name}"), m["backend"]
        assert m["description"] == numpy_decode.MUTANTS[name]
        assert m["shrunk"]["batch"] >= 1 and m["shrunk"]["evaluations"] <= 60, m["shrunk"]
    assert report["summary"]["killed"] == len(numpy_decode.MUTANTS)
    assert report["summary"]["survived"] == 0
    for name in numpy_decode.MUTANTS:
        assert re.search(rf"^{re.escape(name)}\s+killed\s", proc.stdout, re.M), describe(proc)


def test_crashing_and_raising_mutants_are_kills_not_the_end(tmp_path) -> None:
    proc, report = _report(tmp_path, "python:tests/python/mutant_kernels.py:decode",
                           extra=("--case-timeout", "30"))
    assert proc.returncode == 0, describe(proc)
    listed = {m["mutant"]: m for m in report["mutants"]}
    assert set(listed) == {"exits", "raises"}, describe(proc)
    for m in listed.values():
        assert m["status"] == "killed" and m["property"] == "run", f"{m}\n{describe(proc)}"
        assert m["shrunk"]["heads"] == 2, m["shrunk"]  # fails from two heads on, shrunk there
    assert listed["exits"]["detail"].count("fault") >= 1, listed["exits"]["detail"]


def test_a_mutant_backend_runs_and_fails(tmp_path) -> None:
    # The convention outside `mutants` too: run names the planted bug's backend directly.
    proc = mlafuzz_cmd("run", "--case", SMALL_CASE, "--backends",
                       f"{NUMPY_KERNEL}:decode~sink-ignored")
    assert proc.returncode in (0, 1), describe(proc)
    assert "sink-ignored" in proc.stdout or "numpy-fp32.sink-ignored" in proc.stdout, describe(proc)


def test_unknown_mutant_is_a_clear_error(tmp_path) -> None:
    proc = mlafuzz_cmd("run", "--case", SMALL_CASE, "--backends", f"{NUMPY_KERNEL}:decode~nope")
    assert proc.returncode == 2, describe(proc)
    assert "declares no mutant 'nope'; declared: topk-length-off-by-one, sink-ignored" in \
        proc.stdout, describe(proc)
    proc, _ = _report(tmp_path, f"{NUMPY_KERNEL}:decode", extra=("--only", "nope"))
    assert proc.returncode == 2, describe(proc)
    assert "unknown mutant 'nope'; declared: topk-length-off-by-one" in proc.stdout, describe(proc)
    proc, _ = _report(tmp_path, "python:tests/python/faulty_kernels.py:decode_raises")
    assert proc.returncode == 2 and "declares no planted bugs" in proc.stdout, describe(proc)
