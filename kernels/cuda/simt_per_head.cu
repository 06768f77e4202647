// The SIMT per-head kernel (the "old" kernel, docs/SPEC.md section 4, SIMT pipeline).
//
// One thread block of 128 threads (4 warps) per (batch row, query token, head) (grid x: the
// token-major (token, head) pairs, grid y: batch rows; any H); each head re-reads the selected
// KV (that is the design being replaced, not a weakness of this implementation). The token's
// main list's tiles, then its extra list's (docs/SPEC.md section 8; the extra list starts a tile of
// its own, as cpu-simt walks them) through one online softmax: one loop over the virtual tile
// range [0, n_main + n_extra), tile_list() mapping a tile to its list and first entry.
// q * sm_scale in fp32 in smem, padded to np + rope columns with the padded columns zero.
// Per tile of kSimtTokenTile = 32 tokens (raw bytes double-buffered, the next tile gathered with
// 16-byte cp.async while this one is computed; masked tokens are never read):
//   logits: warp w takes tokens w, w+4, ...; lanes split the 576 columns in 8-column units
//           (8-byte fp8 / 16-byte rope smem reads, fp8 -> fp32 * scale, fp32 FMAs), butterfly
//           warp reduction; masked tokens get -inf
//   softmax: lane j of every warp computes p_j = exp(x_j - m) (fp32), the tile sum by butterfly
//           (identical in every warp), O and l rescaled by alpha
//   P*V: thread owns 4-column units tid and tid + 128 of V, accumulates p_j * V_j in fp32
// out = O / (l + exp(sink - m)) rounded to bf16; padded columns never stored.
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch.h"

