"""Host side of triton-simt and triton-mma: what they support, the launch, compilation counts.

Imports neither torch nor triton at module level, so that ``mlafuzz list-backends`` can load the
kernels on a machine without them and say why they are unavailable (``unavailable()``).
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any, Dict, Optional, Tuple

import mlafuzz
from mlafuzz import _settings

SIMT_BLOCK_N = 16  # tokens per tile, triton-simt
MMA_BLOCK_N = 32  # tokens per tile, mma_kernel (triton-mma-v1)
#: Tokens per tile of mma2_kernel (what triton-mma runs): 64 is faster than 32 at every batch of
#: the H200 bench (topk 512, B = 1..128: 44.1-211.7 us against 52.6-246.5; bench/RESULTS.md);
#: its 180.7 KiB of shared memory fit the H200's 227.
MMA2_BLOCK_N = 64
MMA_BLOCK_H = (16, 32, 64)
#: Tokens per split of mma2_kernel (flash-decoding): a function of the row's topk only, never of
#: the batch, so that a row computed alone gives the same bits (batch-alone).
SPLIT_TOKENS = 128
#: Heads per program of the split combine, the most columns per program and the splits whose
#: loads it issues together.
COMBINE_BLOCK_H = 16
COMBINE_CW = 64
COMBINE_SB = 4
MAX_NOPE = 512
MAX_ROPE = 64

#: What both kernels accept, declared so that mlafuzz generates only such cases (docs/plugins.md,
#: "Envelopes"): supports() below checks the same limits; one query token, no extra cache.
ENVELOPE = mlafuzz.Envelope(nope_dim=range(1, MAX_NOPE + 1), rope_dim=range(0, MAX_ROPE + 1),
                            s_q=[1], refuses=["extra_cache", "extra_topk_length"])

_JIT: Any = None
_IMPORT_ERROR: Optional[str] = None
# (kernel, constexpr values) of every launch configuration used in this process.
_CONFIGS: Dict[str, set] = {}
#: The compiled kernel of the last launch, by kernel name (bench: registers, spills, shared).
LAST_COMPILED: Dict[str, Any] = {}


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def unavailable() -> Optional[str]:
    """Why these kernels cannot run in this interpreter (None when triton imports)."""
    global _JIT, _IMPORT_ERROR
    if _JIT is not None:
        return None
    if _IMPORT_ERROR is None:
        try:
            from . import mla_triton_jit  # noqa: PLC0415 - imports triton

            _JIT = mla_triton_jit
            return None
        except ImportError as e:
            _IMPORT_ERROR = (f"needs triton in {sys.executable} ({e}); pip install triton "
                             "(it comes with torch's CUDA wheels)")
    return _IMPORT_ERROR


def jit() -> Any:
    why = unavailable()
    if why is not None:
        raise RuntimeError(why)
    return _JIT


def supports(call: mlafuzz.DecodeCall) -> Optional[str]:
    """What both kernels cannot do, from the sizes only."""
    if getattr(call, "s_q", 1) > 1 or getattr(call, "has_extra", False):
        return "the production decode (s_q > 1, extra cache) is not implemented in these kernels"
    if call.layout not in ("model1", "v32"):
        return f"layout {call.layout!r} (only model1 and v32)"
    if call.scale_tile <= 0 or call.nope_dim % call.scale_tile != 0:
        return f"nope_dim {call.nope_dim} is not a multiple of scale_tile {call.scale_tile}"
    if not 1 <= call.nope_dim <= MAX_NOPE:
        return f"nope_dim {call.nope_dim} outside 1..{MAX_NOPE} (NOPE_PAD is at most 512)"
    if not 0 <= call.rope_dim <= MAX_ROPE:
        return f"rope_dim {call.rope_dim} outside 0..{MAX_ROPE}"
    want_dv = call.nope_dim + call.rope_dim if call.layout == "model1" else call.nope_dim
    if call.d_v != want_dv:
        return f"d_v {call.d_v} (the {call.layout} layout's V is {want_dv} wide)"
    if call.d_qk != call.nope_dim + call.rope_dim:
        return f"d_qk {call.d_qk} != nope_dim + rope_dim"
    return None


def _record(kernel: str, key: Tuple) -> None:
    _CONFIGS.setdefault(kernel, set()).add(key)


def _triton_cache_entries(fn: Any) -> Optional[int]:
    """Compiled variants Triton holds for a JIT function (None where this Triton hides them)."""
    try:
        caches = getattr(fn, "device_caches", None)
        if caches:
            return sum(len(v[0]) for v in caches.values())
        cache = getattr(fn, "cache", None)
        if isinstance(cache, dict):
            return sum(len(v) for v in cache.values())
    except Exception:  # noqa: BLE001 - introspection only
        return None
    return None


def compilations() -> Dict[str, Any]:
    """Distinct launch configurations (constexpr sets) and Triton's own compiled-variant count."""
    report: Dict[str, Any] = {}
    for kernel, keys in sorted(_CONFIGS.items()):
        fn = getattr(_JIT, kernel, None) if _JIT is not None else None
        report[kernel] = {
            "configs": len(keys),
            "triton_compiled": _triton_cache_entries(fn) if fn is not None else None,
            "keys": sorted(keys),
        }
    return report


