"""Python kernels that stall, for the time-budget tests (tests/python/test_time_budget.py).

Each hangs, stops itself or crawls whatever the case; the one with a bug in its results
(slow-wrong) is numpy_decode's fp32 pipeline otherwise. Cases of the production decode (s_q > 1,
an extra cache) are refused, as numpy_decode refuses them.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import mlafuzz

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import numpy_decode  # noqa: E402

supports = numpy_decode.supports


@mlafuzz.kernel(name="sleeps", precision="fp32_simt")
def decode_sleeps(call: mlafuzz.DecodeCall) -> None:
    """Hangs on its first call (and on every call)."""
    time.sleep(1000)


_calls = 0


def _hang_from_call(n: int) -> None:
    """Counts this call of the worker process; from its n-th call on, never returns."""
    global _calls
    _calls += 1
    while _calls >= n:
        time.sleep(0.05)


@mlafuzz.kernel(name="hangs-on-fifth-call", precision="fp32_simt")
def decode_hangs_fifth(call: mlafuzz.DecodeCall) -> None:
    """Correct for the first four calls of its worker process, then never returns."""
    _hang_from_call(5)
    numpy_decode.attend(call)


@mlafuzz.kernel(name="stops-itself", precision="fp32_simt")
def decode_stops_itself(call: mlafuzz.DecodeCall) -> None:
    """Stops its own process (SIGSTOP) on every call: a hang no handler in it can see."""
    os.kill(os.getpid(), signal.SIGSTOP)
    numpy_decode.attend(call)


@mlafuzz.kernel(name="slow-wrong", precision="fp32_simt")
def decode_slow_wrong(call: mlafuzz.DecodeCall) -> None:
    """Takes 0.2 s per call; from two heads on, the first element of head 1 is 10."""
    time.sleep(0.2)
    numpy_decode.attend(call)
    if call.heads >= 2:
        call.out[..., 1, 0] = 0x4120  # bf16 10.0


@mlafuzz.kernel(name="wrong-then-hangs", precision="fp32_simt")
def decode_wrong_then_hangs(call: mlafuzz.DecodeCall) -> None:
    """Writes zeros on the first call of its worker process, then never returns."""
    _hang_from_call(2)
    call.out[...] = 0
    call.lse[...] = 0