namespace mla::cuda {
namespace {

constexpr int kSimtThreads = 128;
constexpr int kSimtWarps = kSimtThreads / 32;

constexpr size_t simt_smem_bytes() {
  return 2 * static_cast<size_t>(kSimtTokenTile) * kMaxRawStride + kMaxKCols * 4 +
         kSimtTokenTile * 4 + 2 * kSimtTokenTile * 4;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// EX: the call has an extra cache (a template flag: the one-cache kernel is the code it was).
template <Mutant M, bool EX>
__global__ void __launch_bounds__(kSimtThreads, 4)
    simt_per_head_kernel(const __grid_constant__ DecodeParams p,
                         const __grid_constant__ LayoutPlan pl) {
  constexpr int T = kSimtTokenTile;
  static_assert(T == 32, "one lane per token of a tile");
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* raw = smem;                                                 // [2][T][stride]
  float* qs = reinterpret_cast<float*>(smem + 2 * T * kMaxRawStride);  // [np + rope]
  float* xs = qs + kMaxKCols;                                          // [T] logits
  int* s_valid = reinterpret_cast<int*>(xs + T);                       // [2][T]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int b = blockIdx.y;
  const int qt = static_cast<int>(blockIdx.x) / p.heads;  // query token of the row
  const int head = static_cast<int>(blockIdx.x) - qt * p.heads;
  const int nope = p.geom.nope_dim;
  // topk_length (and extra_topk_length) are per batch row, shared by its s_q tokens.
  const int32_t topk_len = p.topk_length != nullptr ? p.topk_length[b] : -1;
  // Tiles past topk_length hold no valid token; skipping them is bit-identical (alpha = 1).
  int n_main = (effective_entries<M>(p.topk, topk_len) + T - 1) / T;
  if constexpr (M == Mutant::kDropPartialTile) n_main = min(n_main, p.topk / T);
  int32_t extra_len = -1;
  int n_tiles = n_main;
  if constexpr (EX) {
    extra_len = p.extra_topk_length != nullptr ? p.extra_topk_length[b] : -1;
    n_tiles += (effective_entries<M>(p.extra_topk, extra_len) + T - 1) / T;
  }
  // Virtual tile -> (list, first entry k0): [0, n_main) the main list, then the extra list.
  auto tile_list = [&](int tile, int& k0) -> ListView {
    if constexpr (EX) {
      if (tile >= n_main) {
        k0 = (tile - n_main) * T;
        return extra_list(p, pl, b, qt, extra_len);
      }
    }
    k0 = tile * T;
    return main_list(p, pl, b, qt, topk_len);
  };

  // Warp w gathers tokens w + 4i (i < 8); lane i holds token i's index (loaded one tile
  // ahead), validity and section offsets, then the warp copies the valid tokens in turn.
  constexpr int TPW = T / kSimtWarps;
  auto load_idx = [&](int tile) -> int32_t {
    int k0;
    const ListView L = tile_list(tile, k0);
    const int k = k0 + warp + kSimtWarps * lane;
    return (lane < TPW && k < L.topk) ? __ldg(L.idx + k) : -1;
  };
  auto stage = [&](int tile, int buf, int32_t idx) {
    int k0;
    const ListView L = tile_list(tile, k0);
    uint8_t* dst = raw + buf * T * kMaxRawStride;
    const int j = warp + kSimtWarps * lane;
    bool v = false;
    int64_t s0 = 0, s1 = 0;
    if (lane < TPW) {
      v = entry_valid<M>(p, L, idx, k0 + j);
      if (v) slot_offsets<M>(L, pl, idx, s0, s1);
      s_valid[buf * T + j] = v;
    }
    const unsigned vmask = __ballot_sync(0xffffffffu, v);
#pragma unroll
    for (int i = 0; i < TPW; ++i) {
      const int64_t a0 = __shfl_sync(0xffffffffu, s0, i);
      const int64_t a1 = __shfl_sync(0xffffffffu, s1, i);
      if ((vmask >> i) & 1u) {
        stage_token(L, pl, a0, a1, dst + (warp + kSimtWarps * i) * pl.raw_stride, lane);
      }
    }
    cp_async_commit();
  };

  // q * sm_scale (fp32) in the padded column layout: nope, zeros, rope.
  const uint16_t* qrow = p.q + static_cast<int64_t>(b) * p.q_batch_stride +
                         static_cast<int64_t>(qt) * p.q_token_stride +
                         static_cast<int64_t>(head) * p.q_head_stride;
  for (int col = tid; col < pl.dkp; col += kSimtThreads) {
    float v = 0.0f;
    if (col < nope) {
      v = bf16_to_float(qrow[col]) * p.sm_scale;
    } else if (col >= pl.np) {
      v = bf16_to_float(qrow[nope + col - pl.np]) * p.sm_scale;
    }
    qs[col] = v;
  }
  int32_t next_idx = n_tiles > 0 ? load_idx(0) : -1;
  if (n_tiles > 0) stage(0, 0, next_idx);

  SoftmaxState st;
  float acc[2][4] = {};
  const int upr = pl.dkp / 8;
  const float ninf = neg_inf();

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int buf = tile & 1;
    const uint8_t* rbuf = raw + buf * T * kMaxRawStride;
    if (tile + 1 < n_tiles) next_idx = load_idx(tile + 1);
    cp_async_wait_all();
    __syncthreads();  // tile `buf` staged; everyone is done with the other buffer and xs
    if (tile + 1 < n_tiles) stage(tile + 1, buf ^ 1, next_idx);

    // ---- logits: one warp per token, lanes over 8-column units ----
    for (int j = warp; j < T; j += kSimtWarps) {
      float dot = 0.0f;
      const bool valid = s_valid[buf * T + j] != 0;
      if (valid) {
        const uint8_t* tok = rbuf + j * pl.raw_stride;
        for (int u = lane; u < upr; u += 32) {
          const int col = u * 8;
          const float4 q0 = *reinterpret_cast<const float4*>(qs + col);
          const float4 q1 = *reinterpret_cast<const float4*>(qs + col + 4);
          float k[8];
          if (col < nope) {
            const uint2 r8 = *reinterpret_cast<const uint2*>(tok + col);
            const float s = staged_scale<M>(p, pl, tok, col / p.geom.scale_tile);
            const float2 f0 = e4m3x2_to_float2(static_cast<uint16_t>(r8.x & 0xffffu));
            const float2 f1 = e4m3x2_to_float2(static_cast<uint16_t>(r8.x >> 16));
            const float2 f2 = e4m3x2_to_float2(static_cast<uint16_t>(r8.y & 0xffffu));
            const float2 f3 = e4m3x2_to_float2(static_cast<uint16_t>(r8.y >> 16));
            k[0] = f0.x * s, k[1] = f0.y * s, k[2] = f1.x * s, k[3] = f1.y * s;
            k[4] = f2.x * s, k[5] = f2.y * s, k[6] = f3.x * s, k[7] = f3.y * s;
          } else if (col >= pl.np) {
            const uint8_t* r = tok + pl.rope_off + 2 * (col - pl.np);
            uint4 w;
            if (pl.rope_vec16) {
              w = *reinterpret_cast<const uint4*>(r);
            } else {
              const uint32_t* r4 = reinterpret_cast<const uint32_t*>(r);
              w = make_uint4(r4[0], r4[1], r4[2], r4[3]);
            }
            k[0] = bf16lo(w.x), k[1] = bf16hi(w.x), k[2] = bf16lo(w.y), k[3] = bf16hi(w.y);
            k[4] = bf16lo(w.z), k[5] = bf16hi(w.z), k[6] = bf16lo(w.w), k[7] = bf16hi(w.w);
          } else {
            continue;  // padded nope columns: masked, never read
          }
          dot = fmaf(q0.x, k[0], dot);
          dot = fmaf(q0.y, k[1], dot);
          dot = fmaf(q0.z, k[2], dot);
          dot = fmaf(q0.w, k[3], dot);
          dot = fmaf(q1.x, k[4], dot);
          dot = fmaf(q1.y, k[5], dot);
          dot = fmaf(q1.z, k[6], dot);
          dot = fmaf(q1.w, k[7], dot);
        }
        dot = warp_sum(dot);
      }
      if (lane == 0) xs[j] = valid ? dot : ninf;
    }
    __syncthreads();  // logits of the tile ready

    // ---- online softmax: lane j holds token j's weight; identical in every warp ----
    const float xj = xs[lane];
    const float tile_max = warp_max(xj);
    float alpha;
    if constexpr (M == Mutant::kNoRescale) {
      st.m = fmaxf(st.m, tile_max);
      alpha = 1.0f;
    } else {
      alpha = softmax_advance(st, tile_max);
    }
    const float pj = xj == ninf ? 0.0f : softmax_weight(st, xj);  // masked: exactly 0
    if constexpr (M == Mutant::kRowSumBf16) {
      st.l += warp_sum(round_to_bf16(pj));
    } else {
      st.l += warp_sum(pj);
    }

    // ---- P*V: 4-column units tid and tid + 128 ----
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][i] *= alpha;
    }
    // The shuffle that broadcasts p_j runs in every lane (no divergent exit before it).
#pragma unroll 4
    for (int j = 0; j < T; ++j) {
      const float pw = __shfl_sync(0xffffffffu, pj, j);
      if (!s_valid[buf * T + j]) continue;  // masked tokens: bytes never staged nor read
      const uint8_t* tok = rbuf + j * pl.raw_stride;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int col = (tid + r * kSimtThreads) * 4;
        if (col >= pl.wv || (col >= nope && col < pl.np)) continue;  // padded: never read
        float v[4];
        if (col < nope) {
          const uint32_t r4 = *reinterpret_cast<const uint32_t*>(tok + col);
          const float s = staged_scale<M>(p, pl, tok, col / p.geom.scale_tile);
          const float2 f0 = e4m3x2_to_float2(static_cast<uint16_t>(r4 & 0xffffu));
          const float2 f1 = e4m3x2_to_float2(static_cast<uint16_t>(r4 >> 16));
          v[0] = f0.x * s, v[1] = f0.y * s, v[2] = f1.x * s, v[3] = f1.y * s;
        } else {
          const uint32_t* rp =
              reinterpret_cast<const uint32_t*>(tok + pl.rope_off + 2 * (col - pl.np));
          const uint32_t w0 = rp[0], w1 = rp[1];
          v[0] = bf16lo(w0), v[1] = bf16hi(w0), v[2] = bf16lo(w1), v[3] = bf16hi(w1);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[r][i] = fmaf(pw, v[i], acc[r][i]);
      }
    }
  }