@atexit.register
def _report_at_exit() -> None:
    if not _CONFIGS or _settings.flag("MLAFUZZ_TRITON_QUIET", False):
        return
    # One short line per kernel; the constexpr sets themselves only when asked for (a campaign's
    # workers each print at exit, and 15 sets of 8 constexprs per line drown the log).
    verbose = _settings.flag("MLAFUZZ_TRITON_VERBOSE", False)
    for kernel, r in compilations().items():
        keys = f": {r['keys']}" if verbose else ""
        print(f"mlafuzz-triton: pid {os.getpid()} {kernel}: {r['configs']} distinct "
              f"configurations, Triton compiled {r['triton_compiled']} variants{keys}",
              file=sys.stderr, flush=True)


def _check_indices(call: mlafuzz.DecodeCall, torch: Any) -> None:
    """Raises (kError) for entries no kernel may read: out of range, or negative but valid."""
    idx = call.indices
    total = call.num_pages * call.page_size
    counts = torch.arange(call.topk, device=idx.device).unsqueeze(0)
    if call.topk_length is not None:
        prefix = counts < call.topk_length.to(torch.int64).clamp(min=0).unsqueeze(1)
    else:
        prefix = torch.ones_like(idx, dtype=torch.bool)
    bad = idx >= total
    if call.invalid_index_rule == "minus_one_only":
        bad |= idx < -1
    bad &= prefix
    if bool(bad.any()):
        b, k = (int(v) for v in bad.nonzero()[0])
        raise ValueError(
            f"indices[{b}][{k}] = {int(idx[b, k])} is outside the cache's {total} slots or a "
            f"negative index the {call.invalid_index_rule} convention counts as valid")


