#!/usr/bin/env python3
"""Recompute sparse MLA decode from an `mlafuzz run --dump DIR` folder, independently.

Reads the raw inputs (q as bf16 bits, the paged FP8 KV cache as bytes, indices, topk_length,
sink, and the extra cache of the production decode: extra_kv_cache, extra_indices,
extra_topk_length) and decodes them here from the layout description in docs/SPEC.md section 2
(e4m3fn, ue8m0, fp32 scales, bf16 rope): no mlafuzz code is shared. Computes out and lse in
float64 per docs/SPEC.md sections 3 and 8 (one joint softmax over the valid entries of both
lists, for each of the s_q query tokens of a row) and compares them with the dumped oracle outputs
out64.npy / lse64.npy. q, indices, out and lse carry the s_q axis ([B, s_q, ...]) when s_q > 1.

Prints the maximum differences; exits 1 when the relative difference exceeds 1e-9 (float64
rounding only is expected) or non-finite positions differ, 2 on unusable input.

Usage: python3 scripts/check_dump.py DIR
"""
import json
import os
import sys

import numpy as np

TOLERANCE = 1e-9


def e4m3_table():
    """float64 value of each of the 256 e4m3fn encodings (0x7f and 0xff are NaN)."""
    t = np.empty(256, dtype=np.float64)
    for v in range(256):
        sign = -1.0 if v & 0x80 else 1.0
        exp, man = (v >> 3) & 0xF, v & 0x7
        if exp == 0xF and man == 0x7:
            t[v] = np.nan
        elif exp == 0:
            t[v] = sign * man * 2.0**-9
        else:
            t[v] = sign * (1 + man / 8.0) * 2.0 ** (exp - 7)
    return t


def bf16_to_f64(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def decode_keys(cache, geo, slots):
    """[len(slots), nope + rope] dequantized keys of the given global slots."""
    nope, rope, tile = geo["nope_dim"], geo["rope_dim"], geo["scale_tile"]
    psize, stride = geo["page_size"], geo["page_stride"]
    tiles = nope // tile
    page, j = slots // psize, slots % psize
    base = page * stride
    if geo["layout"] == "model1":
        row = nope + 2 * rope  # nope e4m3 bytes, then rope bf16
        nope_at = base + j * row
        rope_at = nope_at + nope
        scale_at = base + psize * row + j * ((tiles + 7) // 8 * 8)  # ue8m0 rows after the data
        e = cache[scale_at[:, None] + np.arange(tiles)[None, :]].astype(np.float64)
        scales = np.where(e == 255, np.nan, np.exp2(e - 127))
    elif geo["layout"] == "v32":
        tb = nope + 4 * tiles + 2 * rope  # nope e4m3, fp32 scales, rope bf16
        nope_at = base + j * tb
        scale_at = nope_at + nope
        rope_at = scale_at + 4 * tiles
        b = cache[scale_at[:, None] + np.arange(4 * tiles)[None, :]].astype(np.uint32)
        b = b.reshape(len(slots), tiles, 4)
        u = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
        scales = u.astype(np.uint32).view(np.float32).astype(np.float64)
    else:
        raise SystemExit(f"unknown layout {geo['layout']!r}")
    codes = cache[nope_at[:, None] + np.arange(nope)[None, :]]
    k_nope = e4m3_table()[codes] * np.repeat(scales, tile, axis=1)
    lo = cache[rope_at[:, None] + 2 * np.arange(rope)[None, :]].astype(np.uint16)
    hi = cache[rope_at[:, None] + 2 * np.arange(rope)[None, :] + 1].astype(np.uint16)
    k_rope = bf16_to_f64(lo | (hi << 8))
    return np.concatenate([k_nope, k_rope], axis=1)


def load(d, name, required=True):
    path = os.path.join(d, name)
    if not os.path.exists(path):
        if required:
            raise SystemExit(f"check_dump: {path} is missing")
        return None
    return np.load(path)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    d = sys.argv[1]
    with open(os.path.join(d, "params.json")) as f:
        p = json.load(f)
    geo, conv = p["geometry"], p["conventions"]
    B, H, dqk, dv = p["batch"], p["heads"], p["d_qk"], p["d_v"]
    S = p.get("s_q", 1)
    # Every [B, s_q, ...] array as [B * s_q, ...] (query row r = b * s_q + s).
    q = bf16_to_f64(load(d, "q.npy")).reshape(B * S, H, -1)[:, :, :dqk]  # drop head padding
    cache = load(d, "kv_cache.npy").reshape(-1)
    indices = load(d, "indices.npy").reshape(B * S, -1)
    topk_length = load(d, "topk_length.npy", required=False)
    sink = load(d, "sink.npy", required=False)
    lists = [(cache, geo, indices, topk_length)]
    if "extra_geometry" in p:
        egeo = dict(geo)
        egeo.update(p["extra_geometry"])
        lists.append((load(d, "extra_kv_cache.npy").reshape(-1), egeo,
                      load(d, "extra_indices.npy").reshape(B * S, -1),
                      load(d, "extra_topk_length.npy", required=False)))
    ref_out = load(d, "out64.npy").reshape(B * S, H, dv)
    ref_lse = load(d, "lse64.npy").reshape(B * S, H)
    scale = float(p["sm_scale"])
    empty_lse = np.inf if conv["empty_lse"] == "+inf" else -np.inf

    out = np.zeros((B * S, H, dv))
    lse = np.empty((B * S, H))
    for r in range(B * S):
        b = r // S
        keys = []
        for lcache, lgeo, lidx, llen in lists:
            idx = lidx[r].astype(np.int64)
            k = np.arange(len(idx))
            valid = idx != -1 if conv["invalid_index"] == "minus_one_only" else idx >= 0
            if llen is not None:
                valid &= k < llen[b]
            if valid.any():
                keys.append(decode_keys(lcache, lgeo, idx[valid]))
        if not keys:
            lse[r] = empty_lse  # out stays 0, sink or not
            continue
        K = np.concatenate(keys, axis=0)  # T(b, s): a token in both lists counts twice
        x = scale * (q[r] @ K.T)  # [H, n]
        m = x.max(axis=1, keepdims=True)
        w = np.exp(x - m)
        s = w.sum(axis=1)
        lse[r] = np.log(s) + m[:, 0]
        denom = s.copy()
        if sink is not None:
            sk = sink.astype(np.float64)
            denom = s + np.exp(sk - m[:, 0])  # +inf sink: out 0; -inf: no effect
            if conv["sink_in_lse"]:
                lse[r] = np.logaddexp(lse[r], sk)
        out[r] = (w @ K[:, :dv]) / denom[:, None]

    status = 0
    report = []
    for name, mine, ref in (("out", out, ref_out), ("lse", lse, ref_lse)):
        fin_m, fin_r = np.isfinite(mine), np.isfinite(ref)
        same_nonfinite = np.array_equal(fin_m, fin_r) and np.array_equal(
            mine[~fin_m], ref[~fin_r], equal_nan=True
        )
        both = fin_m & fin_r
        diff = np.abs(mine[both] - ref[both]).max() if both.any() else 0.0
        mag = np.abs(ref[both]).max() if both.any() else 0.0
        rel = diff / mag if mag > 0 else diff
        report.append(f"{name} max|d|={diff:.3e} rel={rel:.3e} non-finite "
                      f"{'match' if same_nonfinite else 'MISMATCH'}")
        if rel > TOLERANCE or not same_nonfinite:
            status = 1
    print("check_dump:", " | ".join(report), "->", "OK" if status == 0 else "FAIL")
    return status


if __name__ == "__main__":
    sys.exit(main())
