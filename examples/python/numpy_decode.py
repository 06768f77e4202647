"""Sparse MLA decode in plain numpy: the fp32 (SIMT) pipeline of docs/SPEC.md, as a python: backend.

    mlafuzz fuzz --backends python:examples/python/numpy_decode.py:decode --time 60s
    mlafuzz fuzz --backends python:examples/python/numpy_decode.py:decode_planted_bug --time 60s

``decode`` passes every property. ``decode_planted_bug`` is the same kernel with the bug
docs/SPEC.md section 1 warns about: the last nope tile is scaled with its neighbour's scale;
mlafuzz finds it and shrinks it to one row and one head.

Planted bugs for the mutation score (``MUTANTS`` below, one ``mutant_<name>`` each; backend
``python:examples/python/numpy_decode.py:decode~<name>``)::

    mlafuzz mutants --backends python:examples/python/numpy_decode.py:decode
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np

import mlafuzz


def dequantize(call: mlafuzz.DecodeCall, slots: np.ndarray, bug: bool = False) -> np.ndarray:
    """K for the given global slots.

    Args:
        call: the decode call (numpy arrays).
        slots: int64 ``[n]`` valid global slots (page = slot // page_size).
        bug: scale the last nope tile with the previous tile's scale (the planted bug).
    Returns:
        float32 ``[n, d_qk]``: nope dims dequantized (e4m3 * scale), then the bf16 rope dims.
    """
    codes, scales, rope = mlafuzz.token_parts(call, slots)  # the stored bytes, decoded
    if bug and scales.shape[1] > 1:
        scales[:, -1] = scales[:, -2]
    k_nope = mlafuzz.e4m3_to_float32(codes) * np.repeat(scales, call.scale_tile, axis=1)
    return np.concatenate([k_nope, rope], axis=1)


#: The planted bugs of this kernel (``mlafuzz mutants --backends python:...:decode`` scores
#: each): name -> what is wrong. ``mutant_<name>`` ('-' as '_') below runs it.
MUTANTS: Dict[str, str] = {
    "topk-length-off-by-one": "one entry past topk_length counts",
    "sink-ignored": "the sink term left out of the softmax denominator",
    "invalid-index-unmasked": "-1 entries are not masked: index -1 reads the last page's last "
                              "token",
    "no-max-subtraction": "softmax without subtracting the row maximum: exp overflows for large "
                          "logits",
    "wrong-scale-group": "the last nope tile is scaled with the previous tile's scale",
}


def valid_positions(call: mlafuzz.DecodeCall, b: int, mutant: str = "") -> np.ndarray:
    """int64 ``[n]``: the top-k positions of row b that count (docs/SPEC.md section 3)."""
    idx = call.indices[b]
    k = np.arange(call.topk)
    if mutant == "invalid-index-unmasked":
        ok = idx >= -1  # -1 counts (other negatives stay masked under any_negative)
    elif call.invalid_index_rule == "out_of_range":  # any index outside the cache
        ok = (idx >= 0) & (idx < call.page_size * call.num_pages)
    else:
        ok = idx != -1 if call.invalid_index_rule == "minus_one_only" else idx >= 0
    if call.topk_length is not None:
        extra = 1 if mutant == "topk-length-off-by-one" else 0
        ok &= k < call.topk_length[b] + extra
    return k[ok]


def attend(call: mlafuzz.DecodeCall, bug: bool = False, mutant: str = "") -> None:
    """fp32 pipeline: q * sm_scale, fp32 logits, softmax and P*V, bf16 store.

    ``mutant`` names a planted bug of MUTANTS ("" for the correct kernel).
    """
    bug = bug or mutant == "wrong-scale-group"
    sm_scale = np.float32(call.sm_scale)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for b in range(call.batch):
            pos = valid_positions(call, b, mutant)
            if pos.size == 0:
                call.out[b] = 0
                call.lse[b] = np.inf if call.empty_row_lse == "+inf" else -np.inf
                continue
            keys = dequantize(call, call.indices[b][pos].astype(np.int64), bug)  # [n, d_qk]
            qs = mlafuzz.bf16_to_float32(call.q[b]) * sm_scale  # [H, d_qk]
            # One matrix-vector product per head: a product of all heads at once lets BLAS pick
            # another kernel (another summation order) for another head count, and head-alone
            # (bitwise) caught exactly that with numpy 2.5's BLAS on the GPU machine.
            x = np.stack([keys @ qs[h] for h in range(call.heads)])  # [H, n] fp32
            m = x.max(axis=1)
            if mutant == "no-max-subtraction":
                m = np.zeros_like(m)
            p = np.exp(x - m[:, None])
            total = p.sum(axis=1, dtype=np.float32)
            values = np.ascontiguousarray(keys[:, : call.d_v])
            acc = np.stack([p[h] @ values for h in range(call.heads)])  # [H, d_v]
            denom = total
            if call.sink is not None and mutant != "sink-ignored":
                denom = total + np.exp(call.sink - m)
            call.out[b] = mlafuzz.float32_to_bf16(acc / denom[:, None])
            lse = m + np.log(total)
            if call.sink is not None and call.sink_in_lse:
                s = call.sink
                big = np.maximum(s, m)
                folded = big + np.log(total * np.exp(m - big) + np.exp(s - big))
                lse = np.where(s == np.inf, np.float32(np.inf), folded)
            call.lse[b] = lse


def supports(call: mlafuzz.DecodeCall) -> Optional[str]:
    """Sizes only (the arrays are None here)."""
    if call.nope_dim % call.scale_tile != 0:
        return "nope_dim must be a multiple of scale_tile"
    if call.s_q > 1 or call.has_extra:
        return "the production decode (s_q > 1, extra cache) is not implemented in this example"
    return None


# Every invalid-index rule (out_of_range is offered only to kernels that name it) and both V32
# scale conventions (the stored fp32 scale is read as it is).
ALL_CONVENTIONS = mlafuzz.Envelope(
    invalid_index_rules=["minus_one_only", "any_negative", "out_of_range"],
    v32_scales=["power_of_two", "fp32"])


@mlafuzz.kernel(name="numpy-fp32", precision="fp32_simt", device="cpu", envelope=ALL_CONVENTIONS)
def decode(call: mlafuzz.DecodeCall) -> None:
    """numpy fp32 pipeline (docs/SPEC.md), the example Python kernel."""
    attend(call)


@mlafuzz.kernel(name="numpy-fp32-planted-bug", precision="fp32_simt", device="cpu")
def decode_planted_bug(call: mlafuzz.DecodeCall) -> None:
    """numpy fp32 pipeline with a planted bug: the last nope tile takes its neighbour's scale."""
    attend(call, bug=True)


@mlafuzz.kernel(name="numpy-noop", precision="fp32_simt", device="cpu")
def decode_noop(call: mlafuzz.DecodeCall) -> None:
    """Returns at once (bench/python: the bridge's own cost)."""


@mlafuzz.kernel(name="numpy-zeros", precision="fp32_simt", device="cpu")
def decode_zeros(call: mlafuzz.DecodeCall) -> None:
    """Writes zeros (a wrong kernel doing no work: bench/python compares the harness's cost)."""
    call.out[...] = 0
    call.lse[...] = 0


def _make_mutant(name: str):
    """The kernel with the planted bug ``name`` (MUTANTS), as ``mutant_<name>``."""

    def run(call: mlafuzz.DecodeCall) -> None:
        attend(call, mutant=name)

    run.__name__ = "mutant_" + name.replace("-", "_")
    run.__doc__ = f"planted bug '{name}': {MUTANTS[name]}"
    return mlafuzz.kernel(name=f"numpy-fp32.{name}", precision="fp32_simt", device="cpu")(run)


# mutant_topk_length_off_by_one, mutant_sink_ignored, ...
for _name in MUTANTS:
    globals()["mutant_" + _name.replace("-", "_")] = _make_mutant(_name)
del _name
