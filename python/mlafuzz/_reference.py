"""Decoding helpers and a float64 reference for kernel authors (docs/python.md).

Everything here works on a host call (numpy arrays: a ``device="cpu"`` kernel's call, or one
that :func:`mlafuzz.replay` built) and follows the contract page: the cache layouts, the
invalid-index rule, ``topk_length``, the sink, the extra cache and ``s_q``. mlafuzz's own
reference is the C++ float64 oracle; this module is for writing and debugging kernels.
"""

from __future__ import annotations

from typing import Any, Tuple

import numpy as np


def _e4m3_table(dtype: Any) -> np.ndarray:
    b = np.arange(256)
    sign = np.where(b >> 7, -1.0, 1.0)
    exp, man = (b >> 3) & 0xF, b & 0x7
    value = np.where(exp == 0, man * 2.0**-9, (8 + man) * np.exp2(exp - 10.0))
    value = np.where((exp == 15) & (man == 7), np.nan, value)
    return (sign * value).astype(dtype)


_E4M3_32 = _e4m3_table(np.float32)
_E4M3_64 = _e4m3_table(np.float64)


def e4m3_to_float32(codes: Any) -> np.ndarray:
    """float8 e4m3fn bytes -> float32, exactly.

    e4m3fn: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal
    (mantissa * 2^-9); 0x7f and 0xff are NaN; no infinities; the largest value is 448.

    Args:
        codes: uint8 array (any shape) of e4m3fn bit patterns.
    Returns:
        float32 array of the same shape.
    """
    return _E4M3_32[np.asarray(codes, dtype=np.uint8)]


def ue8m0_to_float32(codes: Any) -> np.ndarray:
    """ue8m0 scale bytes (MODEL1) -> float32 scales 2^(byte - 127), exactly; 255 is NaN.

    Args:
        codes: uint8 array (any shape).
    Returns:
        float32 array of the same shape (byte 0 gives 2^-127, a float32 subnormal).
    """
    e = np.asarray(codes, dtype=np.uint8).astype(np.int32)
    return np.where(e == 255, np.nan, np.ldexp(1.0, e - 127)).astype(np.float32)


def _bf16_pairs(raw: np.ndarray) -> np.ndarray:
    """[..., 2n] little-endian bytes -> [..., n] float64 bf16 values."""
    bits = raw[..., 0::2].astype(np.uint32) | (raw[..., 1::2].astype(np.uint32) << 8)
    return (bits << np.uint32(16)).view(np.float32).astype(np.float64)


def _lists(call: Any, extra: bool) -> Tuple[Any, np.ndarray]:
    """(lengths, indices [B, s_q, topk]) of the main or the extra list."""
    if extra:
        if not call.has_extra:
            raise ValueError("this call has no extra cache (call.has_extra is False)")
        lengths, idx = call.extra_topk_length, call.extra_indices
    else:
        lengths, idx = call.topk_length, call.indices
    idx = np.asarray(idx)
    if call.s_q == 1 and idx.ndim == 2:
        idx = idx[:, None, :]
    return lengths, idx


def valid_entries(call: Any, extra: bool = False) -> np.ndarray:
    """bool ``[B, (s_q,) topk]``: which top-k entries count (the index lists' shape).

    An entry counts when it is not invalid (``invalid_index_rule``: "minus_one_only" makes
    only -1 invalid, "any_negative" every negative index) and its position is below the row's
    ``topk_length`` (when the call has one; the s_q lists of a row share it).

    Args:
        call: a host call.
        extra: the extra cache's lists (``extra_indices``, ``extra_topk_length``) instead.
    """
    lengths, idx = _lists(call, extra)
    ok = idx != -1 if call.invalid_index_rule == "minus_one_only" else idx >= 0
    if lengths is not None:
        positions = np.arange(idx.shape[-1])
        ok = ok & (positions[None, None, :] < np.asarray(lengths)[:, None, None])
    return ok if call.s_q > 1 else ok[:, 0, :]


