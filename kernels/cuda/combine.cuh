// The split-KV combine kernel and the split launcher (the merge is defined in
// mla/split_kv.h, shared with the host model cpu-mma-split*).
//
// The split MMA kernel (mma_head_tiled.cuh, kSplit) writes one fp32 partial (m_i, l_i, O_i) per
// (query row, split, head); the combine reads them back. One block of kCombineThreads per
// (query row, head): threads i < ns load split i's (m_i, l_i) into shared memory, every thread
// works out the merged state {M, L} from them (merge_split_states: in split order, identical in
// every thread) and the weights a_i, then thread t merges output dims t, t + 128, ...: O_d =
// sum_i a_i O_i[col(d)] over the splits that hold a token (in split order, mul.rn/add.rn), out =
// bf16(O_d * (1 / (L + exp(sink - M)))) as the unsplit epilogue does (an empty row: 0), and
// thread 0 writes lse = softmax_lse({M, L}). Padded columns [nope, np) are never read or stored.
//
// Speed: the loads of kCombineBatch splits are issued together before the in-order sum. One warp
// per (row, head) with lane j loading split i's O one split after another takes 62-65 us at
// B=1, H=64, 8 splits on the H200 (ncu: 16 blocks, 6 % achieved occupancy, 94 % of cycles with
// no eligible warp: each load waits for the one before).
#pragma once

#include <atomic>

#include "kernels/cuda/mma_head_tiled.cuh"
#include "mla/split_kv.h"

namespace mla::cuda {

inline constexpr int kCombineThreads = 128;  // per (query row, head)
inline constexpr int kCombineBatch = 8;      // split partials loaded at once per output dim

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

// Grid (H, s_q, B): block (head, qt, b) merges head `head` of query token qt of batch row b.
template <Mutant M, bool EX>
__global__ void __launch_bounds__(kCombineThreads)
    split_combine_kernel(const __grid_constant__ DecodeParams p,
                         const __grid_constant__ LayoutPlan pl,
                         const __grid_constant__ SplitArgs sa) {
  __shared__ float sm_m[kMaxSplits], sm_l[kMaxSplits], sm_w[kMaxSplits];
  const int tid = threadIdx.x;
  const int head = blockIdx.x, qt = blockIdx.y, b = blockIdx.z;
  const int ns = split_count(split_row_tiles<M, EX>(p, b), sa.setting, sa.sm_count);
  // Split 0's entry of (b, qt, head); split i's is i * hpad further.
  const int64_t e0 = (static_cast<int64_t>(b) * p.s_q + qt) * sa.ns_max * sa.hpad + head;
  if (tid < ns) {
    const float* ml = sa.ws_ml + 2 * (e0 + static_cast<int64_t>(tid) * sa.hpad);
    sm_m[tid] = ml[0];
    sm_l[tid] = ml[1];
  }
  __syncthreads();
  const SoftmaxState merged = merge_split_states<M>(sm_m, sm_l, ns, 1);
  if (tid < ns) sm_w[tid] = split_weight<M>(sm_m[tid], merged.m);
  __syncthreads();
  // kSinkPerSplit: the partials hold the sink already; the combine adds none (lse too).
  const float* sink = (M == Mutant::kSinkIgnored || M == Mutant::kSinkPerSplit) ? nullptr : p.sink;
  const bool tokens = softmax_has_tokens(merged);
  const bool has = tokens || M == Mutant::kEmptyRowNaN;
  const float rden = __frcp_rn(softmax_denominator(merged, sink, head));
  uint16_t* orow = p.out + static_cast<int64_t>(b) * p.out_batch_stride +
                   static_cast<int64_t>(qt) * p.out_token_stride +
                   static_cast<int64_t>(head) * p.out_head_stride;
  const float* o0 = sa.ws_o + e0 * sa.ostride;
  const int64_t o_split = static_cast<int64_t>(sa.hpad) * sa.ostride;  // split i to i + 1
  const int nope = p.geom.nope_dim, dv = d_v(p.geom);
  for (int d = tid; d < dv; d += kCombineThreads) {
    const int col = d < nope ? d : pl.np + (d - nope);
    float acc = 0.0f;
    bool first = true;
    for (int i0 = 0; tokens && i0 < ns; i0 += kCombineBatch) {
      float o[kCombineBatch];
#pragma unroll
      for (int j = 0; j < kCombineBatch; ++j) {
        const int i = i0 + j;
        // An empty split's partial is never read (kSplitEmptyNaN reads it: it normalizes it).
        const bool read = i < ns && (M == Mutant::kSplitEmptyNaN || sm_m[i] != neg_inf());
        o[j] = read ? o0[i * o_split + col] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kCombineBatch; ++j) {
        const int i = i0 + j;
        if (i >= ns) break;
        float term;
        if constexpr (M == Mutant::kSplitEmptyNaN) {
          // Each split normalized by its own l, then weighted by a_i l_i: 0/0 when empty.
          term = mul_rn(mul_rn(sm_w[i], sm_l[i]), __fdiv_rn(o[j], sm_l[i]));
        } else {
          if (sm_m[i] == neg_inf()) continue;  // an empty split weighs 0: skipping is exact
          term = mul_rn(sm_w[i], o[j]);
        }
        acc = first ? term : add_rn(acc, term);
        first = false;
      }
    }
    orow[d] = float_to_bf16(has ? __fmul_rn(acc, rden) : 0.0f);
  }
  if (tid == 0) {
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
  const dim3 cgrid(p.heads, p.s_q, p.batch);
  split_combine_kernel<M, EX><<<cgrid, kCombineThreads, 0, s>>>(p, pl, sa);
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
