"""supports() sees sizes only: mlafuzz asks it once per distinct set of scalar fields."""

from __future__ import annotations

import pytest

import mlafuzz.testing
from conftest import SMALL_CASE, describe, mlafuzz_cmd

KERNEL = "python:tests/python/supports_kernels.py:decode"


def test_run_asks_supports_once(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "supports.log"
    monkeypatch.setenv("SUPPORTS_LOG", str(log))
    proc = mlafuzz_cmd("run", "--case", SMALL_CASE, "--backends", KERNEL)
    assert proc.returncode == 0, describe(proc)
    # unsupported() and then run() both need the verdict: one question.
    asked = log.read_text().splitlines()
    assert len(asked) == 1 and "('heads', 3)" in asked[0], describe(proc)


def test_campaign_keeps_verdicts_and_refusals(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "supports.log"
    monkeypatch.setenv("SUPPORTS_LOG", str(log))
    result = mlafuzz.testing.fuzz(KERNEL, time="120s", cases=30, seed=5, jobs=1)
    asked = log.read_text().splitlines()
    # One worker, one process: each distinct set of fields is asked about once (the clean run
    # and the determinism variant alone would ask twice each without the cache).
    assert asked and len(asked) == len(set(asked)), f"{len(asked) - len(set(asked))} repeats"
    # What supports() refused stays refused (not applicable), cached or not.
    refused = [r for r in result.report["results"]
               if r["property"] == "run" and r.get("not_applicable", 0) > 0]
    assert refused, result.report["results"]