def token_parts(call: Any, slots: Any, extra: bool = False
                ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the cache stores for the given global slots, read per the call's layout.

    Args:
        call: a host call.
        slots: int ``[n]`` global slots (page = slot // page_size, slot in page = slot %
            page_size), each a valid entry's.
        extra: read the extra cache (its own page size) instead of the main cache.
    Returns:
        (e4m3 codes uint8 ``[n, nope_dim]``, scales float32 ``[n, nope_dim // scale_tile]``,
        rope float32 ``[n, rope_dim]`` (bf16 values)). K of a slot is
        ``e4m3_to_float32(codes) * np.repeat(scales, scale_tile, axis=1)`` followed by rope.
    """
    cache = np.asarray(call.extra_kv_cache if extra else call.kv_cache)
    page_size = int(call.extra_page_size if extra else call.page_size)
    slots = np.asarray(slots, dtype=np.int64)
    nope, rope, tile = call.nope_dim, call.rope_dim, call.scale_tile
    tiles = nope // tile
    page = (slots // page_size)[:, None]
    j = (slots % page_size)[:, None]
    if call.layout == "model1":
        data_bytes = nope + 2 * rope
        base = j * data_bytes
        codes = cache[page, base + np.arange(nope)]
        rope_raw = cache[page, base + nope + np.arange(2 * rope)]
        scale_row = (tiles + 7) // 8 * 8
        exps = cache[page, page_size * data_bytes + j * scale_row + np.arange(tiles)]
        scales = ue8m0_to_float32(exps)
    else:  # v32: [nope e4m3][tiles x float32 scale][rope bf16] per token
        base = j * call.token_bytes
        codes = cache[page, base + np.arange(nope)]
        raw = np.ascontiguousarray(cache[page, base + nope + np.arange(4 * tiles)])
        scales = raw.view("<f4").astype(np.float32)
        rope_raw = cache[page, base + nope + 4 * tiles + np.arange(2 * rope)]
    return codes, scales, _bf16_pairs(rope_raw).astype(np.float32)


def _keys(call: Any, extra: bool, slots: np.ndarray, dtype: Any) -> np.ndarray:
    """Dequantized K ``[n, d_qk]`` of the given global slots (int64 ``[n]``, all valid)."""
    codes, scales, rope = token_parts(call, slots, extra)
    table = _E4M3_64 if dtype == np.float64 else _E4M3_32
    k_nope = table[codes] * np.repeat(scales.astype(dtype), call.scale_tile, axis=1)
    return np.concatenate([k_nope, rope.astype(dtype)], axis=1)


def dequantize(call: Any, extra: bool = False) -> np.ndarray:
    """The selected tokens of every top-k entry, dequantized: float32 ``[B, (s_q,) topk, d_qk]``.

    Entry k of row b holds K of slot ``indices[b, k]`` (nope dims e4m3 times their scale, then
    the bf16 rope dims); entries that do not count (:func:`valid_entries`) are 0. V of an entry
    is its first ``d_v`` dims.

    Args:
        call: a host call.
        extra: the extra cache's entries instead of the main cache's.
    """
    idx = _lists(call, extra)[1]
    ok = valid_entries(call, extra).reshape(idx.shape)
    out = np.zeros(idx.shape + (call.d_qk,), dtype=np.float32)
    slots = idx[ok].astype(np.int64)
    if slots.size:
        out[ok] = _keys(call, extra, slots, np.float32)
    return out if call.s_q > 1 else out[:, 0]


def reference_decode(call: Any) -> Tuple[np.ndarray, np.ndarray]:
    """The call's exact result in float64: (out ``[B, (s_q,) H, d_v]``, lse ``[B, (s_q,) H]``).

    For each batch row, query token and head: one softmax over the entries that count of the
    main list and of the extra list (a slot in both counts twice); logits
    ``x = sm_scale * <q, K>`` over all d_qk dims; ``lse = ln sum exp(x)`` without the sink
    (with it when ``sink_in_lse``); ``out = sum exp(x) V / (sum exp(x) + exp(sink[h]))``; a
    row with no entry: out 0 and lse +inf or -inf per ``empty_row_lse``.

    Args:
        call: a host call (q as bf16 bits).
    """
    q = np.asarray(call.q)
    if call.s_q == 1 and q.ndim == 3:
        q = q[:, None]
    qf = (q.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    B, S, H = call.batch, call.s_q, call.heads
    out = np.zeros((B, S, H, call.d_v))
    lse = np.empty((B, S, H))
    empty = np.inf if call.empty_row_lse == "+inf" else -np.inf
    sink = None if call.sink is None else np.asarray(call.sink, dtype=np.float64)
    lists = [(False, valid_entries(call).reshape(B, S, -1))]
    if call.has_extra:
        lists.append((True, valid_entries(call, extra=True).reshape(B, S, -1)))
    scale = float(np.float32(call.sm_scale))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for b in range(B):
            for s in range(S):
                keys = []
                for extra, ok in lists:
                    idx = _lists(call, extra)[1]
                    slots = idx[b, s][ok[b, s]].astype(np.int64)
                    if slots.size:
                        keys.append(_keys(call, extra, slots, np.float64))
                if not keys:
                    lse[b, s] = empty
                    continue
                k = np.concatenate(keys)
                x = scale * (qf[b, s, :, : call.d_qk] @ k.T)  # [H, n]
                m = x.max(axis=1)
                w = np.exp(x - m[:, None])
                total = w.sum(axis=1)
                lse[b, s] = m + np.log(total)
                denom = total
                if sink is not None:
                    denom = total + np.exp(sink - m)  # +inf sink: out 0; -inf: no effect
                    if call.sink_in_lse:
                        lse[b, s] = np.logaddexp(lse[b, s], sink)
                out[b, s] = (w @ k[:, : call.d_v]) / denom[:, None]
    if call.s_q == 1:
        return out[:, 0], lse[:, 0]
    return out, lse
