"""triton-simt: the old per-head sparse-decode kernel in Triton, fp32 throughout (docs/SPEC.md 4).

    mlafuzz fuzz --backends triton-simt --time 5m
    (the alias of python:<mlafuzz>/kernels/triton/triton_simt.py:decode)

One program per (batch row, head), so every head gathers and dequantizes the selected tokens
again: q * sm_scale in fp32, K and V dequantized to fp32 in tiles of 16 tokens, dot products,
online softmax and P*V in fp32, out rounded to bf16. Nope is padded to the next power of two
(tl.arange needs one) and the padded columns are masked on load and never stored. Both cache
layouts, any page size and stride, both invalid-index rules, topk_length, sinks (+-inf too),
sink_in_lse, both empty-row LSE conventions, strided q and out. Needs torch, triton and a GPU.
"""

from __future__ import annotations

from typing import Optional

import mlafuzz

from .mla_triton import (  # noqa: F401 - unavailable(): the worker asks the module
    ENVELOPE, SIMT_BLOCK_N, compilations, launch, unavailable)
from .mla_triton import supports as _supports


def supports(call: mlafuzz.DecodeCall) -> Optional[str]:
    """Sizes only (the arrays are None here)."""
    return _supports(call)


@mlafuzz.kernel(name="triton-simt", precision="fp32_simt", device="cuda",
                envelope=ENVELOPE, token_tile=SIMT_BLOCK_N)
def decode(call: mlafuzz.DecodeCall) -> None:
    """Triton SIMT per-head kernel (fp32; one program per row and head)."""
    launch(call, "simt_kernel")
