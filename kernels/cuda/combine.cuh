// The split-KV combine kernel and the split launcher (issue 17; the merge is defined in
// kernels/common/split_kv.h, shared with the host model cpu-mma-split*).
//
// The split MMA kernel (mma_head_tiled.cuh, kSplit) writes one fp32 partial (m_i, l_i, O_i) per
// (row, split, head); the combine reads them back. One warp per (row, head), 4 per block: every
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

template <Mutant M>
__global__ void __launch_bounds__(kCombineWarps * 32)
    split_combine_kernel(const __grid_constant__ DecodeParams p,
                         const __grid_constant__ LayoutPlan pl,
                         const __grid_constant__ SplitArgs sa) {
  const int lane = threadIdx.x & 31;
  const int head = blockIdx.x * kCombineWarps + (threadIdx.x >> 5);
  const int b = blockIdx.y;
  if (head >= p.heads) return;  // no barrier below: a warp may leave alone
  const int32_t topk_len = p.topk_length != nullptr ? p.topk_length[b] : -1;
  const int n_tiles = list_tiles<M>(p.topk, topk_len, kMmaTokenTile);
  const int ns = split_count(n_tiles, sa.setting, sa.sm_count);
  const int64_t e0 = static_cast<int64_t>(b) * sa.ns_max * sa.hpad + head;  // split 0's entry
  const float* ml = sa.ws_ml + 2 * e0;
  const int ml_stride = 2 * sa.hpad;  // floats from split i to split i + 1
  const SoftmaxState merged = merge_split_states<M>(ml, ml + 1, ns, ml_stride);
  // kSinkPerSplit: the partials hold the sink already; the combine adds none (lse too).
  const float* sink = (M == Mutant::kSinkIgnored || M == Mutant::kSinkPerSplit) ? nullptr : p.sink;
  const bool has = softmax_has_tokens(merged) || M == Mutant::kEmptyRowNaN;
  const float rden = __frcp_rn(softmax_denominator(merged, sink, head));
  uint16_t* orow = p.out + static_cast<int64_t>(b) * p.out_batch_stride +
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
    p.lse[static_cast<int64_t>(b) * p.lse_batch_stride + head] = lse;
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
  sa.ns_max = split_count((p.topk + kMmaTokenTile - 1) / kMmaTokenTile, setting, sa.sm_count);
  sa.hpad = (p.heads + block_h - 1) / block_h * block_h;
  sa.ostride = round_up(make_plan(p).wv, 8);
  return sa;
}

inline size_t split_workspace_bytes_impl(const DecodeParams& p, int block_h, int setting) {
  const SplitArgs sa = split_args(p, block_h, setting);
  const size_t entries = static_cast<size_t>(p.batch) * sa.ns_max * sa.hpad;
  return entries * (static_cast<size_t>(sa.ostride) + 2) * sizeof(float);
}

// The split MMA kernel over every (head block, row, split), then the combine, on one stream.
template <int BH, Mutant M, int WG = mma_default_wg(BH)>
int launch_mma_split_t(const DecodeParams& p, int setting, void* workspace, size_t workspace_bytes,
                       void* stream) {
  if (mma_unsupported_impl(p, BH)) return kErrUnsupported;
  if (setting < kSplitMax) return kErrUnsupported;
  const LayoutPlan pl = make_plan(p);
  SplitArgs sa = split_args(p, BH, setting);
  const size_t entries = static_cast<size_t>(p.batch) * sa.ns_max * sa.hpad;
  if (workspace == nullptr || workspace_bytes < split_workspace_bytes_impl(p, BH, setting)) {
    return kErrWorkspace;
  }
  sa.ws_o = static_cast<float*>(workspace);
  sa.ws_ml = sa.ws_o + entries * sa.ostride;
  constexpr size_t smem = mma_smem_bytes(BH, WG);
  static std::atomic<bool> attr_set{false};
  if (!attr_set.load()) {
    const cudaError_t e =
        cudaFuncSetAttribute(mma_head_tiled_kernel<BH, WG, M, true>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, int{smem});
    if (e != cudaSuccess) return static_cast<int>(e);
    attr_set.store(true);
  }
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid((p.heads + BH - 1) / BH, p.batch, sa.ns_max);
  mma_head_tiled_kernel<BH, WG, M, true><<<grid, BH / 16 * WG * 32, smem, s>>>(p, pl, sa);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return static_cast<int>(e);
  const dim3 cgrid((p.heads + kCombineWarps - 1) / kCombineWarps, p.batch);
  split_combine_kernel<M><<<cgrid, kCombineWarps * 32, 0, s>>>(p, pl, sa);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace mla::cuda
