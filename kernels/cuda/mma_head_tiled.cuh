// The tensor-core head-tiled kernel (the "new" kernel, SPEC.md section 4, MMA pipeline).
//
// One thread block per (batch row, block of BH heads); 4*BH/16 warps (8 for BH = 32).
// Per tile of kMmaTokenTile = 64 selected tokens:
//   B1  raw bytes of the tile (gathered with cp.async during the previous tile) are ready
//   dequant: every thread turns raw bytes into the bf16 K tile Ks[64][576+8] once for all heads
//            (fp8 * scale exact in fp32, cvt to bf16 exact); masked tokens and padded columns
//            are written as zeros and their bytes are never loaded
//   B2  (removed by Mutant::kMissingBarrier)
//   gather: the next tile's raw bytes are requested (cp.async), overlapping the MMAs below
//   S phase: warp w computes S = Q K^T for head group w % G and tokens 16*(w / G) .. +15 with
//            mma.sync m16n8k16 bf16 (ldmatrix fragments), scales by sm_scale in fp32 AFTER the
//            product, writes -inf for masked tokens into Ss[BH][64+8] fp32
//   B3
//   PV phase: warp w owns head group w % G and V columns [144*(w/G), +144) (18 n8 tiles of fp32
//            accumulators in registers); reads its 16 rows of S, row max by quad shuffles (every
//            warp of a head group computes identical m and l), p = exp(x - m) in fp32, l += sum
//            of the unrounded p, O *= alpha, P rounded to bf16 as the A operand and V = Ks
//            (ldmatrix.trans) as the B operand.
// Finally O / (l + exp(sink - m)) rounded to bf16; padded columns are never stored.
//
// Shared memory (dynamic): raw staging 64*656, Ks 64*584*2, Qs BH*584*2, Ss BH*72*4, validity
// 2*64*4: 160 KiB for BH = 32, 205.5 KiB for BH = 64. Rows of Ks and Qs are padded by 16 bytes
// (584 bf16 = 73 16-byte units, odd) so that ldmatrix rows hit distinct bank groups.
#pragma once

#include <atomic>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch.h"

namespace mla::cuda {

inline constexpr int kMmaKStride = kMaxKCols + 8;      // bf16 elements per Ks/Qs row
inline constexpr int kMmaSStride = kMmaTokenTile + 8;  // fp32 elements per Ss row

constexpr size_t mma_smem_bytes(int bh) {
  return static_cast<size_t>(kMmaTokenTile) * kMaxRawStride +
         static_cast<size_t>(kMmaTokenTile) * kMmaKStride * 2 +
         static_cast<size_t>(bh) * kMmaKStride * 2 + static_cast<size_t>(bh) * kMmaSStride * 4 +
         2 * kMmaTokenTile * 4;
}

// Warps per head group: 8 for BH = 32 (16 warps), 4 for BH = 64 (16 warps). With one block per
// SM (the tiles take 160-206 KiB of shared memory) the kernel is latency-bound; 16 warps hide
// more of it than 8 (measured on the H200: see README, "Kernel speed on the H200").
constexpr int mma_default_wg(int bh) { return bh == 32 ? 8 : 4; }

template <int BH, int WG, Mutant M>
__global__ void __launch_bounds__(BH / 16 * WG * 32, 1)
    mma_head_tiled_kernel(const __grid_constant__ DecodeParams p,
                          const __grid_constant__ LayoutPlan pl) {
  constexpr int G = BH / 16;  // head groups of 16 rows (the MMA M dimension)
  constexpr int NW = G * WG;  // warps
  constexpr int NT = NW * 32;
  constexpr int T = kMmaTokenTile;
  constexpr int KS = kMmaKStride;
  constexpr int SS = kMmaSStride;
  constexpr int TOK = T / WG;         // S phase: tokens per warp (16 or 8)
  constexpr int NS = TOK / 8;         // S phase: n8 tiles per warp (2 or 1)
  constexpr int CW = kMaxKCols / WG;  // PV phase: V columns per warp (144 or 72)
  constexpr int NTILE = CW / 8;       // PV phase: n8 tiles of O per warp (18 or 9)
  static_assert(WG == 4 || WG == 8, "4 or 8 warps per head group");
  static_assert(CW * WG == kMaxKCols && CW % 8 == 0, "column chunks must tile the V width");

  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* raw = smem;                                                   // [T][raw_stride]
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem + T * kMaxRawStride);  // [T][KS] bf16
  uint16_t* Qs = Ks + T * KS;                                            // [BH][KS] bf16
  float* Ss = reinterpret_cast<float*>(Qs + BH * KS);                    // [BH][SS] fp32
  int* s_valid = reinterpret_cast<int*>(Ss + BH * SS);                   // [2][T]

#ifndef NDEBUG
  if (blockDim.x != NT) __trap();
#endif
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int b = blockIdx.y;
  const int h0 = blockIdx.x * BH;
  const int nope = p.geom.nope_dim;
  const int32_t* idx_row = p.indices + static_cast<int64_t>(b) * p.topk;
  const int32_t topk_len = p.topk_length != nullptr ? p.topk_length[b] : -1;

