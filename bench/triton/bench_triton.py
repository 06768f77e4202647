"""Kernel time of triton-mma (BLOCK_H 16/32/64) and triton-simt on the GPU.

Two figures per kernel: triton.testing.do_bench's median (it clears L2 before every call: the
cold-cache time) and the hot time, the mean of 200 back-to-back launches between two CUDA events
(the Python launch overhead included where it exceeds the kernel).

    python3 bench/triton/bench_triton.py [--batch 32] [--heads 64] [--topk 512] [--page 64]

MODEL1 (448 e4m3 + 64 bf16 rope, ue8m0 scales), indices drawn from the whole cache; the cache
bytes are random finite e4m3 with scales 2^-4..2^3. The index check of a campaign call
(one device sync) is left out: this is the kernels' time.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.environ.get("MLAFUZZ_TRITON_DIR", os.path.join(ROOT, "kernels", "triton")))

import torch  # noqa: E402
import triton.testing  # noqa: E402

import mla_triton  # noqa: E402
import mlafuzz  # noqa: E402


def make_call(b: int, h: int, topk: int, page: int, seed: int = 0) -> mlafuzz.DecodeCall:
    g = torch.Generator(device="cuda").manual_seed(seed)
    nope, rope, tile = 448, 64, 64
    row = nope + 2 * rope
    stride = page * (row + 8)
    pages = max(1, (b * topk * 2 + page - 1) // page)
    cache = torch.randint(0, 256, (pages, stride), dtype=torch.uint8, device="cuda", generator=g)
    view = cache[:, : page * row].view(pages, page, row)
    view[:, :, :nope] &= 0x77  # finite e4m3, |x| < 256
    bf = (torch.randn(pages, page, rope, device="cuda", generator=g) * 0.5).to(torch.bfloat16)
    view[:, :, nope:] = bf.view(torch.uint8).view(pages, page, 2 * rope)
    sc = cache[:, page * row: page * row + page * 8].view(pages, page, 8)
    sc[:, :, :7] = torch.randint(123, 131, (pages, page, 7), dtype=torch.uint8, device="cuda",
                                 generator=g)
    q = (torch.randn(b, h, nope + rope, device="cuda", generator=g)).to(torch.bfloat16)
    idx = torch.randint(0, pages * page, (b, topk), dtype=torch.int32, device="cuda",
                        generator=g)
    out = torch.empty(b, h, nope + rope, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(b, h, dtype=torch.float32, device="cuda")
    return mlafuzz.DecodeCall(
        layout="model1", nope_dim=nope, rope_dim=rope, scale_tile=tile, page_size=page,
        num_pages=pages, page_stride=stride, kv_cache_bytes=pages * stride, token_bytes=584,
        d_qk=nope + rope, d_v=nope + rope, invalid_index_rule="minus_one_only",
        empty_row_lse="+inf", sink_in_lse=False, batch=b, heads=h, topk=topk,
        sm_scale=(nope + rope) ** -0.5, memory="device", q=q, kv_cache=cache, indices=idx,
        out=out, lse=lse, q_head_stride=nope + rope, q_batch_stride=h * (nope + rope))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--topk", type=int, default=512)
    ap.add_argument("--page", type=int, default=64)
    a = ap.parse_args()
    call = make_call(a.batch, a.heads, a.topk, a.page)
    results = {}
    runs = [("triton-simt", dict(kernel="simt_kernel"))]
    runs += [(f"triton-mma BLOCK_H {bh}", dict(kernel="mma_kernel", block_h=bh))
             for bh in mla_triton.MMA_BLOCK_H]
    ref_out = None
    for name, kw in runs:
        fn = lambda kw=kw: mla_triton.launch(call, check=False, **kw)  # noqa: E731
        fn()
        torch.cuda.synchronize()
        out = call.out.float().clone()
        if ref_out is None:
            ref_out = out
        diff = (out - ref_out).abs().max().item()
        ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(200):
            fn()
        end.record()
        torch.cuda.synchronize()
        hot = start.elapsed_time(end) / 200
        results[name] = ms
        print(f"{name:<24} B={a.batch} H={a.heads} topk={a.topk} P={a.page}: "
              f"cold {ms * 1000:8.1f} us (do_bench median), hot {hot * 1000:8.1f} us  "
              f"max|out - simt|={diff:.3g}", flush=True)
    simt = results["triton-simt"]
    for name, ms in results.items():
        if name != "triton-simt":
            print(f"speedup {name} over triton-simt: {simt / ms:.2f}x")
    print("compilations:", {k: v["configs"] for k, v in mla_triton.compilations().items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
