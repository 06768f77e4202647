"""Kernel time of triton-mma (v1 mma_kernel and mma2 variants) and triton-simt on the GPU.

Two figures per kernel variant (VARIANTS below; --variants picks them, the first is the
reference the others' outputs are compared with): triton.testing.do_bench's median (it clears
L2 before every call: the cold-cache time) and the hot time, the mean of 200 back-to-back
launches between two CUDA events (the Python launch overhead included where it exceeds the
kernel); with --graph also do_bench_cudagraph's median (the kernels alone, as cuda-mma's
bench_kernels times them).

    python3 bench/triton/bench_triton.py [--batch 32[,128]] [--heads 64] [--topk 512] [--page 64]
                                         [--variants simt,old-h32,mma2]

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
sys.path.insert(0, ROOT)  # the package kernels.triton

import torch  # noqa: E402
import triton.testing  # noqa: E402

import mlafuzz  # noqa: E402
from mlafuzz.worker.loader import import_file  # noqa: E402

if os.environ.get("MLAFUZZ_TRITON_DIR"):
    # Another copy of the kernels (a before/after comparison), loaded as the worker loads it.
    mla_triton = import_file(os.path.join(os.environ["MLAFUZZ_TRITON_DIR"], "mla_triton.py"))
else:
    from kernels.triton import mla_triton


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


#: name -> (launcher, keyword arguments). "old": mma_kernel as it was (one program per row and
#: head block, byte-wise gather); "mma2": mma2_kernel (split over the token list, vectorized
#: gather where aligned, hardware e4m3 decode), with the knobs that were compared on the H200.
VARIANTS = {
    "simt": ("launch", dict(kernel="simt_kernel")),
    "old-h16": ("launch", dict(kernel="mma_kernel", block_h=16)),
    "old-h32": ("launch", dict(kernel="mma_kernel", block_h=32)),
    "old-h64": ("launch", dict(kernel="mma_kernel", block_h=64)),
    "mma2-nosplit-slow": ("launch2", dict(split_tokens=None, fast=False)),
    "mma2-nosplit-fast-intdecode": ("launch2", dict(split_tokens=None, fp8cvt=False)),
    "mma2-nosplit-fast": ("launch2", dict(split_tokens=None)),
    "mma2-s256": ("launch2", dict(split_tokens=256)),
    "mma2-s128": ("launch2", dict(split_tokens=128)),
    "mma2-s64": ("launch2", dict(split_tokens=64)),
    "mma2-s128-slow": ("launch2", dict(split_tokens=128, fast=False)),
    "mma2-s128-h64": ("launch2", dict(split_tokens=128, block_h=64)),
    "mma2-s128-h16": ("launch2", dict(split_tokens=128, block_h=16)),
    "mma2-s128-w4": ("launch2", dict(split_tokens=128, num_warps=4)),
    "mma2-s128-st1": ("launch2", dict(split_tokens=128, num_stages=1)),
    "mma2-s128-st2": ("launch2", dict(split_tokens=128, num_stages=2)),
    "mma2-s128-n64": ("launch2", dict(split_tokens=128, block_n=64)),
    "mma2-s128-n16": ("launch2", dict(split_tokens=128, block_n=16)),
    "mma2-s128-h64-fp8": ("launch2", dict(split_tokens=128, block_h=64, fp8cvt=True)),
    "mma2-s128-h64-int": ("launch2", dict(split_tokens=128, block_h=64, fp8cvt=False)),
    "mma2-s128-h64-pf": ("launch2", dict(split_tokens=128, block_h=64, prefetch=True)),
    "mma2-s128-h64-fp8-pf": ("launch2", dict(split_tokens=128, block_h=64, fp8cvt=True,
                                             prefetch=True)),
    "mma2-s128-h64-w16": ("launch2", dict(split_tokens=128, block_h=64, num_warps=16)),
    "mma2-s128-h64-fp8-w16": ("launch2", dict(split_tokens=128, block_h=64, fp8cvt=True,
                                              num_warps=16)),
    "mma2-s64-h64": ("launch2", dict(split_tokens=64, block_h=64)),
    "mma2-s256-h64": ("launch2", dict(split_tokens=256, block_h=64)),
    "mma2": ("launch2", dict(block_h=64)),  # what triton-mma runs (triton_mma.py, PATH mma2)
    "mma2-n32": ("launch2", dict(block_h=64, block_n=32)),  # 32-token tiles against mma2's 64
    "mma2-h32-fp8": ("launch2", dict(block_h=32, fp8cvt=True)),
    "mma2-h64-w4": ("launch2", dict(block_h=64, num_warps=4)),
    "mma2-h64-n64": ("launch2", dict(block_h=64, block_n=64)),
    "mma2-h64-st2": ("launch2", dict(block_h=64, num_stages=2)),
    "mma2-int": ("launch2", dict(block_h=64, fp8cvt=False)),
    "mma2-fp8": ("launch2", dict(block_h=64, fp8cvt=True)),
    "mma2-w16": ("launch2", dict(block_h=64, fp8cvt=False, num_warps=16)),
    "mma2-fp8-w16": ("launch2", dict(block_h=64, fp8cvt=True, num_warps=16)),
    "mma2-fp8-w16-s64": ("launch2", dict(block_h=64, fp8cvt=True, num_warps=16,
                                         split_tokens=64)),
    "mma2-fp8-w16-s256": ("launch2", dict(block_h=64, fp8cvt=True, num_warps=16,
                                          split_tokens=256)),
    "mma2-fp8-w16-n64": ("launch2", dict(block_h=64, fp8cvt=True, num_warps=16, block_n=64)),
    "mma2-fp8-w16-n16": ("launch2", dict(block_h=64, fp8cvt=True, num_warps=16, block_n=16)),
    "mma2-fp8-w16-st1": ("launch2", dict(block_h=64, fp8cvt=True, num_warps=16, num_stages=1)),
    # The split length against the tile length (topk 128 rows are one split at 128)
    "mma2-s32": ("launch2", dict(block_h=64, split_tokens=32)),
    "mma2-s64b": ("launch2", dict(block_h=64, split_tokens=64)),
    "mma2-n64-s64": ("launch2", dict(block_h=64, block_n=64, split_tokens=64)),
    "mma2-n64-s256": ("launch2", dict(block_h=64, block_n=64, split_tokens=256)),
    "mma2-n64-q4": ("launch2", dict(block_h=64, block_n=64, split_tokens="quarter")),
    "mma2-q4": ("launch2", dict(block_h=64, split_tokens="quarter")),
}
DEFAULT = "simt,old-h32,mma2"
GRAPH = False
ONCE = False
PROFILE = False


def kernel_times(fn, reps: int = 20) -> str:
    """Device time per call of each kernel a launcher runs (torch.profiler, mean of reps)."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    parts = []
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None)
        if us is None:
            us = ev.cuda_time_total
        if us > 0 and ev.count >= reps:
            parts.append(f"{ev.key.split('(')[0][:40]} {us / reps:.1f} us x{ev.count // reps}")
    return "; ".join(parts) or "no CUDA kernels recorded"