  // Tiles past topk_length hold no valid token; skipping them is bit-identical (alpha = 1).
  int n_eff = p.topk;
  if constexpr (M != Mutant::kTopkLengthIgnored) {
    if (topk_len >= 0) n_eff = min(n_eff, max(topk_len, 0));
  }
  int n_tiles = (n_eff + T - 1) / T;
  if constexpr (M == Mutant::kDropPartialTile) n_tiles = min(n_tiles, p.topk / T);

  // Tokens of a tile are split over warps: warp w gathers tokens w + NW*i, i < TPW. Lane i
  // holds token i's index (loaded one tile ahead, so its latency hides behind the dequant), its
  // validity and its section offsets; the warp then copies the valid tokens one after another.
  constexpr int TPW = T / NW;
  static_assert(TPW <= 32, "one lane per token of a warp");
  auto load_idx = [&](int tile) -> int32_t {
    const int k = tile * T + warp + NW * lane;
    return (lane < TPW && k < p.topk) ? __ldg(idx_row + k) : -1;
  };
  auto stage = [&](int tile, int buf, int32_t idx) {
    const int j = warp + NW * lane;
    bool v = false;
    int64_t s0 = 0, s1 = 0;
    if (lane < TPW) {
      v = entry_valid<M>(p, idx, tile * T + j, topk_len);
      if (v) slot_offsets<M>(p, pl, idx, s0, s1);
      s_valid[buf * T + j] = v;
    }
    const unsigned vmask = __ballot_sync(0xffffffffu, v);
#pragma unroll
    for (int i = 0; i < TPW; ++i) {
      const int64_t a0 = __shfl_sync(0xffffffffu, s0, i);
      const int64_t a1 = __shfl_sync(0xffffffffu, s1, i);
      if ((vmask >> i) & 1u)
        stage_token(p, pl, a0, a1, raw + (warp + NW * i) * pl.raw_stride, lane);
    }
    cp_async_commit();
  };

