"""A Python kernel that declares an envelope and an inexact invariant (tests/python/test_cli.py).

numpy_decode's fp32 pipeline, declared FlashMLA-like: MODEL1 448 + 64 only, at most 64 heads,
topk a multiple of 64, page stride a multiple of 16, FlashMLA's conventions, one query token
and no extra cache (numpy_decode's limits); batch-alone is
declared inexact (checked within the bound instead of bit for bit).
"""

from __future__ import annotations

import os
import sys

import mlafuzz

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import numpy_decode  # noqa: E402

FLASHMLA_LIKE = mlafuzz.Envelope(
    layouts=["model1"],
    nope_dim=[448],
    rope_dim=[64],
    scale_tile=64,
    heads=range(1, 65),
    topk=mlafuzz.Multiple(64),
    page_stride_multiple=16,
    invalid_index_rules=["minus_one_only"],
    empty_row_lses=["+inf"],
    sink_in_lse=[False],
    # numpy_decode implements the one-token decode only (its supports() says so too).
    s_q=[1],
    refuses=["extra_cache", "extra_topk_length"],
)

supports = numpy_decode.supports


@mlafuzz.kernel(name="numpy-flashmla-like", precision="fp32_simt", envelope=FLASHMLA_LIKE,
                inexact=["batch"])
def decode(call: mlafuzz.DecodeCall) -> None:
    """numpy fp32 decode inside a FlashMLA-like envelope."""
    numpy_decode.attend(call)


@mlafuzz.kernel(name="numpy-lse-merged-declared", precision="fp32_simt", envelope=FLASHMLA_LIKE,
                extra_pipeline="lse_merged")
def decode_lse_merged(call: mlafuzz.DecodeCall) -> None:
    """The same kernel, declaring the LSE-merged extra-cache pipeline (plugin-info shows it)."""
    numpy_decode.attend(call)


@mlafuzz.kernel(name="numpy-tile8-declared", precision="fp32_simt", envelope=FLASHMLA_LIKE,
                inexact=["batch"], token_tile=8)
def decode_tile8(call: mlafuzz.DecodeCall) -> None:
    """The same kernel as decode, declaring 8-token softmax tiles: a larger tolerance bound."""
    numpy_decode.attend(call)