def launch(call: mlafuzz.DecodeCall, kernel: str, block_h: int = 32, mutant: int = 0,
           check: bool = True) -> None:
    """Runs simt_kernel or mma_kernel on a device call (torch tensors, results in place)."""
    import torch  # noqa: PLC0415 - device="cuda" kernels only

    j = jit()
    why = supports(call)
    if why is not None:
        raise ValueError(f"unsupported case: {why}")
    if check:  # benchmarks leave the (synchronizing) index check out
        _check_indices(call, torch)
    nope, rope = call.nope_dim, call.rope_dim
    n_tiles = nope // call.scale_tile
    if call.layout == "model1":
        layout = j.LAYOUT_MODEL1
        row_bytes = nope + 2 * rope  # the token's data row; the scale rows follow the P rows
        scale_base = call.page_size * row_bytes
        scale_row = (n_tiles + 7) // 8 * 8
    else:
        layout = j.LAYOUT_V32
        row_bytes = call.token_bytes
        scale_base = scale_row = 0
    q, out, lse = call.q, call.out, call.lse
    has_len, has_sink = call.topk_length is not None, call.sink is not None
    len_arg = call.topk_length if has_len else call.indices  # never read when absent
    sink_arg = call.sink if has_sink else lse
    nope_pad = max(16, next_pow2(nope))
    rope_pad = max(16, next_pow2(rope))
    consts = dict(LAYOUT=layout, NOPE_PAD=nope_pad, ROPE_PAD=rope_pad, HAS_ROPE=rope > 0,
                  V_ROPE=layout == j.LAYOUT_MODEL1 and rope > 0)
    args = (q, call.kv_cache, call.indices, len_arg, sink_arg, out, lse,
            call.heads, call.topk, q.stride(0), q.stride(1), call.indices.stride(0),
            out.stride(0), out.stride(1), lse.stride(0),
            call.page_size, next_pow2(call.page_size), call.page_stride, row_bytes, scale_base,
            scale_row, nope, rope, call.scale_tile, n_tiles, float(call.sm_scale),
            int(has_len), int(has_sink), int(call.invalid_index_rule == "any_negative"),
            int(call.sink_in_lse), int(call.empty_row_lse == "+inf"))
    if kernel == "simt_kernel":
        consts["BLOCK_N"] = SIMT_BLOCK_N
        grid = (call.heads, call.batch)
        j.simt_kernel[grid](*args, **consts, num_warps=4)
    else:
        if block_h not in MMA_BLOCK_H:
            raise ValueError(f"BLOCK_H {block_h} (use 16, 32 or 64)")
        consts.update(BLOCK_N=MMA_BLOCK_N, BLOCK_H=block_h, MUTANT=mutant)
        grid = (triton_cdiv(call.heads, block_h), call.batch)
        j.mma_kernel[grid](*args, **consts, num_warps=4 if block_h == 16 else 8)
    _record(kernel, tuple(sorted(consts.items())))


def fast_path_ok(call: mlafuzz.DecodeCall, row_bytes: int) -> bool:
    """Whether every token row of the cache starts on a 16-byte boundary and the scale tile is a
    power of two >= 16: mma2_kernel's vectorized gather (FAST) is then exact (same values)."""
    tile = call.scale_tile
    return (call.kv_cache.data_ptr() % 16 == 0 and call.page_stride % 16 == 0
            and row_bytes % 16 == 0 and call.nope_dim % 16 == 0 and tile >= 16
            and tile & (tile - 1) == 0 and call.nope_dim % tile == 0)


def split_plan(topk: int, split_tokens: Optional[int], block_n: int) -> Tuple[int, int]:
    """(split_len, n_splits) for a row of topk entries: split_len a multiple of block_n."""
    if split_tokens is None or split_tokens <= 0 or split_tokens >= topk:
        return max(block_n, triton_cdiv(max(topk, 1), block_n) * block_n), 1
    split_len = triton_cdiv(split_tokens, block_n) * block_n
    return split_len, triton_cdiv(topk, split_len)


def combine_columns(nope_pad: int, rope_pad: int, v_rope: bool) -> int:
    """Columns per combine program: a power of two dividing NOPE_PAD (and ROPE_PAD where the
    rope is part of V), so that no chunk holds both nope and rope columns."""
    return min(COMBINE_CW, nope_pad, rope_pad if v_rope else COMBINE_CW)


