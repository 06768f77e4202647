"""A complete python: kernel written from docs/python.md alone (its "A complete kernel").

numpy, the fp32 (SIMT) pipeline: both cache layouts, every convention, sinks, topk_length, s_q
query tokens per batch row and the extra cache, one head at a time. It passes every property:

    mlafuzz fuzz --backends python:examples/python/contract_kernel.py:decode --cases 300

tests/python/test_contract_page.py checks that this file is the page's code, word for word.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

import mlafuzz


def e4m3(codes: np.ndarray) -> np.ndarray:
    """float32 values of e4m3fn bytes: sign, 4 exponent bits (bias 7), 3 mantissa bits."""
    c = codes.astype(np.int32)
    sign = np.where(c & 0x80, -1.0, 1.0)
    exp, man = (c >> 3) & 0xF, c & 0x7
    mag = np.where(exp == 0, man * 2.0**-9, (8 + man) * np.exp2(exp - 10.0))
    mag = np.where((exp == 15) & (man == 7), np.nan, mag)  # 0x7f and 0xff
    return (sign * mag).astype(np.float32)


def keys(call: mlafuzz.DecodeCall, cache: np.ndarray, page_size: int,
         slots: np.ndarray) -> np.ndarray:
    """float32 [n, d_qk]: K of the given global slots of one cache (main or extra)."""
    nope, rope, tile = call.nope_dim, call.rope_dim, call.scale_tile
    tiles = nope // tile
    page = (slots // page_size)[:, None]
    j = (slots % page_size)[:, None]
    if call.layout == "model1":
        row = nope + 2 * rope  # a token's data row; the pages' scale rows follow the data rows
        codes = cache[page, j * row + np.arange(nope)]
        rope_bytes = cache[page, j * row + nope + np.arange(2 * rope)]
        scale_at = page_size * row + j * ((tiles + 7) // 8 * 8)
        exps = cache[page, scale_at + np.arange(tiles)].astype(np.int32)
        scales = np.ldexp(np.float32(1), exps - 127).astype(np.float32)
    else:  # "v32": [nope e4m3][tiles float32 scales][rope bf16] per token
        base = j * call.token_bytes
        codes = cache[page, base + np.arange(nope)]
        scales = np.ascontiguousarray(cache[page, base + nope + np.arange(4 * tiles)])
        scales = scales.view("<f4").astype(np.float32)
        rope_bytes = cache[page, base + nope + 4 * tiles + np.arange(2 * rope)]
    k_nope = e4m3(codes) * np.repeat(scales, tile, axis=1)
    k_rope = mlafuzz.bf16_to_float32(np.ascontiguousarray(rope_bytes).view("<u2"))
    return np.concatenate([k_nope, k_rope], axis=1)


def counted(call: mlafuzz.DecodeCall, idx: np.ndarray, length: Optional[int]) -> np.ndarray:
    """int64 slots of the entries of one index list that count."""
    ok = idx != -1 if call.invalid_index_rule == "minus_one_only" else idx >= 0
    if length is not None:
        ok &= np.arange(idx.shape[0]) < length
    return idx[ok].astype(np.int64)


@mlafuzz.kernel(name="contract-numpy", precision="fp32_simt", device="cpu",
                envelope=mlafuzz.Envelope(extra_cache=True))
def decode(call: mlafuzz.DecodeCall) -> None:
    """numpy fp32 kernel written from the contract page."""
    t = call.s_q > 1  # with one query token the arrays have no token axis: add it
    q = call.q if t else call.q[:, None]
    idx = call.indices if t else call.indices[:, None]
    out = call.out if t else call.out[:, None]
    lse = call.lse if t else call.lse[:, None]
    xidx = None
    if call.has_extra:
        xidx = call.extra_indices if t else call.extra_indices[:, None]
    scale = np.float32(call.sm_scale)
    empty = np.float32(np.inf if call.empty_row_lse == "+inf" else -np.inf)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for b in range(call.batch):
            length = None if call.topk_length is None else call.topk_length[b]
            for s in range(call.s_q):
                k = [keys(call, call.kv_cache, call.page_size, counted(call, idx[b, s], length))]
                if xidx is not None:
                    xlen = None if call.extra_topk_length is None else call.extra_topk_length[b]
                    slots = counted(call, xidx[b, s], xlen)
                    k.append(keys(call, call.extra_kv_cache, call.extra_page_size, slots))
                k_all = np.concatenate(k)  # [n, d_qk]: one softmax over both lists
                if k_all.shape[0] == 0:
                    out[b, s] = 0
                    lse[b, s] = empty
                    continue
                v = np.ascontiguousarray(k_all[:, : call.d_v])
                qs = mlafuzz.bf16_to_float32(q[b, s]) * scale  # [H, d_qk], q * sm_scale in fp32
                for h in range(call.heads):  # one head at a time: the same bits for any H
                    x = k_all @ np.array(qs[h])  # [n] fp32 logits
                    m = x.max()
                    p = np.exp(x - m)
                    total = p.sum(dtype=np.float32)
                    denom = total
                    if call.sink is not None:
                        denom = total + np.exp(call.sink[h] - m)  # +inf sink: out 0
                    out[b, s, h] = mlafuzz.float32_to_bf16((p @ v) / denom)
                    value = m + np.log(total)
                    if call.sink is not None and call.sink_in_lse:
                        value = np.logaddexp(value, call.sink[h])
                    lse[b, s, h] = value
