"""triton-mma: the head-tiled sparse-decode kernel in Triton, on tl.dot (docs/SPEC.md 4, MMA).

    mlafuzz fuzz --backends triton-mma,triton-simt --time 5m
    (aliases of python:<mlafuzz>/kernels/triton/triton_mma.py:decode and triton_simt.py:decode)

One program per (batch row, block of BLOCK_H heads; BLOCK_H a tl.constexpr, 16, 32 or 64: 64
for triton-mma on the mma2 path, 32 on v1; see PATH below and docs/backends.md for the split).
Each tile of 32 tokens is gathered from the paged cache and dequantized once for all heads of
the block: K in bf16 (exact with power-of-two scales), Q*K^T with tl.dot (bf16 inputs,
fp32 accumulation), logits scaled by sm_scale in fp32 after the product, online softmax with
p = exp(x - m) in fp32, p rounded to bf16 for the P*V tl.dot while the row sum adds the fp32 p,
O in fp32, divided by l plus the sink term and rounded to bf16. Nope is padded to NOPE_PAD (the
next power of two: 448 -> 512) with the padded columns masked on load and never stored.

Planted bugs (MUTANTS below): ``mutant_<name>`` functions, backend ``triton-mma~<name>``, each a
MUTANT tl.constexpr value, so its code is compiled only when that variant runs.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

import mlafuzz
from mlafuzz import _settings

from .mla_triton import (  # noqa: F401 - unavailable(): the worker asks the module
    ENVELOPE, MMA2_BLOCK_N, MMA_BLOCK_N, compilations, launch, launch2, unavailable)
from .mla_triton import supports as _supports

#: The kernel that triton-mma (and its mutants, h16, h64) runs: "mma2" (mma2_kernel: the token
#: list split in SPLIT_TOKENS pieces merged by combine_kernel, the 16-byte gather and hardware
#: e4m3 decode where rows are aligned) or "v1" (mma_kernel: one program per row and head
#: block, byte-wise gather). MLAFUZZ_TRITON_MMA_PATH=v1 picks v1.
PATH = _settings.text("MLAFUZZ_TRITON_MMA_PATH") or "mma2"
if PATH not in ("mma2", "v1"):
    raise ValueError(f"MLAFUZZ_TRITON_MMA_PATH={PATH!r}: use mma2 or v1")


#: BLOCK_H of triton-mma and its mutants: 64 on mma2 (every K tile dequantized once for all 64
#: heads of a production row: 71.6 vs 85.2 us at B=32 H=64 topk=512 on the H200), 32 on v1.
DEFAULT_BLOCK_H = 64 if PATH == "mma2" else 32
#: Tokens per online-softmax tile of what triton-mma runs (declared as its token_tile, so that
#: the tolerance bound counts its rescales): 64 on mma2, 32 on v1.
TOKEN_TILE = MMA2_BLOCK_N if PATH == "mma2" else MMA_BLOCK_N


#: mma2 options, on the aligned fast gather only. FP8CVT, the hardware e4m3 decode, is on unless
#: MLAFUZZ_TRITON_MMA_FP8CVT=0: it gives the integer decode's bits for all 256 bytes (a GPU test
#: checks it) and is 12-14 % faster on the H200 (bench/RESULTS.md, Triton kernel speed).
#: PREFETCH (MLAFUZZ_TRITON_MMA_PREFETCH=1: the next tile's loads issued before this
#: tile's math) is off: it was slower.
FP8CVT = _settings.flag("MLAFUZZ_TRITON_MMA_FP8CVT", True)
PREFETCH = _settings.flag("MLAFUZZ_TRITON_MMA_PREFETCH", False)


def _run(call: mlafuzz.DecodeCall, block_h: int, mutant: int = 0) -> None:
    if PATH == "v1":
        launch(call, "mma_kernel", block_h=block_h, mutant=mutant)
    else:
        launch2(call, block_h=block_h, mutant=mutant, fp8cvt=FP8CVT, prefetch=PREFETCH)


#: The planted bugs of this kernel: name -> what is wrong (mutant names follow
#: mla/mutants.h where the class exists there).
MUTANTS: Dict[str, str] = {
    "unmasked-pad-columns": "q and K columns nope..NOPE_PAD-1 not masked on load (read from the "
                            "bytes after the nope part, with the scale byte past the last tile)",
    "wrong-scale-group": "the last nope tile (beside the padding) uses the previous tile's scale",
    "page-size-pow2": "page = idx // next_pow2(P), slot = idx % next_pow2(P): wrong for P = 61",
    "invalid-index-unmasked": "-1 entries masked in Q*K^T but their rows (slot 0) still loaded "
                              "into P*V",
    "no-rescale": "online softmax does not rescale O and l when the running max grows",
    "store-padded-columns": "padded columns nope..NOPE_PAD-1 stored (over the rope dims, or past "
                            "d_v into the next head's row)",
    "topk-length-off-by-one": "one entry past topk_length counts",
    "drop-partial-tile": "the partial last token tile is skipped",
    "sink-ignored": "the sink term left out of the denominator",
}

_MUTANT_IDS = {
    "unmasked-pad-columns": 1, "wrong-scale-group": 2, "page-size-pow2": 3,
    "invalid-index-unmasked": 4, "no-rescale": 5, "store-padded-columns": 6,
    "topk-length-off-by-one": 7, "drop-partial-tile": 8, "sink-ignored": 9,
}


def supports(call: mlafuzz.DecodeCall) -> Optional[str]:
    """Sizes only (the arrays are None here)."""
    return _supports(call)


@mlafuzz.kernel(name="triton-mma", precision="bf16_mma", device="cuda",
                envelope=ENVELOPE, token_tile=TOKEN_TILE)
def decode(call: mlafuzz.DecodeCall) -> None:
    """Triton head-tiled kernel (tl.dot bf16, fp32 accumulation, BLOCK_H DEFAULT_BLOCK_H)."""
    _run(call, DEFAULT_BLOCK_H)


@mlafuzz.kernel(name="triton-mma-h16", precision="bf16_mma", device="cuda",
                envelope=ENVELOPE, token_tile=TOKEN_TILE)
def decode_h16(call: mlafuzz.DecodeCall) -> None:
    """Triton head-tiled kernel, BLOCK_H 16."""
    _run(call, 16)


@mlafuzz.kernel(name="triton-mma-h64", precision="bf16_mma", device="cuda",
                envelope=ENVELOPE, token_tile=TOKEN_TILE)
def decode_h64(call: mlafuzz.DecodeCall) -> None:
    """Triton head-tiled kernel, BLOCK_H 64."""
    _run(call, 64)


@mlafuzz.kernel(name="triton-mma-v1", precision="bf16_mma", device="cuda",
                envelope=ENVELOPE, token_tile=MMA_BLOCK_N)
def decode_v1(call: mlafuzz.DecodeCall) -> None:
    """mma_kernel as first shipped (no split, byte-wise gather), BLOCK_H 32, whatever PATH."""
    launch(call, "mma_kernel", block_h=32)


def _make_mutant(name: str) -> Callable[[mlafuzz.DecodeCall], None]:
    mutant_id = _MUTANT_IDS[name]

    def run(call: mlafuzz.DecodeCall) -> None:
        _run(call, DEFAULT_BLOCK_H, mutant_id)

    run.__name__ = "mutant_" + name.replace("-", "_")
    return mlafuzz.kernel(name=f"triton-mma.{name}", precision="bf16_mma", device="cuda",
                          description=f"planted bug '{name}' in triton-mma: {MUTANTS[name]}",
                          envelope=ENVELOPE, token_tile=TOKEN_TILE)(run)


# mutant_unmasked_pad_columns, mutant_wrong_scale_group, ...: python:triton_mma.py:mutant_<name>
for _name in MUTANTS:
    globals()["mutant_" + _name.replace("-", "_")] = _make_mutant(_name)
del _name