def launch2(call: mlafuzz.DecodeCall, block_h: int = 32, mutant: int = 0, check: bool = True,
            split_tokens: Optional[int] = SPLIT_TOKENS, fast: Optional[bool] = None,
            fp8cvt: bool = True, block_n: int = MMA2_BLOCK_N, num_warps: Optional[int] = None,
            num_stages: Optional[int] = None, prefetch: bool = False) -> None:
    """Runs mma2_kernel (and combine_kernel when the row is split) on a device call.

    The same precision pipeline as mma_kernel; split_tokens None keeps one split per row (no
    workspace, no combine); fast None takes the vectorized gather where fast_path_ok says so.
    """
    import torch  # noqa: PLC0415

    j = jit()
    why = supports(call)
    if why is not None:
        raise ValueError(f"unsupported case: {why}")
    if block_h not in MMA_BLOCK_H:
        raise ValueError(f"BLOCK_H {block_h} (use 16, 32 or 64)")
    if check:
        _check_indices(call, torch)
    nope, rope = call.nope_dim, call.rope_dim
    n_tiles = nope // call.scale_tile
    if call.layout == "model1":
        layout = j.LAYOUT_MODEL1
        row_bytes = nope + 2 * rope
        scale_base = call.page_size * row_bytes
        scale_row = (n_tiles + 7) // 8 * 8
    else:
        layout = j.LAYOUT_V32
        row_bytes = call.token_bytes
        scale_base = scale_row = 0
    if fast is None:
        fast = fast_path_ok(call, row_bytes)
    q, out, lse = call.q, call.out, call.lse
    has_len, has_sink = call.topk_length is not None, call.sink is not None
    len_arg = call.topk_length if has_len else call.indices
    sink_arg = call.sink if has_sink else lse
    nope_pad = max(16, next_pow2(nope))
    rope_pad = max(16, next_pow2(rope))
    v_rope = layout == j.LAYOUT_MODEL1 and rope > 0
    split_len, n_splits = split_plan(call.topk, split_tokens, block_n)
    split = n_splits > 1
    if split:
        ws = torch.empty(call.batch * n_splits * call.heads * (nope_pad + rope_pad),
                         dtype=torch.float32, device=q.device)
        wml = torch.empty(call.batch * n_splits * 2 * call.heads, dtype=torch.float32,
                          device=q.device)
    else:
        ws = wml = lse  # never touched
    consts = dict(LAYOUT=layout, NOPE_PAD=nope_pad, ROPE_PAD=rope_pad, HAS_ROPE=rope > 0,
                  V_ROPE=v_rope, BLOCK_N=block_n, BLOCK_H=block_h, MUTANT=mutant, SPLIT=split,
                  FAST=bool(fast), STILE=call.scale_tile if fast else 0,
                  FP8CVT=bool(fp8cvt and fast), PREFETCH=bool(prefetch and fast))
    args = (q, call.kv_cache, call.indices, len_arg, sink_arg, out, lse, ws, wml,
            call.heads, call.topk, q.stride(0), q.stride(1), call.indices.stride(0),
            out.stride(0), out.stride(1), lse.stride(0),
            call.page_size, next_pow2(call.page_size), call.page_stride, row_bytes, scale_base,
            scale_row, nope, rope, call.scale_tile, n_tiles, float(call.sm_scale),
            int(has_len), int(has_sink), int(call.invalid_index_rule == "any_negative"),
            int(call.sink_in_lse), int(call.empty_row_lse == "+inf"), split_len, n_splits)
    tune = dict(num_warps=num_warps or (4 if block_h == 16 else 8))
    if num_stages is not None:
        tune["num_stages"] = num_stages
    grid = (triton_cdiv(call.heads, block_h), call.batch, n_splits)
    LAST_COMPILED["mma2_kernel"] = j.mma2_kernel[grid](*args, **consts, **tune)
    _record("mma2_kernel", tuple(sorted(consts.items())) + tuple(sorted(tune.items())))
    if split:
        cw = combine_columns(nope_pad, rope_pad, v_rope)
        cconsts = dict(NOPE_PAD=nope_pad, ROPE_PAD=rope_pad, V_ROPE=v_rope,
                       BLOCK_H=COMBINE_BLOCK_H, CW=cw, SB=COMBINE_SB, MUTANT=mutant)
        chunks = nope_pad // cw + (rope_pad // cw if v_rope else 0)
        cgrid = (triton_cdiv(call.heads, COMBINE_BLOCK_H), call.batch, chunks)
        j.combine_kernel[cgrid](ws, wml, sink_arg, out, lse, call.heads, out.stride(0),
                                out.stride(1), lse.stride(0), nope, rope, n_splits,
                                int(has_sink), int(call.sink_in_lse),
                                int(call.empty_row_lse == "+inf"), **cconsts, num_warps=4)
        _record("combine_kernel", tuple(sorted(cconsts.items())))


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b
