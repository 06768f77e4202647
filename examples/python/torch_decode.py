"""Sparse MLA decode in PyTorch on the GPU: the MMA (bf16) pipeline of docs/SPEC.md section 4.

    mlafuzz fuzz --backends python:examples/python/torch_decode.py:decode --time 5m

Gather the selected tokens, dequantize them to bf16 (exact with power-of-two scales), then two
products with bf16 inputs and fp32 accumulation, one matrix-vector product per row and head (so
that a row or head computed alone gives the same bits): logits = q K^T (scaled in fp32
afterwards), and P V with p rounded to bf16 while the row sum uses the fp32 p. Run on the GPU
machine (scripts/gpu_python.sh); it needs torch with CUDA.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

import mlafuzz


_LUT: dict = {}


def _lut(torch: Any, device: Any) -> Any:
    if device not in _LUT:
        # float32 [256]: the value of each e4m3fn byte (0x7f and 0xff are NaN)
        table = mlafuzz.e4m3_to_float32(np.arange(256, dtype=np.uint8))
        _LUT[device] = torch.from_numpy(table).to(device)
    return _LUT[device]


def gather_keys(call: mlafuzz.DecodeCall, slots: Any) -> Any:
    """K of the given slots, in bf16.

    Args:
        call: the decode call (torch tensors on the GPU).
        slots: int64 ``[B, topk]`` global slots (invalid entries replaced by 0 beforehand).
    Returns:
        torch.bfloat16 ``[B, topk, d_qk]``: dequantized nope dims, then the rope dims.
    """
    import torch  # noqa: PLC0415 - device="cuda" kernels only

    cache = call.kv_cache  # uint8 [num_pages, page_stride]
    dev = cache.device
    page = (slots // call.page_size).unsqueeze(-1)
    j = (slots % call.page_size).unsqueeze(-1)
    nope, rope, tile = call.nope_dim, call.rope_dim, call.scale_tile
    tiles = nope // tile
    ar = lambda n: torch.arange(n, device=dev)  # noqa: E731
    if call.layout == "model1":
        data_bytes = nope + 2 * rope
        base = j * data_bytes
        nope_bytes = cache[page, base + ar(nope)]
        rope_bytes = cache[page, base + nope + ar(2 * rope)]
        scale_row = (tiles + 7) // 8 * 8
        exps = cache[page, call.page_size * data_bytes + j * scale_row + ar(tiles)]
        scales = torch.exp2(exps.float() - 127.0)
    else:  # v32: [nope e4m3][tiles x float32 scale][rope bf16] per token
        base = j * call.token_bytes
        nope_bytes = cache[page, base + ar(nope)]
        scales = cache[page, base + nope + ar(4 * tiles)].contiguous().view(torch.float32)
        rope_bytes = cache[page, base + nope + 4 * tiles + ar(2 * rope)]
    k_nope = _lut(torch, dev)[nope_bytes.long()] * scales.repeat_interleave(tile, dim=-1)
    k_rope = rope_bytes.contiguous().view(torch.bfloat16)  # little-endian pairs
    return torch.cat([k_nope.to(torch.bfloat16), k_rope], dim=-1)


def supports(call: mlafuzz.DecodeCall) -> Optional[str]:
    """Sizes only (the arrays are None here)."""
    if call.nope_dim % call.scale_tile != 0:
        return "nope_dim must be a multiple of scale_tile"
    if call.s_q > 1 or call.has_extra:
        return "the production decode (s_q > 1, extra cache) is not implemented in this example"
    return None


@mlafuzz.kernel(name="torch-bf16-mma", precision="bf16_mma", device="cuda",
                envelope=mlafuzz.Envelope(
                    invalid_index_rules=["minus_one_only", "any_negative", "out_of_range"],
                    v32_scales=["power_of_two", "fp32"]))
def decode(call: mlafuzz.DecodeCall) -> None:
    """PyTorch gather + dequantize + bf16 products with fp32 accumulation, per row and head."""
    import torch  # noqa: PLC0415 - device="cuda" kernels only

    dev = call.q.device
    idx = call.indices.long()  # [B, topk]
    if call.invalid_index_rule == "out_of_range":  # any index outside the cache
        valid = (idx >= 0) & (idx < call.page_size * call.num_pages)
    else:
        valid = idx != -1 if call.invalid_index_rule == "minus_one_only" else idx >= 0
    if call.topk_length is not None:
        k = torch.arange(call.topk, device=dev)
        valid &= k.unsqueeze(0) < call.topk_length.long().unsqueeze(1)
    keys = gather_keys(call, torch.where(valid, idx, torch.zeros_like(idx)))
    # Masked tokens must not reach the products: a poisoned slot holds NaNs, and 0 * NaN = NaN.
    keys = torch.where(valid.unsqueeze(-1), keys, torch.zeros_like(keys))
    kf = keys.float()  # bf16 values, exact in fp32: fp32 products and accumulation as the MMA
    qf = call.q.float()
    vf = kf[:, :, : call.d_v].contiguous()
    # One matrix-vector product per (row, head): cuBLAS picks its algorithm (and so the summation
    # order) by shape, so products over all rows or heads at once differ in the last bits when a
    # row or head is computed alone, which batch-alone and head-alone (bitwise) catch.
    x = torch.stack([torch.stack([torch.mv(kf[b], qf[b, h]) for h in range(call.heads)])
                     for b in range(call.batch)]) * call.sm_scale  # [B, H, topk] fp32
    x = x.masked_fill(~valid.unsqueeze(1), float("-inf"))
    m = x.amax(dim=-1)  # [B, H]; -inf on empty rows
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(x - m_safe.unsqueeze(-1))
    # Row sums one (row, head) at a time, each on a fresh (aligned) copy: torch's reduction picks
    # its summation order by the shape and alignment of the whole tensor (head-alone found it).
    total = torch.stack([torch.stack([p[b, h].clone().sum() for h in range(call.heads)])
                         for b in range(call.batch)])  # [B, H] fp32
    pb = p.to(torch.bfloat16).float()  # bf16 p for P*V, fp32 accumulation
    pv = torch.stack([torch.stack([torch.mv(vf[b].t(), pb[b, h].clone())
                                   for h in range(call.heads)])
                      for b in range(call.batch)])  # [B, H, d_v]
    denom = total
    if call.sink is not None:
        denom = total + torch.exp(call.sink.unsqueeze(0) - m_safe)
    out = pv / denom.unsqueeze(-1)
    empty = ~valid.any(dim=-1)  # [B]
    out = torch.where(empty.view(-1, 1, 1), torch.zeros_like(out), out)
    lse = m_safe + torch.log(total)
    if call.sink is not None and call.sink_in_lse:
        s = call.sink.unsqueeze(0).expand_as(m_safe)
        big = torch.maximum(s, m_safe)
        folded = big + torch.log(total * torch.exp(m_safe - big) + torch.exp(s - big))
        lse = torch.where(s == float("inf"), s, folded)
    empty_lse = float("inf") if call.empty_row_lse == "+inf" else float("-inf")
    lse = torch.where(empty.view(-1, 1), torch.full_like(lse, empty_lse), lse)
    call.out.copy_(out.to(torch.bfloat16))
    call.lse.copy_(lse)


@mlafuzz.kernel(name="torch-noop", precision="bf16_mma", device="cuda")
def decode_noop(call: mlafuzz.DecodeCall) -> None:
    """Returns at once (bench/python: the bridge's own cost on the GPU)."""
