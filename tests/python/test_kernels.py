"""The numpy example kernel passes every property; its planted bug is found and shrunk."""

from __future__ import annotations

import pytest

import mlafuzz.testing
from conftest import NUMPY_KERNEL, full_or_quick


def test_numpy_kernel_passes_every_property() -> None:
    # 30 cases under MLAFUZZ_TEST_QUICK: each property is still evaluated.
    result = mlafuzz.testing.fuzz(f"{NUMPY_KERNEL}:decode", time="120s",
                                  cases=full_or_quick(80, 30), seed=12, jobs=2)
    rows = result.report["results"]
    properties = {r["property"] for r in rows}
    assert {"tolerance", "poison", "relocate", "determinism", "head-alone", "batch-alone",
            "permute", "insert-invalid", "run"} <= properties, f"properties evaluated: {properties}"
    assert all(r["failures"] == 0 for r in rows), rows


def test_planted_bug_is_found_and_shrunk_to_one_row_and_head(tmp_path) -> None:
    with pytest.raises(AssertionError) as failure:
        mlafuzz.testing.fuzz(f"{NUMPY_KERNEL}:decode_planted_bug", time="120s", cases=16, seed=3,
                             properties=["tolerance"], jobs=2, corpus=str(tmp_path / "corpus"))
    message = str(failure.value)
    # One bug, one entry: its group, the property it fails, its size and where it fails.
    assert "1 bug(s)" in message and "[2]" not in message, message
    assert ":decode_planted_bug | bound excess |" in message, message
    assert "fails tolerance" in message, message
    assert "counterexample: B=1 H=1 " in message, message
    assert "where: out[b0,h0] wrong" in message, message
    assert "/mlafuzz repro /" in message, message

    # Every saved entry replays as still failing, and passes on the correct kernel.
    entries = [p.values[0] for p in mlafuzz.testing.corpus(str(tmp_path / "corpus"))]
    assert entries, "no corpus entry saved"
    for entry in entries:
        with pytest.raises(AssertionError, match="still failing"):
            entry.replay()
        out = entry.replay(backends=f"{NUMPY_KERNEL}:decode")
        assert "fixed" in out, out
