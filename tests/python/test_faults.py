"""Kernels that raise, exit, hang or write between heads: each a run failure or a finding."""

from __future__ import annotations

import pytest

import mlafuzz.testing
from conftest import FAULTY, SMALL_CASE, describe, mlafuzz_cmd


def _fuzz_failure(func: str, **kw) -> str:
    with pytest.raises(AssertionError) as failure:
        mlafuzz.testing.fuzz(f"{FAULTY}:{func}", time="100s", seed=4, jobs=1, **kw)
    return str(failure.value)


def test_exception_is_a_run_failure_with_the_traceback() -> None:
    proc = mlafuzz_cmd("run", "--case", SMALL_CASE, "--backends", f"{FAULTY}:decode_raises")
    assert proc.returncode == 1, describe(proc)
    assert "the kernel raised an exception" in proc.stdout, describe(proc)
    assert "ValueError: planted exception at heads=3" in proc.stdout, describe(proc)
    assert 'faulty_kernels.py", line' in proc.stdout, describe(proc)


def test_exception_in_a_campaign_is_a_run_finding() -> None:
    message = _fuzz_failure("decode_raises", cases=4, shrink_time="10m")
    assert "[1] python:" in message and ":decode_raises | run error |" in message, message
    assert "[2]" not in message, message
    assert "counterexample: B=1 H=2 " in message, message
    assert "ValueError: planted exception at heads=2" in message, message


def test_os_exit_is_a_fault_and_the_campaign_goes_on() -> None:
    message = _fuzz_failure("decode_exits", cases=3, shrink_time="0")
    assert ":decode_exits | fault |" in message, message
    assert "exited with status 3" in message, message


def test_hang_is_a_fault_after_the_case_timeout() -> None:
    message = _fuzz_failure("decode_hangs", cases=2, shrink_time="0", case_timeout="2s")
    assert ":decode_hangs | fault |" in message, message
    assert "no reply within the case timeout (hang)" in message, message


def test_hang_in_run_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLAFUZZ_PYTHON_TIMEOUT", "2")
    proc = mlafuzz_cmd("run", "--case", SMALL_CASE, "--backends", f"{FAULTY}:decode_hangs")
    assert proc.returncode == 1, describe(proc)
    assert "FAULT" in proc.stdout and "no reply within the case timeout" in proc.stdout, \
        describe(proc)


def test_write_between_heads_trips_the_canaries() -> None:
    message = _fuzz_failure("decode_writes_between_heads", cases=4, shrink_time="10m",
                            properties=["poison"])
    assert ":decode_writes_between_heads | guard write |" in message, message
    assert "guard elements overwritten" in message, message


def test_inputs_are_read_only() -> None:
    # Inputs read where the case was materialized (the shared arena, a read-only mapping) and
    # those copied into the call's shared memory (vectors under 64 KiB) alike.
    proc = mlafuzz_cmd("run", "--case", SMALL_CASE, "--backends", f"{FAULTY}:decode_writes_input")
    assert proc.returncode == 1, describe(proc)
    assert "the kernel raised an exception" in proc.stdout, describe(proc)
    assert "read-only" in proc.stdout, describe(proc)


def test_the_campaign_talks_to_the_python_worker_directly() -> None:
    # One hop: the Python worker's parent is the campaign (mlafuzz fuzz), not a `mlafuzz worker`.
    result = mlafuzz.testing.fuzz(f"{FAULTY}:decode_one_hop", time="100s", cases=3, seed=4,
                                  jobs=2, properties=["run"])
    assert all(r["failures"] == 0 for r in result.report["results"]), result.report["results"]
