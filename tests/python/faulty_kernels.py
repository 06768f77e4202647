"""Broken Python kernels, one per way a kernel can misbehave (tests/python/test_python_backend.py).

Each is correct (numpy_decode's fp32 pipeline) on cases with fewer than two heads, so that
mlafuzz has a passing neighbour to shrink towards, and misbehaves from two heads on.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import mlafuzz

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import numpy_decode  # noqa: E402


@mlafuzz.kernel(name="raises", precision="fp32_simt")
def decode_raises(call: mlafuzz.DecodeCall) -> None:
    """Raises an exception from two heads on."""
    if call.heads >= 2:
        raise ValueError(f"planted exception at heads={call.heads}")
    numpy_decode.attend(call)


@mlafuzz.kernel(name="hangs", precision="fp32_simt")
def decode_hangs(call: mlafuzz.DecodeCall) -> None:
    """Never returns from two heads on."""
    while call.heads >= 2:
        time.sleep(0.05)
    numpy_decode.attend(call)


@mlafuzz.kernel(name="exits", precision="fp32_simt")
def decode_exits(call: mlafuzz.DecodeCall) -> None:
    """Calls os._exit(3) from two heads on."""
    if call.heads >= 2:
        os._exit(3)
    numpy_decode.attend(call)


@mlafuzz.kernel(name="writes-between-heads", precision="fp32_simt")
def decode_writes_between_heads(call: mlafuzz.DecodeCall) -> None:
    """Writes d_v + 1 elements per head (an off-by-one into the padding or the guard)."""
    numpy_decode.attend(call)
    out = call.out
    wide = np.lib.stride_tricks.as_strided(
        out, shape=(call.batch, call.heads, call.d_v + 1), strides=out.strides
    )
    wide[:, :, call.d_v] = 0x3F80  # bf16 1.0 where no output belongs


def not_decorated(call: mlafuzz.DecodeCall) -> None:
    """A plain function: mlafuzz must refuse it."""


@mlafuzz.kernel(name="writes-its-input", precision="fp32_simt")
def decode_writes_input(call: mlafuzz.DecodeCall) -> None:
    """Writes into the cache (inputs are read-only: the kernel's write raises)."""
    call.kv_cache[0, 0] = 0
    numpy_decode.attend(call)


@mlafuzz.kernel(name="one-hop", precision="fp32_simt")
def decode_one_hop(call: mlafuzz.DecodeCall) -> None:
    """Correct, but raises when its worker's parent is a `mlafuzz worker` (two hops)."""
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    if b"worker" in argv:
        raise RuntimeError(f"two hops: the parent of this worker is {argv}")
    numpy_decode.attend(call)


@mlafuzz.kernel(name="writes-floats", precision="fp32_simt")
def decode_writes_floats(call: mlafuzz.DecodeCall) -> None:
    """Writes float32 values into the bf16 out (a common slip): an error, not garbage bits."""
    call.out[...] = np.zeros(call.out.shape, dtype=np.float32)
    call.lse[...] = 0


@mlafuzz.kernel(name="no-production-decode", precision="fp32_simt")
def decode_without_production_decode(call: mlafuzz.DecodeCall) -> None:
    """Correct on one query token without an extra cache, raises on the production decode; it
    declares no envelope, so mlafuzz generates both."""
    if call.s_q > 1 or call.has_extra:
        raise NotImplementedError("one query token, no extra cache")
    numpy_decode.attend(call)
