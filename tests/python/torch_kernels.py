"""device="cuda" kernels for tests/python/test_torch_worker.py (needs torch and a GPU)."""

from __future__ import annotations

import mlafuzz


@mlafuzz.kernel(name="torch-writes-cache", precision="bf16_mma", device="cuda")
def decode_writes_cache(call: mlafuzz.DecodeCall) -> None:
    """Writes zeros as its outputs and flips one byte of its kv_cache input on the device."""
    call.out.zero_()
    call.lse.zero_()
    call.kv_cache[0, 0] ^= 0xFF


@mlafuzz.kernel(name="torch-zeros", precision="bf16_mma", device="cuda")
def decode_zeros(call: mlafuzz.DecodeCall) -> None:
    """Writes zeros: every element written, nothing read (the worker's own path under test)."""
    call.out.zero_()
    call.lse.zero_()


_CALLS = [0]


@mlafuzz.kernel(name="torch-writes-cache-later", precision="bf16_mma", device="cuda")
def decode_writes_cache_later(call: mlafuzz.DecodeCall) -> None:
    """As decode_writes_cache, on its worker's even-numbered calls only: a rerun of a case
    (determinism) finds its inputs in the device cache, so this write is caught on a hit."""
    _CALLS[0] += 1
    call.out.zero_()
    call.lse.zero_()
    if _CALLS[0] % 2 == 0:
        call.kv_cache[0, 0] ^= 0xFF
