"""The Triton code of triton-simt and triton-mma (imports triton: load it only where it exists).

Written from docs/SPEC.md sections 2-4 and 6, not from any project's kernel:
- cache bytes (section 2): MODEL1 page = [P x (nope e4m3 | rope bf16)] then [P x scale row of
  ue8m0 bytes, padded to a multiple of 8]; V32 token = [nope e4m3 | tiles x fp32 scale | rope
  bf16]. Every field is read byte by byte (a page stride may be odd, so no wider load is aligned)
  and decoded with integer operations, exactly (e4m3fn with subnormals and NaN, 2^(e-127), bf16).
- math (section 3): valid(k) = in the topk_length prefix and not an invalid index; online softmax
  over token tiles with a running max; the sink only in the denominator (and, when asked, the
  LSE); rows without a valid token give out = 0 and the convention's LSE.
- pipelines (section 4): SIMT = fp32 everywhere; MMA = bf16 q and K through tl.dot with fp32
  accumulation, logits scaled in fp32 after the product, p rounded to bf16 for P*V while the row
  sum adds the fp32 p, bf16 store.

Every size that varies from case to case is a runtime argument and is excluded from Triton's
integer specialization (``do_not_specialize``), so a campaign compiles one kernel per
(layout, padded nope, padded rope, tile sizes, mutant) and nothing more.
"""

from __future__ import annotations

import triton
import triton.language as tl

try:  # accurate logf for the LSE (tl.log may lower to an approximate lg2)
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - older Triton
    from triton.language.extra.cuda import libdevice  # type: ignore[no-redef]

LAYOUT_MODEL1 = 0
LAYOUT_V32 = 1

# Planted bugs of triton-mma (kernels/triton/triton_mma.py MUTANTS gives names and descriptions).
# tl.constexpr: a JIT function may read only constexpr globals (a plain int fails to compile
# with "Cannot access global variable").
M_NONE = tl.constexpr(0)
M_UNMASKED_PAD_COLUMNS = tl.constexpr(1)
M_WRONG_SCALE_GROUP = tl.constexpr(2)
M_PAGE_SIZE_POW2 = tl.constexpr(3)
M_INVALID_INDEX_UNMASKED = tl.constexpr(4)
M_NO_RESCALE = tl.constexpr(5)
M_STORE_PADDED_COLUMNS = tl.constexpr(6)
M_TOPK_LENGTH_OFF_BY_ONE = tl.constexpr(7)
M_DROP_PARTIAL_TILE = tl.constexpr(8)
M_SINK_IGNORED = tl.constexpr(9)

# Runtime integer arguments: never specialized (value 1 or divisibility by 16 would otherwise
# compile a new variant for, e.g., a page size of 1 or a batch of 1).
RUNTIME_INTS = [
    "H", "topk", "q_sb", "q_sh", "idx_sb", "o_sb", "o_sh", "lse_sb",
    "page_size", "page_size_pow2", "page_stride", "row_bytes", "scale_base", "scale_row",
    "nope", "rope", "scale_tile", "n_tiles",
    "has_len", "has_sink", "any_negative", "sink_in_lse", "empty_pos_inf",
]
# Triton refuses a do_not_specialize name that is not a parameter: one list per kernel.
RUNTIME_INTS_SPLIT = RUNTIME_INTS + ["split_len", "n_splits"]
RUNTIME_INTS_COMBINE = ["H", "o_sb", "o_sh", "lse_sb", "nope", "rope", "n_splits", "has_sink",
                        "sink_in_lse", "empty_pos_inf"]


@triton.jit
def _e4m3_to_f32(b):
    """int32 byte values 0..255 -> float32, exactly (e4m3fn: bias 7, subnormals, 0x7f/0xff NaN)."""
    e = (b >> 3) & 15
    m = b & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    sub = m.to(tl.float32) * 0.001953125  # m * 2^-9
    mag = tl.where(e == 0, sub, normal)
    mag = tl.where((b & 127) == 127, float("nan"), mag)
    # The sign as a bit: -mag would give +0.0 for 0x80 (0 - 0), where e4m3fn has -0.0 (the
    # H200's hardware decode, FP8CVT, returns 0x80000000 there: the only byte that differed).
    return (mag.to(tl.int32, bitcast=True) | ((b & 128) << 24)).to(tl.float32, bitcast=True)


