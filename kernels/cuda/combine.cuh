// The split-KV combine kernel and the split launcher (issue 17; the merge is defined in
// kernels/common/split_kv.h, shared with the host model cpu-mma-split*).
//
// The split MMA kernel (mma_head_tiled.cuh, kSplit) writes one fp32 partial (m_i, l_i, O_i) per
// (query row, split, head); the combine reads them back. One warp per (query row, head), 4 per
// block: every
// lane works out the row's split count (the same function of the row's tile count and the SM
// count as the split kernel) and the merged state {M, L} from the ns partial maxima and sums (in
// split order, identical in every lane), then lane j merges output dims j, j + 32, ...: O_d =
// sum_i a_i O_i[col(d)] over the splits that hold a token (in split order, mul.rn/add.rn), out =
// bf16(O_d * (1 / (L + exp(sink - M)))) as the unsplit epilogue does (an empty row: 0), and lane
// 0 writes lse = softmax_lse({M, L}). Padded columns [nope, np) are never read or stored.
#pragma once

#include <atomic>

#include "kernels/common/split_kv.h"
#include "kernels/cuda/mma_head_tiled.cuh"

namespace mla::cuda {

inline constexpr int kCombineWarps = 4;  // heads per combine block

// The row's virtual tile count, as mma_head_tiled_kernel works it out (main tiles up to
// topk_length, then the extra list's up to extra_topk_length).
template <Mutant M, bool EX>
__device__ __forceinline__ int split_row_tiles(const DecodeParams& p, int b) {
  constexpr int T = kMmaTokenTile;
  const int32_t topk_len = p.topk_length != nullptr ? p.topk_length[b] : -1;
  int n_main = (effective_entries<M>(p.topk, topk_len) + T - 1) / T;
  if constexpr (M == Mutant::kDropPartialTile) n_main = min(n_main, p.topk / T);
  int n_tiles = n_main;
  if constexpr (EX) {
    const int32_t extra_len = p.extra_topk_length != nullptr ? p.extra_topk_length[b] : -1;
    n_tiles += (effective_entries<M>(p.extra_topk, extra_len) + T - 1) / T;
  }
  return n_tiles;
}

// Grid (ceil(H / kCombineWarps), s_q, B): warp w of block (x, qt, b) merges head
// x * kCombineWarps + w of query token qt of batch row b.
template <Mutant M, bool EX>
__global__ void __launch_bounds__(kCombineWarps * 32)
    split_combine_kernel(const __grid_constant__ DecodeParams p,
                         const __grid_constant__ LayoutPlan pl,
                         const __grid_constant__ SplitArgs sa) {
  const int lane = threadIdx.x & 31;
  const int head = blockIdx.x * kCombineWarps + (threadIdx.x >> 5);
  const int qt = blockIdx.y, b = blockIdx.z;
  if (head >= p.heads) return;  // no barrier below: a warp may leave alone
  const int ns = split_count(split_row_tiles<M, EX>(p, b), sa.setting, sa.sm_count);
  // Split 0's entry of (b, qt, head); split i's is i * hpad further.
  const int64_t e0 = (static_cast<int64_t>(b) * p.s_q + qt) * sa.ns_max * sa.hpad + head;
  const float* ml = sa.ws_ml + 2 * e0;
  const int ml_stride = 2 * sa.hpad;  // floats from split i to split i + 1
  const SoftmaxState merged = merge_split_states<M>(ml, ml + 1, ns, ml_stride);
  // kSinkPerSplit: the partials hold the sink already; the combine adds none (lse too).
  const float* sink = (M == Mutant::kSinkIgnored || M == Mutant::kSinkPerSplit) ? nullptr : p.sink;
  const bool has = softmax_has_tokens(merged) || M == Mutant::kEmptyRowNaN;
  const float rden = __frcp_rn(softmax_denominator(merged, sink, head));
  uint16_t* orow = p.out + static_cast<int64_t>(b) * p.out_batch_stride +
                   static_cast<int64_t>(qt) * p.out_token_stride +
                   static_cast<int64_t>(head) * p.out_head_stride;
  const int nope = p.geom.nope_dim, dv = d_v(p.geom);
  for (int d = lane; d < dv; d += 32) {
    const int col = d < nope ? d : pl.np + (d - nope);
    float acc = 0.0f;
    if (softmax_has_tokens(merged)) {
      bool first = true;
      for (int i = 0; i < ns; ++i) {
        const float mi = ml[i * ml_stride];
        const float oi = sa.ws_o[(e0 + static_cast<int64_t>(i) * sa.hpad) * sa.ostride + col];
        float term;
        if constexpr (M == Mutant::kSplitEmptyNaN) {
          // Each split normalized by its own l, then weighted by a_i l_i: 0/0 when empty.
          const float li = ml[i * ml_stride + 1];
          term = mul_rn(mul_rn(split_weight<M>(mi, merged.m), li), __fdiv_rn(oi, li));
        } else {
          if (mi == neg_inf()) continue;  // an empty split weighs 0: skipping is exact
          term = mul_rn(split_weight<M>(mi, merged.m), oi);
        }
        acc = first ? term : add_rn(acc, term);
        first = false;
      }
    }
    orow[d] = float_to_bf16(has ? __fmul_rn(acc, rden) : 0.0f);
  }
  if (lane == 0) {
    Conventions conv = p.conv;
    if constexpr (M == Mutant::kSinkInLse) conv.sink_in_lse = true;
    float lse = softmax_lse(merged, M == Mutant::kSinkPerSplit ? nullptr : p.sink, head, conv);
    if constexpr (M == Mutant::kLseLog2) lse *= 1.4426950408889634f;
    p.lse[static_cast<int64_t>(b) * p.lse_batch_stride +
          static_cast<int64_t>(qt) * p.lse_token_stride + head] = lse;
  }
}

// The device's SM count (0 when it cannot be queried: the automatic rule then gives 1 split).
inline int device_sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 0;
    return v;
  }();
  return n;
}