  // ---- epilogue ----
  const float* sink = M == Mutant::kSinkIgnored ? nullptr : p.sink;
  const bool has = softmax_has_tokens(st) || M == Mutant::kEmptyRowNaN;
  const float denom = softmax_denominator(st, sink, head);
  uint16_t* orow = p.out + static_cast<int64_t>(b) * p.out_batch_stride +
                   static_cast<int64_t>(qt) * p.out_token_stride +
                   static_cast<int64_t>(head) * p.out_head_stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int col = (tid + r * kSimtThreads) * 4;
    if (col >= pl.wv) break;
    int d;
    if constexpr (M == Mutant::kStorePaddedColumns) {
      d = col;
    } else {
      if (col < nope) {
        d = col;
      } else if (col < pl.np) {
        continue;
      } else {
        d = nope + col - pl.np;
      }
    }
    uint32_t w[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float y0 = has ? acc[r][2 * i] / denom : 0.0f;
      const float y1 = has ? acc[r][2 * i + 1] / denom : 0.0f;
      w[i] = pack_bf16x2(y0, y1);
    }
    if (pl.out_vec8) {
      *reinterpret_cast<uint2*>(orow + d) = make_uint2(w[0], w[1]);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) orow[d + i] = static_cast<uint16_t>(w[i / 2] >> (16 * (i & 1)));
    }
  }
  if (tid == 0) {
    Conventions conv = p.conv;
    if constexpr (M == Mutant::kSinkInLse) conv.sink_in_lse = true;
    float lse = softmax_lse(st, p.sink, head, conv);
    if constexpr (M == Mutant::kLseLog2) lse *= 1.4426950408889634f;
    p.lse[static_cast<int64_t>(b) * p.lse_batch_stride +
          static_cast<int64_t>(qt) * p.lse_token_stride + head] = lse;
  }
}

}  // namespace

std::optional<std::string> simt_unsupported(const DecodeParams& p) {
  if (auto why = common_unsupported(p)) return why;
  if (static_cast<int64_t>(p.heads) * p.s_q > 0x7fffffffLL)
    return "too many (query token, head) pairs for grid x";
  return std::nullopt;
}

int launch_simt_per_head(const DecodeParams& p, void* stream) {
  if (simt_unsupported(p)) return kErrUnsupported;
  const LayoutPlan pl = make_plan(p);
  constexpr size_t smem = simt_smem_bytes();
  static_assert(smem <= 48 * 1024, "no opt-in needed");
  // x: (query token, head) pairs, the heads of a token adjacent (they read the same tokens: L2
  // reuse); y: batch rows.
  const dim3 grid(static_cast<unsigned>(p.heads * p.s_q), p.batch);
  const auto st = static_cast<cudaStream_t>(stream);
  if (p.has_extra) {
    simt_per_head_kernel<Mutant::kNone, true><<<grid, kSimtThreads, smem, st>>>(p, pl);
  } else {
    simt_per_head_kernel<Mutant::kNone, false><<<grid, kSimtThreads, smem, st>>>(p, pl);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace mla::cuda