@triton.jit
def _ue8m0_to_f32(e):
    """int32 exponent byte -> 2^(e - 127) as float32 bits (e = 0: the subnormal 2^-127)."""
    bits = tl.where(e == 0, 0x400000, e << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _bf16_bytes_to_f32(lo, hi):
    return ((hi << 24) | (lo << 16)).to(tl.float32, bitcast=True)


@triton.jit
def _load_k_tile(cache_ptr, idx, valid, page_size, page_size_pow2, page_stride, row_bytes,
                 scale_base, scale_row, nope, rope, scale_tile, n_tiles,
                 LAYOUT: tl.constexpr, NOPE_PAD: tl.constexpr, ROPE_PAD: tl.constexpr,
                 MUTANT: tl.constexpr):
    """Gathers and dequantizes one token tile: (nope [N, NOPE_PAD], rope [N, ROPE_PAD]) float32.

    Masked tokens and padded columns are 0 and never read from the cache.
    """
    load_ok = valid
    safe = tl.where(valid, idx, 0)
    if MUTANT == M_INVALID_INDEX_UNMASKED:
        # Bug: the -1 entries are masked in Q*K^T (x = -inf) but their K/V rows are still loaded
        # from slot 0 and go through P*V (0 * NaN = NaN when that slot is poisoned).
        load_ok = valid | (idx == -1)  # (entries past the row's length hold -2 here)
        safe = tl.where(load_ok & (idx >= 0), idx, 0)
    if MUTANT == M_PAGE_SIZE_POW2:
        page = (safe // page_size_pow2).to(tl.int64)
        slot = (safe % page_size_pow2).to(tl.int64)
    else:
        page = (safe // page_size).to(tl.int64)
        slot = (safe % page_size).to(tl.int64)
    base = page * page_stride
    row = base + slot * row_bytes
    dn = tl.arange(0, NOPE_PAD)
    if MUTANT == M_UNMASKED_PAD_COLUMNS:
        ncols = dn < NOPE_PAD  # bug: padded columns nope..NOPE_PAD-1 read from what follows
    else:
        ncols = dn < nope
    nmask = load_ok[:, None] & ncols[None, :]
    group = dn // scale_tile
    if MUTANT == M_WRONG_SCALE_GROUP:
        # Bug: the last nope tile (beside the padding) takes the previous tile's scale.
        group = tl.where((group == n_tiles - 1) & (n_tiles > 1), group - 1, group)
    nb = tl.load(cache_ptr + row[:, None] + dn[None, :], mask=nmask, other=0).to(tl.int32)
    if LAYOUT == 0:  # MODEL1: ue8m0 bytes after the page's token rows
        srow = base + scale_base + slot * scale_row
        eb = tl.load(cache_ptr + srow[:, None] + group[None, :], mask=nmask, other=127)
        scale = _ue8m0_to_f32(eb.to(tl.int32))
        rope_at = row + nope
    else:  # V32: 4-byte little-endian fp32 scales right after the nope bytes
        saddr = cache_ptr + row[:, None] + (nope + 4 * group)[None, :]
        s0 = tl.load(saddr, mask=nmask, other=0).to(tl.int32)
        s1 = tl.load(saddr + 1, mask=nmask, other=0).to(tl.int32)
        s2 = tl.load(saddr + 2, mask=nmask, other=0).to(tl.int32)
        s3 = tl.load(saddr + 3, mask=nmask, other=0).to(tl.int32)
        scale = (s0 | (s1 << 8) | (s2 << 16) | (s3 << 24)).to(tl.float32, bitcast=True)
        rope_at = row + nope + 4 * n_tiles
    k_nope = _e4m3_to_f32(nb) * scale
    k_nope = tl.where(nmask, k_nope, 0.0)
    dr = tl.arange(0, ROPE_PAD)
    rmask = load_ok[:, None] & (dr < rope)[None, :]  # rope = 0: nothing read, zeros
    raddr = cache_ptr + rope_at[:, None] + 2 * dr[None, :]
    lo = tl.load(raddr, mask=rmask, other=0).to(tl.int32)
    hi = tl.load(raddr + 1, mask=rmask, other=0).to(tl.int32)
    k_rope = tl.where(rmask, _bf16_bytes_to_f32(lo, hi), 0.0)
    return k_nope, k_rope


@triton.jit
def _gather_fast(cache_ptr, idx, valid, page_size, page_size_pow2, page_stride,
                 row_bytes, scale_base, scale_row, nope, rope, n_tiles,
                 LAYOUT: tl.constexpr, NOPE_PAD: tl.constexpr, ROPE_PAD: tl.constexpr,
                 STILE: tl.constexpr, MUTANT: tl.constexpr):
    """The loads of _load_k_tile_fast, nothing decoded: (nope bytes [N, NOPE_PAD / STILE,
    STILE], raw scales [N, NOPE_PAD / STILE] (MODEL1 ue8m0 bytes, V32 fp32), rope bf16
    [N, ROPE_PAD], load mask [N, NOPE_PAD / STILE]). Split from the decode so that mma2_kernel
    can issue the next tile's loads before it computes on this one (PREFETCH)."""
    NT_PAD: tl.constexpr = NOPE_PAD // STILE
    load_ok = valid
    safe = tl.where(valid, idx, 0)
    if MUTANT == M_INVALID_INDEX_UNMASKED:
        load_ok = valid | (idx == -1)
        safe = tl.where(load_ok & (idx >= 0), idx, 0)
    if MUTANT == M_PAGE_SIZE_POW2:
        page = (safe // page_size_pow2).to(tl.int64)
        slot = (safe % page_size_pow2).to(tl.int64)
    else:
        page = (safe // page_size).to(tl.int64)
        slot = (safe % page_size).to(tl.int64)
    base = page * page_stride
    row = tl.multiple_of(base + slot * row_bytes, 16)
    tt = tl.arange(0, NT_PAD)
    te = tl.arange(0, STILE)
    if MUTANT == M_UNMASKED_PAD_COLUMNS:
        tcols = tt < NT_PAD
    else:
        tcols = tt < n_tiles
    tmask = load_ok[:, None] & tcols[None, :]  # [N, NT_PAD]
    col = (tt * STILE)[None, :, None] + te[None, None, :]
    # The mask is one value per (token, scale tile), broadcast over the tile's STILE bytes: the
    # compiler sees it constant along each 16-byte vector (one predicate per load).
    nb = tl.load(cache_ptr + row[:, None, None] + col, mask=tmask[:, :, None], other=0)
    group = tt
    if MUTANT == M_WRONG_SCALE_GROUP:
        group = tl.where((tt == n_tiles - 1) & (n_tiles > 1), tt - 1, tt)
    if LAYOUT == 0:
        srow = base + scale_base + slot * scale_row
        sraw = tl.load(cache_ptr + srow[:, None] + group[None, :], mask=tmask, other=127)
        rope_at = row + nope
    else:  # the fp32 scales are 4-byte aligned here (row and nope multiples of 16)
        sptr = (cache_ptr + row[:, None] + (nope + 4 * group)[None, :]).to(
            tl.pointer_type(tl.float32))
        sraw = tl.load(sptr, mask=tmask, other=0.0)
        rope_at = row + nope + 4 * n_tiles
    dr = tl.arange(0, ROPE_PAD)
    rmask = load_ok[:, None] & (dr < rope)[None, :]
    rptr = (cache_ptr + rope_at).to(tl.pointer_type(tl.bfloat16))
    kr = tl.load(rptr[:, None] + dr[None, :], mask=rmask, other=0.0)
    return nb, sraw, kr, tmask


@triton.jit
def _decode_fast(nb, sraw, tmask, BLOCK_N: tl.constexpr, LAYOUT: tl.constexpr,
                 NOPE_PAD: tl.constexpr, FP8CVT: tl.constexpr):
    """K nope in bf16 [N, NOPE_PAD] from _gather_fast's bytes: e4m3 * scale in fp32.

    What the loads masked is 0 already: its bytes load as 0 and its scale as a finite value
    (ue8m0 127 = 1.0, V32 0.0), so 0 * scale = 0 without a select per element (tmask unused).
    """
    if FP8CVT:
        code = nb.to(tl.float8e4nv, bitcast=True).to(tl.float16).to(tl.float32)
    else:
        code = _e4m3_to_f32(nb.to(tl.int32))
    if LAYOUT == 0:
        scale = _ue8m0_to_f32(sraw.to(tl.int32))
    else:
        scale = sraw
    k3 = code * scale[:, :, None]
    return tl.reshape(k3, [BLOCK_N, NOPE_PAD]).to(tl.bfloat16)


@triton.jit
def _load_k_tile_fast(cache_ptr, idx, valid, page_size, page_size_pow2, page_stride,
                      row_bytes, scale_base, scale_row, nope, rope, n_tiles,
                      BLOCK_N: tl.constexpr, LAYOUT: tl.constexpr, NOPE_PAD: tl.constexpr,
                      ROPE_PAD: tl.constexpr, STILE: tl.constexpr, FP8CVT: tl.constexpr,
                      MUTANT: tl.constexpr):
    """_load_k_tile for aligned geometries: the same values, in bf16 (K for tl.dot).

    The host picks this path (``FAST``) only when every token row starts on a 16-byte boundary
    (page stride, row bytes and nope multiples of 16, cache pointer aligned) and the scale tile
    is a power of two >= 16 (``STILE``): the nope bytes are then read as [N, tiles, STILE]
    with 16-byte vector loads, one scale per (token, tile) instead of one per element, and the
    rope dims as bf16 words. FP8CVT decodes e4m3 with the hardware conversion (e4m3fn -> fp16
    -> fp32), which gives the integer decode's bits for all 256 bytes (a GPU test checks it).
    """
    nb, sraw, kr, tmask = _gather_fast(cache_ptr, idx, valid, page_size, page_size_pow2,
                                       page_stride, row_bytes, scale_base, scale_row, nope,
                                       rope, n_tiles, LAYOUT, NOPE_PAD, ROPE_PAD, STILE,
                                       MUTANT)
    return _decode_fast(nb, sraw, tmask, BLOCK_N, LAYOUT, NOPE_PAD, FP8CVT), kr


@triton.jit
def e4m3_decode_check_kernel(src_ptr, hw_ptr, sw_ptr):
    """Both e4m3 decodes of the 256 bytes at src (tests: FP8CVT must give _e4m3_to_f32's bits)."""
    i = tl.arange(0, 256)
    b = tl.load(src_ptr + i)
    tl.store(hw_ptr + i, b.to(tl.float8e4nv, bitcast=True).to(tl.float16).to(tl.float32))
    tl.store(sw_ptr + i, _e4m3_to_f32(b.to(tl.int32)))


@triton.jit
def _row_length(len_ptr, b, topk, has_len, BLOCK_N: tl.constexpr, MUTANT: tl.constexpr):
    """Entries of row b that count: min(max(topk_length[b], 0), topk), or topk without it."""
    raw = tl.load(len_ptr + b, mask=has_len != 0, other=0)
    if MUTANT == M_TOPK_LENGTH_OFF_BY_ONE:
        raw = raw + 1  # bug: one entry past topk_length counts
    n = tl.where(has_len != 0, tl.minimum(tl.maximum(raw, 0), topk), topk)
    if MUTANT == M_DROP_PARTIAL_TILE:
        n = n // BLOCK_N * BLOCK_N  # bug: the partial last token tile is skipped
    return n


@triton.jit
def _valid_entries(idx_ptr, b, idx_sb, offs, n_len, any_negative):
    inb = offs < n_len
    # -2 past the row's length: never valid (inb), and not a -1 entry either.
    idx = tl.load(idx_ptr + b * idx_sb + offs, mask=inb, other=-2)
    valid = inb & (idx != -1) & ((idx >= 0) | (any_negative == 0))
    return idx, valid


@triton.jit
def _finish(m_i, l_i, sink, has_sink, sink_in_lse, empty_pos_inf, MUTANT: tl.constexpr):
    """(1 / denominator, lse, has_tokens) from the online-softmax state (any shape)."""
    has_tok = m_i != float("-inf")
    m_use = tl.where(has_tok, m_i, 0.0)
    sink_term = tl.exp(sink - m_use)  # sink = -inf (or none): 0; +inf: +inf, so out = 0
    if MUTANT == M_SINK_IGNORED:
        sink_term = sink_term * 0.0  # bug: the sink term left out of the denominator
    denom = l_i + sink_term
    inv = 1.0 / denom
    lse_plain = m_use + libdevice.log(l_i)
    # Sink folded into the LSE: shift by the larger of m and the sink so exp cannot overflow.
    below = m_use + libdevice.log(denom)
    above = sink + libdevice.log(l_i * tl.exp(m_use - sink) + 1.0)
    folded = tl.where(sink <= m_use, below, above)
    lse = tl.where((sink_in_lse != 0) & (has_sink != 0), folded, lse_plain)
    empty = tl.where(empty_pos_inf != 0, float("inf"), float("-inf"))
    lse = tl.where(has_tok, lse, empty)
    return inv, lse, has_tok


@triton.jit(do_not_specialize=RUNTIME_INTS)
def simt_kernel(q_ptr, cache_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, lse_ptr,
                H, topk, q_sb, q_sh, idx_sb, o_sb, o_sh, lse_sb,
                page_size, page_size_pow2, page_stride, row_bytes, scale_base, scale_row,
                nope, rope, scale_tile, n_tiles, sm_scale,
                has_len, has_sink, any_negative, sink_in_lse, empty_pos_inf,
                LAYOUT: tl.constexpr, NOPE_PAD: tl.constexpr, ROPE_PAD: tl.constexpr,
                HAS_ROPE: tl.constexpr, V_ROPE: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (head, batch row); fp32 throughout (SPEC section 4, SIMT)."""
    h = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    dn = tl.arange(0, NOPE_PAD)
    dr = tl.arange(0, ROPE_PAD)
    q_row = q_ptr + b * q_sb + h * q_sh
    qn = tl.load(q_row + dn, mask=dn < nope, other=0.0).to(tl.float32) * sm_scale
    qr = tl.load(q_row + nope + dr, mask=dr < rope, other=0.0).to(tl.float32)
    qr = qr * sm_scale
    n_len = _row_length(len_ptr, b, topk, has_len, BLOCK_N, 0)
    m_i = tl.max(tl.full([BLOCK_N], float("-inf"), tl.float32), axis=0)
    l_i = tl.sum(tl.zeros([BLOCK_N], tl.float32), axis=0)
    acc_n = tl.zeros([NOPE_PAD], tl.float32)
    acc_r = tl.zeros([ROPE_PAD], tl.float32)
    for start in range(0, n_len, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        idx, valid = _valid_entries(idx_ptr, b, idx_sb, offs, n_len, any_negative)
        kn, kr = _load_k_tile(cache_ptr, idx, valid, page_size, page_size_pow2, page_stride,
                              row_bytes, scale_base, scale_row, nope, rope, scale_tile, n_tiles,
                              LAYOUT, NOPE_PAD, ROPE_PAD, 0)
        x = tl.sum(kn * qn[None, :], axis=1)
        if HAS_ROPE:
            x = x + tl.sum(kr * qr[None, :], axis=1)
        x = tl.where(valid, x, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(x, axis=0))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_use)  # m_i = -inf: 0 (nothing accumulated yet)
        p = tl.exp(x - m_use)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc_n = acc_n * alpha + tl.sum(p[:, None] * kn, axis=0)
        if V_ROPE:
            acc_r = acc_r * alpha + tl.sum(p[:, None] * kr, axis=0)
        m_i = m_new
    sink = tl.load(sink_ptr + h, mask=has_sink != 0, other=float("-inf"))
    inv, lse, has_tok = _finish(m_i, l_i, sink, has_sink, sink_in_lse, empty_pos_inf, 0)
    o_row = out_ptr + b * o_sb + h * o_sh
    tl.store(o_row + dn, tl.where(has_tok, acc_n * inv, 0.0).to(tl.bfloat16), mask=dn < nope)
    if V_ROPE:
        tl.store(o_row + nope + dr, tl.where(has_tok, acc_r * inv, 0.0).to(tl.bfloat16),
                 mask=dr < rope)
    tl.store(lse_ptr + b * lse_sb + h, lse)


@triton.jit(do_not_specialize=RUNTIME_INTS)
def mma_kernel(q_ptr, cache_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, lse_ptr,
               H, topk, q_sb, q_sh, idx_sb, o_sb, o_sh, lse_sb,
               page_size, page_size_pow2, page_stride, row_bytes, scale_base, scale_row,
               nope, rope, scale_tile, n_tiles, sm_scale,
               has_len, has_sink, any_negative, sink_in_lse, empty_pos_inf,
               LAYOUT: tl.constexpr, NOPE_PAD: tl.constexpr, ROPE_PAD: tl.constexpr,
               HAS_ROPE: tl.constexpr, V_ROPE: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_H: tl.constexpr, MUTANT: tl.constexpr):
    """One program per (block of BLOCK_H heads, batch row); tl.dot bf16 x bf16 -> fp32."""
    hb = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    hs = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = hs < H
    dn = tl.arange(0, NOPE_PAD)
    dr = tl.arange(0, ROPE_PAD)
    q_rows = q_ptr + b * q_sb + hs[:, None] * q_sh
    if MUTANT == M_UNMASKED_PAD_COLUMNS:
        qcols = dn < NOPE_PAD  # bug: q's padded columns read too (the rope dims follow nope)
    else:
        qcols = dn < nope
    qn = tl.load(q_rows + dn[None, :], mask=hmask[:, None] & qcols[None, :], other=0.0)
    qr = tl.load(q_rows + nope + dr[None, :], mask=hmask[:, None] & (dr < rope)[None, :],
                 other=0.0)
    n_len = _row_length(len_ptr, b, topk, has_len, BLOCK_N, MUTANT)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc_n = tl.zeros([BLOCK_H, NOPE_PAD], tl.float32)
    acc_r = tl.zeros([BLOCK_H, ROPE_PAD], tl.float32)
    for start in range(0, n_len, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        idx, valid = _valid_entries(idx_ptr, b, idx_sb, offs, n_len, any_negative)
        # One gather and dequantization per tile, shared by every head of the block.
        kn32, kr32 = _load_k_tile(cache_ptr, idx, valid, page_size, page_size_pow2, page_stride,
                                  row_bytes, scale_base, scale_row, nope, rope, scale_tile,
                                  n_tiles, LAYOUT, NOPE_PAD, ROPE_PAD, MUTANT)
        kn = kn32.to(tl.bfloat16)  # exact for in-range power-of-two scales
        kr = kr32.to(tl.bfloat16)
        s = tl.dot(qn, tl.trans(kn))  # [BLOCK_H, BLOCK_N], fp32 accumulation
        if HAS_ROPE:
            s = tl.dot(qr, tl.trans(kr), s)
        x = s * sm_scale  # scaled in fp32 after the product
        x = tl.where(valid[None, :], x, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(x, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_use)
        if MUTANT == M_NO_RESCALE:
            alpha = tl.where(m_i == float("-inf"), 0.0, 1.0)  # bug: O and l not rescaled
        p = tl.exp(x - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)  # the fp32 p
        pb = p.to(tl.bfloat16)  # bf16 p for P*V
        acc_n = tl.dot(pb, kn, acc_n * alpha[:, None])
        if V_ROPE:
            acc_r = tl.dot(pb, kr, acc_r * alpha[:, None])
        m_i = m_new
    sink = tl.load(sink_ptr + hs, mask=hmask & (has_sink != 0), other=float("-inf"))
    inv, lse, has_tok = _finish(m_i, l_i, sink, has_sink, sink_in_lse, empty_pos_inf, MUTANT)
    o_rows = out_ptr + b * o_sb + hs[:, None] * o_sh
    if V_ROPE:
        o_r = tl.where(has_tok[:, None], acc_r * inv[:, None], 0.0).to(tl.bfloat16)
        tl.store(o_rows + nope + dr[None, :], o_r, mask=hmask[:, None] & (dr < rope)[None, :])
    o_n = tl.where(has_tok[:, None], acc_n * inv[:, None], 0.0).to(tl.bfloat16)
    if MUTANT == M_STORE_PADDED_COLUMNS:
        ocols = dn < NOPE_PAD  # bug: padded columns stored (over the rope dims, or past d_v)
    else:
        ocols = dn < nope
    tl.store(o_rows + dn[None, :], o_n, mask=hmask[:, None] & ocols[None, :])
    tl.store(lse_ptr + b * lse_sb + hs, lse, mask=hmask)


@triton.jit(do_not_specialize=RUNTIME_INTS_SPLIT)
def mma2_kernel(q_ptr, cache_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, lse_ptr, ws_ptr, wml_ptr,
                H, topk, q_sb, q_sh, idx_sb, o_sb, o_sh, lse_sb,
                page_size, page_size_pow2, page_stride, row_bytes, scale_base, scale_row,
                nope, rope, scale_tile, n_tiles, sm_scale,
                has_len, has_sink, any_negative, sink_in_lse, empty_pos_inf,
                split_len, n_splits,
                LAYOUT: tl.constexpr, NOPE_PAD: tl.constexpr, ROPE_PAD: tl.constexpr,
                HAS_ROPE: tl.constexpr, V_ROPE: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_H: tl.constexpr, MUTANT: tl.constexpr, SPLIT: tl.constexpr,
                FAST: tl.constexpr, STILE: tl.constexpr, FP8CVT: tl.constexpr,
                PREFETCH: tl.constexpr):
    """mma_kernel with a split of the token list (flash-decoding) and the aligned fast gather.

    Program (head block, batch row, split s) runs the online softmax over the tokens
    [s * split_len, (s + 1) * split_len) of its row (split_len a multiple of BLOCK_N, fixed by
    the host from topk and the device only, never from the batch). SPLIT: the unnormalized fp32
    O, the running max m and the fp32 row sum l go to the workspace (ws [B, S, H, NOPE_PAD +
    ROPE_PAD], wml [B, S, 2, H]) and combine_kernel merges them; otherwise (one split) the
    program finishes the row itself, as mma_kernel does. The precision pipeline is mma_kernel's.
    """
    DW: tl.constexpr = NOPE_PAD + ROPE_PAD
    hb = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    sp = tl.program_id(2)
    hs = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = hs < H
    dn = tl.arange(0, NOPE_PAD)
    dr = tl.arange(0, ROPE_PAD)
    q_rows = q_ptr + b * q_sb + hs[:, None] * q_sh
    if MUTANT == M_UNMASKED_PAD_COLUMNS:
        qcols = dn < NOPE_PAD
    else:
        qcols = dn < nope
    qn = tl.load(q_rows + dn[None, :], mask=hmask[:, None] & qcols[None, :], other=0.0)
    qr = tl.load(q_rows + nope + dr[None, :], mask=hmask[:, None] & (dr < rope)[None, :],
                 other=0.0)
    n_len = _row_length(len_ptr, b, topk, has_len, BLOCK_N, MUTANT)
    lo = sp * split_len
    hi = tl.minimum(lo + split_len, n_len)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc_n = tl.zeros([BLOCK_H, NOPE_PAD], tl.float32)
    acc_r = tl.zeros([BLOCK_H, ROPE_PAD], tl.float32)
    if FAST and PREFETCH:  # the first tile's loads, before the loop
        p_idx, p_valid = _valid_entries(idx_ptr, b, idx_sb, lo + tl.arange(0, BLOCK_N), hi,
                                        any_negative)
        p_nb, p_s, p_kr, p_m = _gather_fast(cache_ptr, p_idx, p_valid, page_size,
                                            page_size_pow2, page_stride, row_bytes, scale_base,
                                            scale_row, nope, rope, n_tiles, LAYOUT, NOPE_PAD,
                                            ROPE_PAD, STILE, MUTANT)
    for start in range(lo, hi, BLOCK_N):
        if FAST and PREFETCH:
            valid = p_valid
            c_nb, c_s, kr, c_m = p_nb, p_s, p_kr, p_m
            # The next tile's loads go out before this tile's math (entries past hi: masked).
            p_idx, p_valid = _valid_entries(idx_ptr, b, idx_sb,
                                            start + BLOCK_N + tl.arange(0, BLOCK_N), hi,
                                            any_negative)
            p_nb, p_s, p_kr, p_m = _gather_fast(cache_ptr, p_idx, p_valid, page_size,
                                                page_size_pow2, page_stride, row_bytes,
                                                scale_base, scale_row, nope, rope, n_tiles,
                                                LAYOUT, NOPE_PAD, ROPE_PAD, STILE, MUTANT)
            kn = _decode_fast(c_nb, c_s, c_m, BLOCK_N, LAYOUT, NOPE_PAD, FP8CVT)
        elif FAST:
            offs = start + tl.arange(0, BLOCK_N)
            idx, valid = _valid_entries(idx_ptr, b, idx_sb, offs, hi, any_negative)
            kn, kr = _load_k_tile_fast(cache_ptr, idx, valid, page_size, page_size_pow2,
                                       page_stride, row_bytes, scale_base, scale_row, nope,
                                       rope, n_tiles, BLOCK_N, LAYOUT, NOPE_PAD, ROPE_PAD,
                                       STILE, FP8CVT, MUTANT)
        else:
            offs = start + tl.arange(0, BLOCK_N)
            idx, valid = _valid_entries(idx_ptr, b, idx_sb, offs, hi, any_negative)
            kn32, kr32 = _load_k_tile(cache_ptr, idx, valid, page_size, page_size_pow2,
                                      page_stride, row_bytes, scale_base, scale_row, nope, rope,
                                      scale_tile, n_tiles, LAYOUT, NOPE_PAD, ROPE_PAD, MUTANT)
            kn = kn32.to(tl.bfloat16)
            kr = kr32.to(tl.bfloat16)
        s = tl.dot(qn, tl.trans(kn))
        if HAS_ROPE:
            s = tl.dot(qr, tl.trans(kr), s)
        x = s * sm_scale
        x = tl.where(valid[None, :], x, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(x, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_use)
        if MUTANT == M_NO_RESCALE:
            alpha = tl.where(m_i == float("-inf"), 0.0, 1.0)
        p = tl.exp(x - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        pb = p.to(tl.bfloat16)
        acc_n = tl.dot(pb, kn, acc_n * alpha[:, None])
        if V_ROPE:
            acc_r = tl.dot(pb, kr, acc_r * alpha[:, None])
        m_i = m_new
    if SPLIT:
        cell = (b * n_splits + sp) * H
        w_rows = ws_ptr + (cell + hs[:, None]).to(tl.int64) * DW
        tl.store(w_rows + dn[None, :], acc_n, mask=hmask[:, None] & (dn < nope)[None, :])
        if V_ROPE:
            tl.store(w_rows + NOPE_PAD + dr[None, :], acc_r,
                     mask=hmask[:, None] & (dr < rope)[None, :])
        ml = wml_ptr + 2 * cell + hs
        tl.store(ml, m_i, mask=hmask)
        tl.store(ml + H, l_i, mask=hmask)
    else:
        sink = tl.load(sink_ptr + hs, mask=hmask & (has_sink != 0), other=float("-inf"))
        inv, lse, has_tok = _finish(m_i, l_i, sink, has_sink, sink_in_lse, empty_pos_inf,
                                    MUTANT)
        o_rows = out_ptr + b * o_sb + hs[:, None] * o_sh
        if V_ROPE:
            o_r = tl.where(has_tok[:, None], acc_r * inv[:, None], 0.0).to(tl.bfloat16)
            tl.store(o_rows + nope + dr[None, :], o_r,
                     mask=hmask[:, None] & (dr < rope)[None, :])
        o_n = tl.where(has_tok[:, None], acc_n * inv[:, None], 0.0).to(tl.bfloat16)
        if MUTANT == M_STORE_PADDED_COLUMNS:
            ocols = dn < NOPE_PAD
        else:
            ocols = dn < nope
        tl.store(o_rows + dn[None, :], o_n, mask=hmask[:, None] & ocols[None, :])
        tl.store(lse_ptr + b * lse_sb + hs, lse, mask=hmask)


@triton.jit(do_not_specialize=RUNTIME_INTS_COMBINE)
def combine_kernel(ws_ptr, wml_ptr, sink_ptr, out_ptr, lse_ptr,
                   H, o_sb, o_sh, lse_sb, nope, rope, n_splits,
                   has_sink, sink_in_lse, empty_pos_inf,
                   NOPE_PAD: tl.constexpr, ROPE_PAD: tl.constexpr, V_ROPE: tl.constexpr,
                   BLOCK_H: tl.constexpr, CW: tl.constexpr, SB: tl.constexpr,
                   MUTANT: tl.constexpr):
    """Merges the splits of mma2_kernel: one program per (head block, batch row, CW columns).

    M = max_s m_s; O = sum_s exp(m_s - M) O_s and l = sum_s exp(m_s - M) l_s in fp32 (splits
    in order, so the result does not depend on the batch); then the sink, LSE and empty-row
    rules of _finish and the bf16 store, as in mma_kernel. Column chunk c covers workspace
    columns [c * CW, (c + 1) * CW): nope columns below NOPE_PAD, rope columns above (the
    workspace keeps rope at NOPE_PAD + r). The splits are read SB at a time, their loads in
    flight together (one split at a time leaves each program waiting on memory n_splits times:
    14.9 us at B=1 and 72.7 at B=128 for four splits on the H200).
    """
    DW: tl.constexpr = NOPE_PAD + ROPE_PAD
    hb = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    ch = tl.program_id(2)
    hs = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = hs < H
    wcol = ch * CW + tl.arange(0, CW)  # workspace column
    is_rope = ch * CW >= NOPE_PAD
    r = wcol - NOPE_PAD
    cmask = tl.where(is_rope, (r >= 0) & (r < rope), wcol < nope)
    lmask = hmask[:, None] & cmask[None, :]
    m_all = tl.full([BLOCK_H], float("-inf"), tl.float32)
    for s0 in range(0, n_splits, SB):
        for j in tl.static_range(SB):
            sp = s0 + j
            m_s = tl.load(wml_ptr + 2 * (b * n_splits + sp) * H + hs,
                          mask=hmask & (sp < n_splits), other=float("-inf"))
            m_all = tl.maximum(m_all, m_s)  # a split past n_splits: max(m, -inf) = m
    m_use = tl.where(m_all == float("-inf"), 0.0, m_all)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, CW], tl.float32)
    for s0 in range(0, n_splits, SB):
        for j in tl.static_range(SB):
            sp = s0 + j
            here = sp < n_splits
            cell = (b * n_splits + sp) * H
            m_s = tl.load(wml_ptr + 2 * cell + hs, mask=hmask & here, other=float("-inf"))
            l_s = tl.load(wml_ptr + 2 * cell + H + hs, mask=hmask & here, other=0.0)
            # Not masked by m_s, so that it does not wait for m_s; an empty split (m_s = -inf)
            # is dropped below as the masked load dropped it (its O may be 0 * inf = NaN).
            a = tl.load(ws_ptr + (cell + hs[:, None]).to(tl.int64) * DW + wcol[None, :],
                        mask=lmask & here, other=0.0)
            w = tl.exp(m_s - m_use)  # m_s = -inf (an empty split, or past n_splits): 0
            if MUTANT == M_NO_RESCALE:
                w = tl.where(m_s == float("-inf"), 0.0, 1.0)
            a = tl.where((m_s != float("-inf"))[:, None], a, 0.0)
            acc = acc + a * w[:, None]
            l_i = l_i + l_s * w
    sink = tl.load(sink_ptr + hs, mask=hmask & (has_sink != 0), other=float("-inf"))
    inv, lse, has_tok = _finish(m_all, l_i, sink, has_sink, sink_in_lse, empty_pos_inf, MUTANT)
    o = tl.where(has_tok[:, None], acc * inv[:, None], 0.0)
    ocol = tl.where(is_rope, nope + r, wcol)
    if MUTANT == M_STORE_PADDED_COLUMNS:
        # The padded columns nope..NOPE_PAD-1 are stored too (0 * inv), over the rope outputs
        # where they overlap: the rope chunks store that value there as well, so that the
        # result does not depend on which program writes last.
        pad = tl.where(has_tok[:, None], 0.0 * inv[:, None], 0.0)
        o = tl.where((is_rope & (ocol < NOPE_PAD))[None, :], pad, o)
        smask = tl.where(is_rope, (r >= 0) & (r < rope), wcol < NOPE_PAD)
    else:
        smask = cmask
    tl.store(out_ptr + b * o_sb + hs[:, None] * o_sh + ocol[None, :], o.to(tl.bfloat16),
             mask=hmask[:, None] & smask[None, :])  # rope chunks run only where V_ROPE
    if ch == 0:
        tl.store(lse_ptr + b * lse_sb + hs, lse, mask=hmask)