  // ---- Q [BH][np + rope] bf16 into smem: nope columns, zeros for padding, rope after ----
  const int upr = pl.dkp / 8;  // 16-byte units per row
  for (int u = tid; u < BH * upr; u += NT) {
    const int r = u / upr, col = (u - r * upr) * 8, head = h0 + r;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (head < p.heads) {
      const uint16_t* qrow = p.q + static_cast<int64_t>(b) * p.q_batch_stride +
                             static_cast<int64_t>(head) * p.q_head_stride;
      int src = -1;
      if (col < nope) {
        src = col;
      } else if (col >= pl.np) {
        src = nope + col - pl.np;
      } else if constexpr (M == Mutant::kUnmaskedPadColumns) {
        if (col + 8 <= d_qk(p.geom)) src = col;  // q's rope read again as padded nope
      }
      if (src >= 0) {
        if (pl.q_vec16) {
          val = *reinterpret_cast<const uint4*>(qrow + src);
        } else {
          uint32_t w[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            w[i] = static_cast<uint32_t>(qrow[src + 2 * i]) |
                   (static_cast<uint32_t>(qrow[src + 2 * i + 1]) << 16);
          }
          val = make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
    }
    *reinterpret_cast<uint4*>(Qs + r * KS + col) = val;
  }

  int32_t next_idx = n_tiles > 0 ? load_idx(0) : -1;
  if (n_tiles > 0) stage(0, 0, next_idx);

  SoftmaxState st0, st1;  // rows g and g + 8 of this warp's head group
  float o[NTILE][4];
#pragma unroll
  for (int i = 0; i < NTILE; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

  const int g = lane >> 2, t = lane & 3;
  const int hg = warp % G, quarter = warp / G;  // S: token group; PV: column chunk

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int buf = tile & 1;
    if (tile + 1 < n_tiles) next_idx = load_idx(tile + 1);
    cp_async_wait_all();
    __syncthreads();  // B1: raw tile and s_valid[buf] ready; the previous PV is done with Ks, Ss

    // ---- dequantize the tile to bf16 Ks, once for all heads ----
    // Warp w converts rows w + NW*jj; lane l the 8-column units l, l+32, l+64 (< dkp/8).
    // Fixed trip counts: every unit is independent, so the loads of all of them are in flight.
#pragma unroll
    for (int jj = 0; jj < TPW; ++jj) {
      const int j = warp + NW * jj;
      const bool valid = s_valid[buf * T + j] != 0;
      const uint8_t* tok = raw + j * pl.raw_stride;
#pragma unroll
      for (int rr = 0; rr < (kMaxKCols / 8 + 31) / 32; ++rr) {
        const int cu = lane + 32 * rr;
        if (cu >= upr) continue;
        const int col = cu * 8;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (valid) {
          bool fp8 = col < nope;
          int tile_id = col / p.geom.scale_tile;
          if constexpr (M == Mutant::kUnmaskedPadColumns) {
            if (col < pl.np) {  // padded columns decoded from the rope bytes that follow
              fp8 = true;
              tile_id = min(tile_id, pl.tiles - 1);
            }
          }
          if (fp8) {
            const uint2 r8 = *reinterpret_cast<const uint2*>(tok + col);
            const float s = staged_scale<M>(p, pl, tok, tile_id);
            const float2 f0 = e4m3x2_to_float2(static_cast<uint16_t>(r8.x & 0xffffu));
            const float2 f1 = e4m3x2_to_float2(static_cast<uint16_t>(r8.x >> 16));
            const float2 f2 = e4m3x2_to_float2(static_cast<uint16_t>(r8.y & 0xffffu));
            const float2 f3 = e4m3x2_to_float2(static_cast<uint16_t>(r8.y >> 16));
            val.x = pack_bf16x2(f0.x * s, f0.y * s);
            val.y = pack_bf16x2(f1.x * s, f1.y * s);
            val.z = pack_bf16x2(f2.x * s, f2.y * s);
            val.w = pack_bf16x2(f3.x * s, f3.y * s);
          } else if (col >= pl.np) {
            const uint8_t* r = tok + pl.rope_off + 2 * (col - pl.np);
            if (pl.rope_vec16) {
              val = *reinterpret_cast<const uint4*>(r);
            } else {
              const uint32_t* r4 = reinterpret_cast<const uint32_t*>(r);
              val = make_uint4(r4[0], r4[1], r4[2], r4[3]);
            }
          }
        }
        *reinterpret_cast<uint4*>(Ks + j * KS + col) = val;
      }
    }
    if constexpr (M != Mutant::kMissingBarrier) __syncthreads();  // B2: Ks ready, raw free

    if (tile + 1 < n_tiles) stage(tile + 1, buf ^ 1, next_idx);

    // ---- S phase: S[16 heads][TOK tokens] per warp over all d_qk ----
    {
      // Two accumulator sets (even and odd k-steps) halve the dependent MMA chain; every token's
      // dot product is summed in the same order whatever BH and WG are (bitwise-equal configs).
      float acc[NS][4] = {}, acc_odd[NS][4] = {};
      const uint32_t qa = smem_u32(Qs + (hg * 16 + (lane & 15)) * KS + (lane >> 4) * 8);
      const int ksteps = pl.dkp / 16;
      int kk = 0;
      if constexpr (NS == 2) {
        // x4: (tokens 0-7 | 8-15) x (cols k | k+8) -> B of two n8 tiles for one k-step.
        const uint32_t ka = smem_u32(Ks + (quarter * TOK + (lane >> 4) * 8 + (lane & 7)) * KS +
                                     ((lane >> 3) & 1) * 8);
#pragma unroll 1
        for (; kk + 2 <= ksteps; kk += 2) {
          uint32_t a[4], kb[4], a2[4], kb2[4];
          ldsm_x4(a, qa + kk * 32);
          ldsm_x4(kb, ka + kk * 32);
          ldsm_x4(a2, qa + kk * 32 + 32);
          ldsm_x4(kb2, ka + kk * 32 + 32);
          mma_bf16_16816(acc[0], a, kb[0], kb[1]);
          mma_bf16_16816(acc[1], a, kb[2], kb[3]);
          mma_bf16_16816(acc_odd[0], a2, kb2[0], kb2[1]);
          mma_bf16_16816(acc_odd[1], a2, kb2[2], kb2[3]);
        }
        if (kk < ksteps) {
          uint32_t a[4], kb[4];
          ldsm_x4(a, qa + kk * 32);
          ldsm_x4(kb, ka + kk * 32);
          mma_bf16_16816(acc[0], a, kb[0], kb[1]);
          mma_bf16_16816(acc[1], a, kb[2], kb[3]);
        }
      } else {
        // x4: tokens 0-7 x (cols k | k+8 | k+16 | k+24) -> B of one n8 tile for two k-steps.
        const uint32_t ka = smem_u32(Ks + (quarter * TOK + (lane & 7)) * KS + (lane >> 3) * 8);
#pragma unroll 2
        for (; kk + 2 <= ksteps; kk += 2) {
          uint32_t a[4], kb[4], a2[4];
          ldsm_x4(a, qa + kk * 32);
          ldsm_x4(a2, qa + kk * 32 + 32);
          ldsm_x4(kb, ka + kk * 32);
          mma_bf16_16816(acc[0], a, kb[0], kb[1]);
          mma_bf16_16816(acc_odd[0], a2, kb[2], kb[3]);
        }
        if (kk < ksteps) {
          uint32_t a[4], kb[2];
          ldsm_x4(a, qa + kk * 32);
          ldsm_x2(kb, ka + kk * 32);  // lanes 0-15 address cols k and k+8
          mma_bf16_16816(acc[0], a, kb[0], kb[1]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < NS; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[nt][i] += acc_odd[nt][i];
      }
      const float ninf = neg_inf();
#pragma unroll
      for (int nt = 0; nt < NS; ++nt) {
        const int col = quarter * TOK + nt * 8 + 2 * t;
        const bool v0 = s_valid[buf * T + col] != 0, v1 = s_valid[buf * T + col + 1] != 0;
        float* srow = Ss + (hg * 16 + g) * SS + col;
        *reinterpret_cast<float2*>(srow) =
            make_float2(v0 ? acc[nt][0] * p.sm_scale : ninf, v1 ? acc[nt][1] * p.sm_scale : ninf);
        *reinterpret_cast<float2*>(srow + 8 * SS) =
            make_float2(v0 ? acc[nt][2] * p.sm_scale : ninf, v1 ? acc[nt][3] * p.sm_scale : ninf);
      }
    }
    __syncthreads();  // B3: S of the whole tile ready

    // ---- PV phase ----
    {
      const float* s0 = Ss + (hg * 16 + g) * SS + 2 * t;
      const float* s1 = s0 + 8 * SS;
      float x[4][8];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const float2 a = *reinterpret_cast<const float2*>(s0 + kk * 16);
        const float2 bq = *reinterpret_cast<const float2*>(s1 + kk * 16);
        const float2 c = *reinterpret_cast<const float2*>(s0 + kk * 16 + 8);
        const float2 d = *reinterpret_cast<const float2*>(s1 + kk * 16 + 8);
        x[kk][0] = a.x, x[kk][1] = a.y, x[kk][2] = bq.x, x[kk][3] = bq.y;
        x[kk][4] = c.x, x[kk][5] = c.y, x[kk][6] = d.x, x[kk][7] = d.y;
      }
      float mx0 = x[0][0], mx1 = x[0][2];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        mx0 = fmaxf(mx0, fmaxf(fmaxf(x[kk][0], x[kk][1]), fmaxf(x[kk][4], x[kk][5])));
        mx1 = fmaxf(mx1, fmaxf(fmaxf(x[kk][2], x[kk][3]), fmaxf(x[kk][6], x[kk][7])));
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      float alpha0, alpha1;
      if constexpr (M == Mutant::kNoRescale) {
        st0.m = fmaxf(st0.m, mx0);
        st1.m = fmaxf(st1.m, mx1);
        alpha0 = alpha1 = 1.0f;
      } else {
        alpha0 = softmax_advance(st0, mx0);
        alpha1 = softmax_advance(st1, mx1);
      }
      const float ninf = neg_inf();
      float sum0 = 0.0f, sum1 = 0.0f;
      uint32_t pa[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        float pv[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const SoftmaxState& st = (i & 2) ? st1 : st0;
          // A masked token (x = -inf) weighs exactly 0, also while m is still -inf.
          pv[i] = x[kk][i] == ninf ? 0.0f : fast_exp(x[kk][i] - st.m);
        }
        pa[kk][0] = pack_bf16x2(pv[0], pv[1]);
        pa[kk][1] = pack_bf16x2(pv[2], pv[3]);
        pa[kk][2] = pack_bf16x2(pv[4], pv[5]);
        pa[kk][3] = pack_bf16x2(pv[6], pv[7]);
        if constexpr (M == Mutant::kRowSumBf16) {
          sum0 += bf16lo(pa[kk][0]) + bf16hi(pa[kk][0]) + bf16lo(pa[kk][2]) + bf16hi(pa[kk][2]);
          sum1 += bf16lo(pa[kk][1]) + bf16hi(pa[kk][1]) + bf16lo(pa[kk][3]) + bf16hi(pa[kk][3]);
        } else {
          sum0 += pv[0] + pv[1] + pv[4] + pv[5];
          sum1 += pv[2] + pv[3] + pv[6] + pv[7];
        }
      }
      sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
      sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
      sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
      sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
      st0.l += sum0;
      st1.l += sum1;
#pragma unroll
      for (int i = 0; i < NTILE; ++i) {
        o[i][0] *= alpha0, o[i][1] *= alpha0, o[i][2] *= alpha1, o[i][3] *= alpha1;
      }
      const int c_begin = quarter * CW;
      // V[token][col] = Ks: matrices (tokens 0-7 | 8-15) x (cols c | c+8) -> B of two n8 tiles
      // (x4), or of one (x2: lanes 0-15 address tokens 0-15 at col c).
      const uint32_t va =
          smem_u32(Ks + (((lane >> 3) & 1) * 8 + (lane & 7)) * KS + c_begin + (lane >> 4) * 8);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int np2 = 0; np2 < (NTILE + 1) / 2; ++np2) {
          const int c0 = c_begin + np2 * 16;
          const uint32_t addr = va + (kk * 16 * KS + np2 * 16) * 2;
          if (2 * np2 + 1 < NTILE && c0 + 16 <= pl.wv) {
            uint32_t vb[4];
            ldsm_x4_trans(vb, addr);
            mma_bf16_16816(o[2 * np2], pa[kk], vb[0], vb[1]);
            mma_bf16_16816(o[min(2 * np2 + 1, NTILE - 1)], pa[kk], vb[2], vb[3]);
          } else if (c0 < pl.wv) {  // the chunk's odd last tile, or the last 8 columns of V
            uint32_t vb[2];
            ldsm_x2_trans(vb, addr);
            mma_bf16_16816(o[2 * np2], pa[kk], vb[0], vb[1]);
          }
        }
      }
    }
  }

  // ---- epilogue: O / (l + exp(sink - m)), bf16 store of the real columns, LSE ----
  const float* sink = M == Mutant::kSinkIgnored ? nullptr : p.sink;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int head = h0 + hg * 16 + g + 8 * r;
    if (head >= p.heads) continue;  // rows past H (H not a multiple of BH) are masked
    const SoftmaxState st = r ? st1 : st0;
    // Empty row: out = 0, never 0/0 (kEmptyRowNaN plants exactly that division).
    const bool has = softmax_has_tokens(st) || M == Mutant::kEmptyRowNaN;
    const float denom = softmax_denominator(st, sink, head);
    uint16_t* orow = p.out + static_cast<int64_t>(b) * p.out_batch_stride +
                     static_cast<int64_t>(head) * p.out_head_stride;
#pragma unroll
    for (int i = 0; i < NTILE; ++i) {
      const int col = quarter * CW + i * 8 + 2 * t;
      if (col >= pl.wv) continue;
      int d;
      if constexpr (M == Mutant::kStorePaddedColumns) {
        d = col;  // the padded layout stored as is: past d_v, over rope
      } else {
        if (col < nope) {
          d = col;
        } else if (col < pl.np) {
          continue;  // padded columns are never stored
        } else {
          d = nope + col - pl.np;
        }
      }
      const float y0 = has ? o[i][2 * r] / denom : 0.0f;
      const float y1 = has ? o[i][2 * r + 1] / denom : 0.0f;
      const uint32_t packed = pack_bf16x2(y0, y1);
      if (pl.out_vec4) {
        *reinterpret_cast<uint32_t*>(orow + d) = packed;
      } else {
        orow[d] = static_cast<uint16_t>(packed & 0xffffu);
        orow[d + 1] = static_cast<uint16_t>(packed >> 16);
      }
    }
    if (quarter == 0 && t == 0) {
      Conventions conv = p.conv;
      if constexpr (M == Mutant::kSinkInLse) conv.sink_in_lse = true;
      float lse = softmax_lse(st, p.sink, head, conv);
      if constexpr (M == Mutant::kLseLog2) lse *= 1.4426950408889634f;  // log2(e)
      p.lse[static_cast<int64_t>(b) * p.heads + head] = lse;
    }
  }
}