// The split geometry of a launch: the grid's split extent is the split count of a row whose
// every entry is valid (a row's own count, from its topk_length, is never larger: split_count
// grows with the tile count).
inline SplitArgs split_args(const DecodeParams& p, int block_h, int setting) {
  SplitArgs sa;
  sa.setting = setting;
  sa.sm_count = device_sm_count();
  const int tiles = (p.topk + kMmaTokenTile - 1) / kMmaTokenTile +
                    (p.has_extra ? (p.extra_topk + kMmaTokenTile - 1) / kMmaTokenTile : 0);
  sa.ns_max = split_count(tiles, setting, sa.sm_count);
  sa.hpad = (p.heads + block_h - 1) / block_h * block_h;
  sa.ostride = round_up(make_plan(p).wv, 8);
  return sa;
}

inline size_t split_workspace_bytes_impl(const DecodeParams& p, int block_h, int setting) {
  const SplitArgs sa = split_args(p, block_h, setting);
  const size_t entries = static_cast<size_t>(p.batch) * p.s_q * sa.ns_max * sa.hpad;
  return entries * (static_cast<size_t>(sa.ostride) + 2) * sizeof(float);
}

// The split MMA kernel over every (query token and head block, batch row, split), then the
// combine, on one stream.
template <int BH, int WG, Mutant M, bool EX>
int launch_mma_split_kernels(const DecodeParams& p, const SplitArgs& sa, void* stream) {
  const LayoutPlan pl = make_plan(p);
  constexpr size_t smem = mma_smem_bytes(BH, WG);
  static std::atomic<bool> attr_set{false};
  if (!attr_set.load()) {
    const cudaError_t e =
        cudaFuncSetAttribute(mma_head_tiled_kernel<BH, WG, M, EX, true>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, int{smem});
    if (e != cudaSuccess) return static_cast<int>(e);
    attr_set.store(true);
  }
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>((p.heads + BH - 1) / BH * p.s_q), p.batch, sa.ns_max);
  mma_head_tiled_kernel<BH, WG, M, EX, true><<<grid, BH / 16 * WG * 32, smem, s>>>(p, pl, sa);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return static_cast<int>(e);
  const dim3 cgrid((p.heads + kCombineWarps - 1) / kCombineWarps, p.s_q, p.batch);
  split_combine_kernel<M, EX><<<cgrid, kCombineWarps * 32, 0, s>>>(p, pl, sa);
  return static_cast<int>(cudaGetLastError());
}

// As launch_mma_head_tiled_t: the extra-cache kernel is instantiated for the normal kernel only
// (a mutant launch with an extra cache is refused).
template <int BH, Mutant M, int WG = mma_default_wg(BH)>
int launch_mma_split_t(const DecodeParams& p, int setting, void* workspace, size_t workspace_bytes,
                       void* stream) {
  if (mma_unsupported_impl(p, BH)) return kErrUnsupported;
  if (setting < kSplitMax) return kErrUnsupported;
  if (p.s_q > 65535) return kErrUnsupported;  // the combine's grid y
  SplitArgs sa = split_args(p, BH, setting);
  const size_t entries = static_cast<size_t>(p.batch) * p.s_q * sa.ns_max * sa.hpad;
  if (workspace == nullptr || workspace_bytes < split_workspace_bytes_impl(p, BH, setting)) {
    return kErrWorkspace;
  }
  sa.ws_o = static_cast<float*>(workspace);
  sa.ws_ml = sa.ws_o + entries * sa.ostride;
  if (p.has_extra) {
    if constexpr (M == Mutant::kNone) {
      return launch_mma_split_kernels<BH, WG, M, true>(p, sa, stream);
    } else {
      return kErrUnsupported;
    }
  }
  return launch_mma_split_kernels<BH, WG, M, false>(p, sa, stream);
}

}  // namespace mla::cuda