def resources(launcher: str) -> str:
    """Registers per thread, spilled bytes and shared memory of the variant's main kernel."""
    k = mla_triton.LAST_COMPILED.get("mma2_kernel") if launcher == "launch2" else None
    if k is None:
        return ""
    try:
        md = k.metadata
        return (f" [regs {k.n_regs}, spills {k.n_spills}, shared {md.shared} B, "
                f"warps {md.num_warps}, stages {md.num_stages}]")
    except Exception as e:  # noqa: BLE001 - introspection differs between Triton versions
        return f" [resources unknown: {type(e).__name__}]"


def time_variant(call: mlafuzz.DecodeCall, name: str):
    launcher, kw = VARIANTS[name]
    if kw.get("split_tokens") == "quarter":  # four splits per row (at least one tile each)
        kw = dict(kw, split_tokens=max(kw.get("block_n", 32), call.topk // 4))
    fn = lambda: getattr(mla_triton, launcher)(call, check=False, **kw)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    print(f"{name}: compiled{resources(launcher)}", flush=True)
    if ONCE:
        fn()
        torch.cuda.synchronize()
        return 0.0, 0.0, None, call.out.float().clone(), call.lse.clone()
    out, lse = call.out.float().clone(), call.lse.clone()
    ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(200):
        fn()
    end.record()
    torch.cuda.synchronize()
    graph = None
    if GRAPH:
        try:  # the kernels' time without Python's launch cost (cuda-mma's figures are graph times)
            graph = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
        except Exception as e:  # noqa: BLE001 - a variant that cannot be captured still times
            print(f"{name}: no CUDA graph timing ({type(e).__name__}: {e})", flush=True)
    if PROFILE:
        print(f"{name}: kernels per call: {kernel_times(fn)}", flush=True)
    return ms, start.elapsed_time(end) / 200, graph, out, lse


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=str, default="32", help="comma-separated batch sizes")
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--topk", type=int, default=512)
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--variants", default=DEFAULT,
                    help=f"comma-separated, of: {', '.join(VARIANTS)} (default {DEFAULT})")
    ap.add_argument("--graph", action="store_true",
                    help="also time each variant in a CUDA graph (do_bench_cudagraph median)")
    ap.add_argument("--once", action="store_true",
                    help="run each variant twice and time nothing (for ncu: --launch-skip 1)")
    ap.add_argument("--profile", action="store_true",
                    help="also print each kernel's device time per call (torch.profiler)")
    a = ap.parse_args()
    global GRAPH, ONCE, PROFILE
    GRAPH, ONCE, PROFILE = a.graph, a.once, a.profile
    names = a.variants.split(",")
    for n in names:
        if n not in VARIANTS:
            ap.error(f"unknown variant {n!r}; known: {', '.join(VARIANTS)}")
    for b in (int(x) for x in a.batch.split(",")):
        call = make_call(b, a.heads, a.topk, a.page)
        results, ref = {}, None
        for name in names:
            try:
                ms, hot, graph, out, lse = time_variant(call, name)
            except Exception as e:  # noqa: BLE001 - report and go on with the other variants
                print(f"{name:<28} B={b}: FAILED {type(e).__name__}: {str(e)[-2000:]}", flush=True)
                continue
            if ref is None:
                ref = (name, out, lse)
            d_out = (out - ref[1]).abs().max().item()
            n_diff = int((out != ref[1]).sum().item())
            d_lse = (lse - ref[2]).abs().max().item()
            results[name] = ms
            print(f"{name:<28} B={b} H={a.heads} topk={a.topk} P={a.page}: "
                  f"cold {ms * 1000:8.1f} us (do_bench median), hot {hot * 1000:8.1f} us"
                  + (f", graph {graph * 1000:8.1f} us" if graph is not None else "") + "  "
                  f"vs {ref[0]}: max|out|d {d_out:.3g} ({n_diff} differ) lse {d_lse:.3g}",
                  flush=True)
        base = "simt" if "simt" in results else names[0]
        for name, ms in results.items():
            if name != base:
                print(f"B={b} speedup {name} over {base}: {results[base] / ms:.2f}x")
    print("compilations:", {k: v["configs"] for k, v in mla_triton.compilations().items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