// Opt-in shared memory per block of the current device (0 when it cannot be queried, e.g. no
// device: the check is then left to the launch). 227 KiB on the H200; about 99 KiB on sm_120
// (RTX PRO 6000 Blackwell), where the kernel's tiles do not fit.
inline int device_smem_optin() {
  static const int bytes = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
      return 0;
    return v;
  }();
  return bytes;
}

inline std::optional<std::string> mma_unsupported_impl(const DecodeParams& p, int block_h) {
  if (block_h != 32 && block_h != 64) return "block_h must be 32 or 64";
  if (auto why = common_unsupported(p)) return why;
  if (p.heads > 65535 * block_h) return "too many head blocks";
  const int have = device_smem_optin();
  if (have > 0 && static_cast<size_t>(have) < mma_smem_bytes(block_h)) {
    return "needs " + std::to_string(mma_smem_bytes(block_h)) +
           " bytes of shared memory per block, the device allows " + std::to_string(have);
  }
  return std::nullopt;
}

template <int BH, Mutant M, int WG = mma_default_wg(BH)>
int launch_mma_head_tiled_t(const DecodeParams& p, void* stream) {
  if (mma_unsupported_impl(p, BH)) return kErrUnsupported;
  const LayoutPlan pl = make_plan(p);
  constexpr size_t smem = mma_smem_bytes(BH);
  static std::atomic<bool> attr_set{false};
  if (!attr_set.load()) {
    const cudaError_t e = cudaFuncSetAttribute(
        mma_head_tiled_kernel<BH, WG, M>, cudaFuncAttributeMaxDynamicSharedMemorySize, int{smem});
    if (e != cudaSuccess) return static_cast<int>(e);
    attr_set.store(true);
  }
  const dim3 grid((p.heads + BH - 1) / BH, p.batch);
  mma_head_tiled_kernel<BH, WG, M>
      <<<grid, BH / 16 * WG * 32, smem, static_cast<cudaStream_t>(stream)>>>(p, pl);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace mla::cuda
