// The tensor-core head-tiled kernel (the "new" kernel, docs/SPEC.md section 4, MMA pipeline).
//
// One thread block per (batch row, query token, block of BH heads) (grid x: head blocks of the
// token-major (token, head block) pairs; grid y: batch rows); 4*BH/16 warps (8 for BH = 32, 16
// for BH = 64; 8*BH/16 is selectable, same bits). H up to any size: ceil(H / BH) head blocks per
// query token, rows past H masked (H = 128: four blocks of 32 or two of 64, per the launcher's
// BH). Warp w works for head group hg = w % G
// (16 heads: the MMA M dimension) and position q = w / G inside it.
// Tiles: one loop over a virtual tile range [0, n_main + n_extra): the main list's tiles of the
// token, then its extra list's (docs/SPEC.md section 8), through ONE online softmax. The extra list
// starts a tile of its own (its entry 0 is the first token of tile n_main), as cpu-mma's
// fold_list does; tile_list() maps a virtual tile to its list (cache, indices, paging) and first
// entry. Per tile of kMmaTokenTile = 64 selected tokens:
//   B1  raw bytes of the tile (gathered with cp.async during the previous tile) are ready and
//       the previous tile's P*V is done with Ks (removed by Mutant::kMissingBarrier)
//   dequant: every thread turns raw bytes into the bf16 K tile Ks[64][576+8] once for all heads
//            (fp8 * scale exact in fp32, cvt to bf16 exact); masked tokens and padded columns
//            are written as zeros and their bytes are never loaded. What a lane does with its
//            8-column units (fp8, rope copy or zeros, and where its scale sits) is worked out
//            once per launch, not per tile.
//   B2  Ks ready for every warp
//   gather: the next tile's raw bytes are requested (cp.async), overlapping the MMAs below
//   S:  warp (hg, q) computes S = Q K^T for its 16 heads and tokens [TOK*q, +TOK) with mma.sync
//       m16n8k16 bf16 (ldmatrix fragments), scales by sm_scale in fp32 AFTER the product (-inf
//       for masked tokens), and publishes its per-row partial maxima. With 64-token tiles the
//       warps q = 2c, 2c + 1 work as a pair over tokens [2 TOK c, +2 TOK): one folds the even
//       k-steps, the other the odd ones, and they swap half of their partial logits through
//       shared memory (fewer Q fragment loads: the phase is bound by shared-memory bandwidth).
//       Either way a logit is (even k-steps' chain) + (odd k-steps' chain): the same bits.
//   B3  (the head group's warps only: named barrier 1 + hg)
//   softmax, once per logit: the tile max from the partial maxima, softmax_advance, p =
//       exp(x - m) in fp32 from the S accumulators still in registers, bf16(p) to Ps for P*V and
//       the row sums of the unrounded p per 8-token chunk (quad shuffles) to smem.
//   B4  (head group)
//   PV: l += the 8 chunk sums in chunk order; O *= alpha; warp (hg, q) owns V columns
//       [CW*q, +CW) (fp32 accumulators in registers): P (ldmatrix from Ps) times V = Ks
//       (ldmatrix.trans).
// Finally O * (1 / (l + exp(sink - m))) rounded to bf16; padded columns are never stored.
// Every sum is taken in an order that does not depend on BH or WG: the configurations give the
// same bits, and the host model cpu-mma follows the same order (kernels/host/cpu_mma.h).
//
// Split-KV (kSplit; mla/split_kv.h, kernels/cuda/combine.cuh): the grid
// gains a z dimension of splits; block (hb, b, z) folds tiles [tile_begin, tile_end) of split z
// of row b (the split count from the row's own tile count and the device's SM count, worked out
// here and again in the combine by the same function), and instead of the bf16 epilogue writes
// its fp32 partial (m, l, O over the V columns of the padded layout) to the workspace; blocks
// whose z is past the row's split count return at once. kSplit = false compiles the unsplit
// kernel (tile range [0, n_tiles), the bf16 epilogue).
//
// Shared memory (dynamic): raw staging 64*656, Ks 64*584*2, Qs BH*584*2, Ps BH*72*2, partial
// maxima BH*WG*4, chunk sums BH*8*4, validity 2*64*4, the S pairs' exchange (warps)*TOK/8*512:
// 165 KiB for BH = 32 (8 warps), 215.5 KiB for BH = 64 (16 warps). Rows of Ks and Qs are padded
// by 16 bytes (584 bf16 = 73 16-byte units, odd) and rows of Ps by 16 bytes (9 units) so that
// ldmatrix rows hit distinct bank groups.
#pragma once

#include <atomic>
#include <type_traits>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch.h"
#include "mla/split_kv.h"

namespace mla::cuda {

inline constexpr int kMmaKStride = kMaxKCols + 8;  // bf16 elements per Ks/Qs row
// bf16 elements per Ps row of a T-token tile (72 for 64, 40 for 32: an odd number of 16-byte
// units either way).
__host__ __device__ constexpr int mma_p_stride(int t) { return t + 8; }
// 8-token chunks of a T-token tile (the row sums).
__host__ __device__ constexpr int mma_chunks(int t) { return t / 8; }

// Warps per head group: 4 (8 warps for BH = 32, 16 for BH = 64). With the S phase's warp pairs,
// 8 warps for BH = 32 are faster than 16 (H200, same call: 47.5 against 50.0 us at B=1
// topk=512, 96.8 against 101.6 at B=128). The configurations give the same bits.
constexpr int mma_default_wg(int /*bh*/) { return 4; }

// Whether the S phase runs as warp pairs (64-token tiles): each warp of a pair folds one parity
// of the k-steps for the pair's 2 TOK tokens, and the pair swaps NS = TOK / 8 n8 tiles of
// partial logits through shared memory (NS * 128 floats per warp). See the S phase. Not for the
// 32-token tiles: the sm_120 configuration has no shared memory to spare.
__host__ __device__ constexpr bool mma_pair_s(int wg, int t) { return t == 64 && wg >= 2; }
__host__ __device__ constexpr int mma_pair_floats(int wg, int t) {
  return mma_pair_s(wg, t) ? t / wg / 8 * 128 : 0;  // per warp
}
// Dynamic shared memory of the (BH, WG, T) configuration (the kernel has no static shared
// memory): raw staging T*656, Ks T*584*2, Qs BH*584*2, Ps BH*(T+8)*2, partial maxima BH*WG*4,
// chunk sums BH*(T/8)*4, validity 2*T*4, the S pairs' exchange (warps)*mma_pair_floats*4.
constexpr size_t mma_smem_bytes(int bh, int wg, int t = kMmaTokenTile) {
  return static_cast<size_t>(t) * kMaxRawStride + static_cast<size_t>(t) * kMmaKStride * 2 +
         static_cast<size_t>(bh) * kMmaKStride * 2 + static_cast<size_t>(bh) * mma_p_stride(t) * 2 +
         static_cast<size_t>(bh) * wg * 4 + static_cast<size_t>(bh) * mma_chunks(t) * 4 +
         static_cast<size_t>(2) * t * 4 +
         static_cast<size_t>(bh) / 16 * wg * mma_pair_floats(wg, t) * 4;
}
constexpr size_t mma_smem_bytes(int bh) { return mma_smem_bytes(bh, mma_default_wg(bh)); }
static_assert(mma_smem_bytes(32) == 168960 && mma_smem_bytes(64) == 220672,
              "the sizes in the header comment");

// The sm_120-sized configuration (`cuda-mma-small`): BLOCK_H 32, 4 warps per head
// group (8 warps, 256 threads) and 32-token tiles (mla::kMmaSmallTokenTile). Its shared memory:
//   raw 32*656 = 20992, Ks 32*584*2 = 37376, Qs 32*584*2 = 37376, Ps 32*40*2 = 2560,
//   partial maxima 32*4*4 = 512, chunk sums 32*4*4 = 512, validity 2*32*4 = 256:
//   99584 bytes (97.25 KiB), under sm_120's opt-in limit of 101376 bytes per block (99 KiB) with
//   1792 bytes to spare (the kernel has no static shared memory). What does not fit: a 64-token
//   tile at any BLOCK_H (raw + Ks alone are 116736 bytes); BLOCK_H 64 with 32-token tiles
//   (136960 bytes). BLOCK_H 16 with 32-token tiles would take 79104 bytes, but decodes every K
//   tile for 16 heads instead of 32 (twice the dequantization per head). On the H200 (233472
//   bytes per SM) two blocks of this configuration share an SM: 16 warps, as the default has.
inline constexpr int kMmaSmallBlockH = mla::kMmaSmallBlockH;
inline constexpr int kMmaSmallWarps = 4;  // per head group
inline constexpr int kMmaSmallTile = mla::kMmaSmallTokenTile;
inline constexpr size_t kMmaSmallSmemBytes =
    mma_smem_bytes(kMmaSmallBlockH, kMmaSmallWarps, kMmaSmallTile);
inline constexpr size_t kSm120SmemOptin = 101376;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
static_assert(kMmaSmallSmemBytes == 99584, "the arithmetic in the comment above");
static_assert(kMmaSmallSmemBytes <= kSm120SmemOptin, "the small configuration must fit sm_120");

// Where the split kernel writes its partials and how it splits (unused when kSplit = false).
// Partial (query row r = b * s_q + token, split i, head slot h) of ns_max splits and hpad = head
// blocks * BH head slots: index e = (r * ns_max + i) * hpad + h; O at ws_o[e * ostride + col] for
// the padded-layout V columns col < LayoutPlan::wv, m and l at ws_ml[2 * e], ws_ml[2 * e + 1].
struct SplitArgs {
  float* ws_o = nullptr;
  float* ws_ml = nullptr;
  int32_t setting = 0;   // mla::kSplitAuto, kSplitMax or n > 0 (split_kv.h)
  int32_t sm_count = 0;  // the device's, for the automatic rule
  int32_t ns_max = 1;    // the grid's z extent: the split count of a row with topk valid entries
  int32_t hpad = 0;
  int32_t ostride = 0;
};

// What one lane does with one 8-column unit of every K row it dequantizes (padded columns are
// zeroed once per launch and then skipped, as are units past the row).
enum class UnitKind : int { kSkip, kFp8, kRope };

// Barrier over the WG warps of one head group (ids 1..G; 0 is __syncthreads).
__device__ __forceinline__ void group_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// EX: the call has an extra cache (a template flag, so that the one-cache kernel compiles without
// any extra-cache code). kSplit: the split-KV kernel (see the header).
// T: tokens per tile (kMmaTokenTile = 64, or kMmaSmallTile = 32 for the sm_120-sized
// configuration; the online-softmax tile boundaries follow it, and so does the host model).
// Launch bounds: one block per SM for 64-token tiles (their shared memory); two for the small
// configuration (T = 32: 256 threads at <= 128 registers, so that two blocks share an H200 SM).
template <int BH, int WG, Mutant M, bool EX, bool kSplit = false, int T = kMmaTokenTile>
__global__ void __launch_bounds__(BH / 16 * WG * 32, T == kMmaTokenTile ? 1 : 2)
    mma_head_tiled_kernel(const __grid_constant__ DecodeParams p,
                          const __grid_constant__ LayoutPlan pl,
                          const __grid_constant__ SplitArgs sa) {
  constexpr int G = BH / 16;  // head groups of 16 rows (the MMA M dimension)
  constexpr int NW = G * WG;  // warps
  constexpr int NT = NW * 32;
  constexpr int KS = kMmaKStride;
  constexpr int PS = mma_p_stride(T);
  constexpr int CH = mma_chunks(T);   // 8-token chunks of a tile (8 or 4)
  constexpr int TOK = T / WG;         // S phase: tokens per warp (16 or 8; 8 for T = 32)
  constexpr int NS = TOK / 8;         // S phase: n8 tiles (8-token chunks) per warp (2 or 1)
  constexpr int CW = kMaxKCols / WG;  // PV phase: V columns per warp (144 or 72)
  constexpr int NTILE = CW / 8;       // PV phase: n8 tiles of O per warp (18 or 9)
  constexpr int NU = (kMaxKCols / 8 + 31) / 32;  // dequant: 8-column units per lane and row
  static_assert(WG == 4 || WG == 8, "4 or 8 warps per head group");
  static_assert(CW * WG == kMaxKCols && CW % 8 == 0, "column chunks must tile the V width");
  static_assert(T == 64 || T == 32, "64- or 32-token tiles");
  // The combine counts a row's tiles in 64-token tiles (combine.cuh, split_row_tiles).
  static_assert(!kSplit || T == kMmaTokenTile, "split-KV runs 64-token tiles only");
  static_assert(NS * WG == CH, "S-phase chunks must tile the token tile");
  static_assert(CH % 4 == 0, "the chunk sums are read as float4");
  static_assert(!mma_pair_s(WG, T) || (WG % 2 == 0 && G + NW / 2 <= 15),
                "the S phase's warp pairs need named barriers G + 1 .. G + NW / 2 (at most 15)");

  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* raw = smem;                                                   // [T][raw_stride]
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem + T * kMaxRawStride);  // [T][KS] bf16
  uint16_t* Qs = Ks + T * KS;                                            // [BH][KS] bf16
  uint16_t* Ps = Qs + BH * KS;                                           // [BH][PS] bf16
  float* s_pmax = reinterpret_cast<float*>(Ps + BH * PS);                // [BH][WG]
  float* s_psum = s_pmax + BH * WG;                                      // [BH][CH]
  int* s_valid = reinterpret_cast<int*>(s_psum + BH * CH);               // [2][T]
  // Both S paths give the same bits, so the choice is per instantiation: the split kernel of
  // BLOCK_H 64 with the extra cache keeps the one-warp path (ptxas spills 20 bytes with pairs).
  constexpr bool kPairS = mma_pair_s(WG, T) && !(kSplit && EX && T / WG == 16);
  float* s_xch = reinterpret_cast<float*>(s_valid + 2 * T);  // [NW][NS * 128] (kPairS)

#ifndef NDEBUG
  if (blockDim.x != NT) __trap();
#endif
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int b = blockIdx.y;
  const int n_hblocks = (p.heads + BH - 1) / BH;
  const int qt = static_cast<int>(blockIdx.x) / n_hblocks;  // query token of the row
  const int h0 = (static_cast<int>(blockIdx.x) - qt * n_hblocks) * BH;
  const int nope = p.geom.nope_dim;
  // topk_length (and extra_topk_length) are per batch row, shared by its s_q tokens.
  const int32_t topk_len = p.topk_length != nullptr ? p.topk_length[b] : -1;
  const bool model1 = p.geom.layout == Layout::kModel1;

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
  // The tiles this block folds: the whole virtual range, or split blockIdx.z's (split_kv.h: the
  // row's split count depends on its own tile count and the SM count only). A block past the
  // row's split count has nothing to do: the whole block leaves before any barrier.
  int tile_begin = 0, tile_end = n_tiles;
  if constexpr (kSplit) {
    const int ns = split_count(n_tiles, sa.setting, sa.sm_count);
    const int z = static_cast<int>(blockIdx.z);
    if (z >= ns) return;
    tile_begin = split_tile_begin(n_tiles, ns, z);
    tile_end = split_tile_begin(n_tiles, ns, z + 1);
  }

  // Tokens of a tile are split over warps: warp w gathers tokens w + NW*i, i < TPW, all at once:
  // lanes [LPT*i, +LPT) copy token i. Each of them loads the token's index (one tile ahead, so
  // its latency hides behind the dequant) and works out its validity and section offsets.
  constexpr int TPW = T / NW;
  constexpr int LPT = 32 / TPW;  // lanes per gathered token
  static_assert(TPW * LPT == 32, "a warp's tokens must split its lanes evenly");
  const int tok_i = lane / LPT, tok_sub = lane % LPT;
  auto load_idx = [&](int tile) -> int32_t {
    int k0;
    const ListView L = tile_list(tile, k0);
    const int k = k0 + warp + NW * tok_i;
    return k < L.topk ? __ldg(L.idx + k) : -1;
  };
  auto stage = [&](int tile, int buf, int32_t idx) {
    int k0;
    const ListView L = tile_list(tile, k0);
    const int j = warp + NW * tok_i;
    const bool v = entry_valid<M>(p, L, idx, k0 + j);
    if (tok_sub == 0) s_valid[buf * T + j] = v;
    if (v) {
      int64_t s0 = 0, s1 = 0;
      slot_offsets<M>(L, pl, idx, s0, s1);
      stage_token(L, pl, s0, s1, raw + j * pl.raw_stride, tok_sub, LPT);
    }
    cp_async_commit();
  };

  // The first tile's indices are requested before anything else: the chain index -> token bytes
  // is the longest latency of a block that folds one tile (a split), and Q's copies below
  // overlap it instead of preceding it.
  int32_t next_idx = tile_begin < tile_end ? load_idx(tile_begin) : -1;

  // ---- Q [BH][np + rope] bf16 into smem: nope columns, zeros for padding, rope after ----
  // Aligned rows (q_vec16) travel by cp.async, in flight together with the first tile's gather
  // (the loop's first wait covers both); others by 2-byte loads.
  const int upr = pl.dkp / 8;  // 16-byte units per row
  for (int u = tid; u < BH * upr; u += NT) {
    const int r = u / upr, col = (u - r * upr) * 8, head = h0 + r;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (head < p.heads) {
      const uint16_t* qrow = p.q + static_cast<int64_t>(b) * p.q_batch_stride +
                             static_cast<int64_t>(qt) * p.q_token_stride +
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
          cp_async16(smem_u32(Qs + r * KS + col), qrow + src);
          continue;
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
  // K columns [dkp, 576) are never written by the dequantization: zeros, so that P*V can run
  // over every column chunk unconditionally (those O columns are never stored).
  for (int u = tid; u < T * (kMaxKCols / 8 - upr); u += NT) {
    const int r = u / (kMaxKCols / 8 - upr), cu = upr + u % (kMaxKCols / 8 - upr);
    *reinterpret_cast<uint4*>(Ks + r * KS + cu * 8) = make_uint4(0, 0, 0, 0);
  }

  // ---- per-lane dequantization plan: unit cu = lane + 32*rr of every K row ----
  // One word per unit (a register each): bits 0-11 the byte offset of its data in a staged
  // token, 12-23 that of its scale (fp8 units), 24-25 its UnitKind.
  uint32_t plan[NU];
#pragma unroll
  for (int rr = 0; rr < NU; ++rr) {
    const int cu = lane + 32 * rr, col = cu * 8;
    UnitKind kind = UnitKind::kSkip;
    int src = 0, scale = 0;
    if (cu < upr) {
      int tile_id = col / p.geom.scale_tile;
      bool fp8 = col < nope;
      if constexpr (M == Mutant::kUnmaskedPadColumns) {
        if (col < pl.np) {  // padded columns decoded from the rope bytes that follow
          fp8 = true;
          tile_id = min(tile_id, pl.tiles - 1);
        }
      }
      if (fp8) {
        kind = UnitKind::kFp8;
        src = col;
        scale = staged_scale_offset<M>(p, pl, tile_id);
      } else if (col >= pl.np) {
        kind = UnitKind::kRope;
        src = pl.rope_off + 2 * (col - pl.np);
      } else {
        // A padded column [nope, np): zeros in every row this warp converts, written once here
        // (nothing else writes them), then skipped by every tile's dequantization.
#pragma unroll
        for (int jj = 0; jj < TPW; ++jj) {
          *reinterpret_cast<uint4*>(Ks + (warp + NW * jj) * KS + col) = make_uint4(0, 0, 0, 0);
        }
      }
    }
    static_assert(kMaxRawStride <= 4096, "staged offsets must fit 12 bits");
    plan[rr] = static_cast<uint32_t>(src) | (static_cast<uint32_t>(scale) << 12) |
               (static_cast<uint32_t>(kind) << 24);
  }

  // Tile t stages into buffer t & 1 (s_valid), whatever the range starts at.
  if (tile_begin < tile_end) stage(tile_begin, tile_begin & 1, next_idx);

  SoftmaxState st0, st1;  // rows g and g + 8 of this warp's head group
  float o[NTILE][4];
#pragma unroll
  for (int i = 0; i < NTILE; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

  const int g = lane >> 2, t = lane & 3;
  const int hg = warp % G, quarter = warp / G;  // S: token group; PV: column chunk
  const int row0 = hg * 16 + g, row1 = row0 + 8;

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int buf = tile & 1;
    if (tile + 1 < tile_end) next_idx = load_idx(tile + 1);
    cp_async_wait_all();
    // B1: the previous tile's P*V is done with Ks (kMissingBarrier drops it: warps that finish
    // P*V early overwrite K rows that slower warps still read as V). Each warp dequantizes the
    // rows it gathered itself, so its own cp.async wait covers the raw bytes.
    if constexpr (M != Mutant::kMissingBarrier) __syncthreads();

    // ---- dequantize the tile to bf16 Ks, once for all heads ----
    // Warp w converts rows w + NW*jj. The branches on a unit's kind and on the layout enclose
    // the token loop (a lane's units are the same in every row); a masked token's row is
    // converted from whatever its staging row holds and replaced by zeros (a select), so its
    // bytes never matter. Fixed trip counts: the loads of every row are in flight together.
    {
      bool row_valid[TPW];
#pragma unroll
      for (int jj = 0; jj < TPW; ++jj) row_valid[jj] = s_valid[buf * T + warp + NW * jj] != 0;
      auto dequant = [&](auto model1_tag) {
        constexpr bool kModel1 = decltype(model1_tag)::value;
#pragma unroll
        for (int rr = 0; rr < NU; ++rr) {
          const UnitKind kind = static_cast<UnitKind>(plan[rr] >> 24);
          const int src = plan[rr] & 0xfffu, sc = (plan[rr] >> 12) & 0xfffu;
          uint16_t* kcol = Ks + warp * KS + (lane + 32 * rr) * 8;
          if (kind == UnitKind::kFp8) {
            // Every row's bytes and scale are loaded before any is converted (the scale decode
            // has no branch), so that the TPW rows' shared-memory loads are in flight together.
            uint2 r8s[TPW];
            float ss[TPW];
#pragma unroll
            for (int jj = 0; jj < TPW; ++jj) {
              const uint8_t* tok = raw + (warp + NW * jj) * pl.raw_stride;
              r8s[jj] = *reinterpret_cast<const uint2*>(tok + src);
              if constexpr (kModel1) {
                ss[jj] = ue8m0_to_float(tok[sc]);
              } else {
                ss[jj] = *reinterpret_cast<const float*>(tok + sc);
              }
            }
#pragma unroll
            for (int jj = 0; jj < TPW; ++jj) {
              const uint2 r8 = r8s[jj];
              const float s = ss[jj];
              const float2 f0 = e4m3x2_to_float2(static_cast<uint16_t>(r8.x & 0xffffu));
              const float2 f1 = e4m3x2_to_float2(static_cast<uint16_t>(r8.x >> 16));
              const float2 f2 = e4m3x2_to_float2(static_cast<uint16_t>(r8.y & 0xffffu));
              const float2 f3 = e4m3x2_to_float2(static_cast<uint16_t>(r8.y >> 16));
              uint4 val;
              val.x = pack_bf16x2(f0.x * s, f0.y * s);
              val.y = pack_bf16x2(f1.x * s, f1.y * s);
              val.z = pack_bf16x2(f2.x * s, f2.y * s);
              val.w = pack_bf16x2(f3.x * s, f3.y * s);
              if (!row_valid[jj]) val = make_uint4(0, 0, 0, 0);
              *reinterpret_cast<uint4*>(kcol + NW * jj * KS) = val;
            }
          } else if (kind == UnitKind::kRope) {
#pragma unroll
            for (int jj = 0; jj < TPW; ++jj) {
              const uint8_t* r = raw + (warp + NW * jj) * pl.raw_stride + src;
              uint4 val;
              if (pl.rope_vec16) {
                val = *reinterpret_cast<const uint4*>(r);
              } else {
                const uint32_t* r4 = reinterpret_cast<const uint32_t*>(r);
                val = make_uint4(r4[0], r4[1], r4[2], r4[3]);
              }
              if (!row_valid[jj]) val = make_uint4(0, 0, 0, 0);
              *reinterpret_cast<uint4*>(kcol + NW * jj * KS) = val;
            }
          }
        }
      };
      if (model1) {
        dequant(std::true_type{});
      } else {
        dequant(std::false_type{});
      }
    }
    __syncthreads();  // B2: Ks ready, raw free

    if (tile + 1 < tile_end) stage(tile + 1, buf ^ 1, next_idx);

    // ---- S phase: S[16 heads][TOK tokens] per warp over all d_qk ----
    float xs[NS][4];  // logits: [0], [1] row g, tokens c, c + 1; [2], [3] row g + 8
    {
      // Two accumulator sets (even and odd k-steps) halve the dependent MMA chain; every token's
      // dot product is summed in the same order whatever BH and WG are (bitwise-equal configs).
      float acc[NS][4] = {}, acc_odd[NS][4] = {};
      const uint32_t qa = smem_u32(Qs + (hg * 16 + (lane & 15)) * KS + (lane >> 4) * 8);
      const int ksteps = pl.dkp / 16;
      int kk = 0;
      if constexpr (kPairS) {
        // Warp pairs (quarter 2c, 2c + 1) cover tokens [2 TOK c, +2 TOK): the even warp folds
        // the even k-steps, the odd warp the odd ones, each for all 2 NS n8 tiles of the pair
        // (one A load per k-step for 2 TOK tokens: 512 shared-memory bytes per MMA instead of
        // 768 for NS = 1, 384 instead of 512 for NS = 2; the phase is bound by shared-memory
        // bandwidth). Then each warp hands the partner the NS tiles the partner keeps: warp
        // 2c + par keeps tokens [2 TOK c + TOK par, +TOK) = [TOK quarter, +TOK), as the one-warp
        // paths below. The two chains it adds (even k-steps ascending, odd k-steps ascending)
        // are those paths' acc and acc_odd (here acc holds the warp's own chain and acc_odd the
        // partner's; the sum commutes): the same bits.
        constexpr int PT = 2 * NS;
        const int par = quarter & 1, pair = quarter >> 1;
        float pacc[PT][4] = {};
        const uint32_t ka = smem_u32(Ks + (pair * 2 * TOK + (lane >> 4) * 8 + (lane & 7)) * KS +
                                     ((lane >> 3) & 1) * 8);
        // Unrolled twice for 16 tokens per warp; not for 32 (BLOCK_H 64 with the extra cache
        // would spill).
#pragma unroll(NS == 1 ? 2 : 1)
        for (int k = par; k < ksteps; k += 2) {
          uint32_t a[4];
          ldsm_x4(a, qa + k * 32);
#pragma unroll
          for (int j = 0; j < NS; ++j) {  // x4: tokens (16 j + 0-7 | 8-15) x (cols k | k+8)
            uint32_t kb[4];
            ldsm_x4(kb, ka + j * 16 * KS * 2 + k * 32);
            mma_bf16_16816(pacc[2 * j], a, kb[0], kb[1]);
            mma_bf16_16816(pacc[2 * j + 1], a, kb[2], kb[3]);
          }
        }
        float4* mine = reinterpret_cast<float4*>(s_xch + warp * NS * 128) + lane;
        const float4* theirs =
            reinterpret_cast<const float4*>(s_xch + (hg + G * (quarter ^ 1)) * NS * 128) + lane;
#pragma unroll
        for (int j = 0; j < NS; ++j) {
          float give[4];  // element selects: no pointer into the register array
#pragma unroll
          for (int i = 0; i < 4; ++i) give[i] = par ? pacc[j][i] : pacc[NS + j][i];
          mine[32 * j] = make_float4(give[0], give[1], give[2], give[3]);
        }
        group_barrier(1 + G + hg + G * pair, 64);  // the pair's two warps (ids G + 1 .. G + NW / 2)
#pragma unroll
        for (int j = 0; j < NS; ++j) {
          const float4 r = theirs[32 * j];
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[j][i] = par ? pacc[NS + j][i] : pacc[j][i];
          acc_odd[j][0] = r.x, acc_odd[j][1] = r.y, acc_odd[j][2] = r.z, acc_odd[j][3] = r.w;
        }
      } else if constexpr (NS == 2) {
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
      const float ninf = neg_inf();
      float pm0 = ninf, pm1 = ninf;
#pragma unroll
      for (int nt = 0; nt < NS; ++nt) {
        const int col = quarter * TOK + nt * 8 + 2 * t;
        const bool v0 = s_valid[buf * T + col] != 0, v1 = s_valid[buf * T + col + 1] != 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          // Explicit rounding (mul.rn): ptxas would otherwise be free to fuse this product
          // with the "x - m" below into one FMA, in one configuration and not another.
          const float s = __fmul_rn(acc[nt][i] + acc_odd[nt][i], p.sm_scale);
          xs[nt][i] = ((i & 1) ? v1 : v0) ? s : ninf;
        }
        pm0 = fmaxf(pm0, fmaxf(xs[nt][0], xs[nt][1]));
        pm1 = fmaxf(pm1, fmaxf(xs[nt][2], xs[nt][3]));
      }
      pm0 = fmaxf(pm0, __shfl_xor_sync(0xffffffffu, pm0, 1));
      pm0 = fmaxf(pm0, __shfl_xor_sync(0xffffffffu, pm0, 2));
      pm1 = fmaxf(pm1, __shfl_xor_sync(0xffffffffu, pm1, 1));
      pm1 = fmaxf(pm1, __shfl_xor_sync(0xffffffffu, pm1, 2));
      if (t == 0) {
        s_pmax[row0 * WG + quarter] = pm0;
        s_pmax[row1 * WG + quarter] = pm1;
      }
    }
    group_barrier(1 + hg, WG * 32);  // B3: the head group's partial maxima

    // ---- softmax, once per logit ----
    float alpha0, alpha1;
    {
      float mx0 = s_pmax[row0 * WG], mx1 = s_pmax[row1 * WG];
#pragma unroll
      for (int w = 1; w < WG; ++w) {
        mx0 = fmaxf(mx0, s_pmax[row0 * WG + w]);
        mx1 = fmaxf(mx1, s_pmax[row1 * WG + w]);
      }
      if constexpr (M == Mutant::kNoRescale) {
        st0.m = fmaxf(st0.m, mx0);
        st1.m = fmaxf(st1.m, mx1);
        alpha0 = alpha1 = 1.0f;
      } else {
        alpha0 = softmax_advance(st0, mx0);
        alpha1 = softmax_advance(st1, mx1);
      }
      const float ninf = neg_inf();
#pragma unroll
      for (int nt = 0; nt < NS; ++nt) {
        float pv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const SoftmaxState& st = (i & 2) ? st1 : st0;
          // A masked token (x = -inf) weighs exactly 0, also while m is still -inf.
          pv[i] = xs[nt][i] == ninf ? 0.0f : fast_exp(xs[nt][i] - st.m);
        }
        const uint32_t pr0 = pack_bf16x2(pv[0], pv[1]), pr1 = pack_bf16x2(pv[2], pv[3]);
        const int col = quarter * TOK + nt * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(Ps + row0 * PS + col) = pr0;
        *reinterpret_cast<uint32_t*>(Ps + row1 * PS + col) = pr1;
        // Row sum of the chunk's 8 tokens: (p0 + p1) per quad lane, then xor-1, xor-2.
        float c0, c1;
        if constexpr (M == Mutant::kRowSumBf16) {
          c0 = bf16lo(pr0) + bf16hi(pr0);
          c1 = bf16lo(pr1) + bf16hi(pr1);
        } else {
          c0 = pv[0] + pv[1];
          c1 = pv[2] + pv[3];
        }
        c0 += __shfl_xor_sync(0xffffffffu, c0, 1);
        c0 += __shfl_xor_sync(0xffffffffu, c0, 2);
        c1 += __shfl_xor_sync(0xffffffffu, c1, 1);
        c1 += __shfl_xor_sync(0xffffffffu, c1, 2);
        if (t == 0) {
          s_psum[row0 * CH + quarter * NS + nt] = c0;
          s_psum[row1 * CH + quarter * NS + nt] = c1;
        }
      }
    }
    group_barrier(1 + hg, WG * 32);  // B4: the head group's P and chunk sums

    // ---- PV phase ----
    {
      // l += the tile's row sum: its CH chunk sums added in chunk order
      // (((c0 + c1) + c2) + c3) + ..., read four at a time.
      const float4* c0 = reinterpret_cast<const float4*>(s_psum + row0 * CH);
      const float4* c1 = reinterpret_cast<const float4*>(s_psum + row1 * CH);
      float sum0, sum1;
      {
        const float4 a0 = c0[0], a1 = c1[0];
        sum0 = ((a0.x + a0.y) + a0.z) + a0.w;
        sum1 = ((a1.x + a1.y) + a1.z) + a1.w;
      }
#pragma unroll
      for (int i = 1; i < CH / 4; ++i) {
        const float4 a0 = c0[i], a1 = c1[i];
        sum0 = (((sum0 + a0.x) + a0.y) + a0.z) + a0.w;
        sum1 = (((sum1 + a1.x) + a1.y) + a1.z) + a1.w;
      }
      // add.rn: never fused with softmax_advance's l *= alpha (the host model does not fuse).
      st0.l = __fadd_rn(st0.l, sum0);
      st1.l = __fadd_rn(st1.l, sum1);
#pragma unroll
      for (int i = 0; i < NTILE; ++i) {
        o[i][0] *= alpha0, o[i][1] *= alpha0, o[i][2] *= alpha1, o[i][3] *= alpha1;
      }
      const int c_begin = quarter * CW;
      if (c_begin < pl.wv) {  // warp-uniform: chunks past V's width have nothing to add
        // P[16 heads][16 tokens of k-step kk] from Ps, as for Q.
        const uint32_t pa_addr = smem_u32(Ps + (hg * 16 + (lane & 15)) * PS + (lane >> 4) * 8);
        // V[token][col] = Ks: matrices (tokens 0-7 | 8-15) x (cols c | c+8) -> B of two n8
        // tiles (x4), or of one (x2: lanes 0-15 address tokens 0-15 at col c).
        const uint32_t va =
            smem_u32(Ks + (((lane >> 3) & 1) * 8 + (lane & 7)) * KS + c_begin + (lane >> 4) * 8);
#pragma unroll
        for (int kk = 0; kk < T / 16; ++kk) {
          uint32_t pa[4];
          ldsm_x4(pa, pa_addr + kk * 32);
#pragma unroll
          for (int np2 = 0; np2 < NTILE / 2; ++np2) {
            uint32_t vb[4];
            ldsm_x4_trans(vb, va + (kk * 16 * KS + np2 * 16) * 2);
            mma_bf16_16816(o[2 * np2], pa, vb[0], vb[1]);
            mma_bf16_16816(o[2 * np2 + 1], pa, vb[2], vb[3]);
          }
          if constexpr (NTILE % 2 == 1) {  // the chunk's odd last n8 tile
            uint32_t vb[2];
            ldsm_x2_trans(vb, va + (kk * 16 * KS + (NTILE - 1) * 8) * 2);
            mma_bf16_16816(o[NTILE - 1], pa, vb[0], vb[1]);
          }
        }
      }
    }
  }
  cp_async_wait_all();  // nothing left in flight at exit (a row without tiles never waited for Q)

  if constexpr (kSplit) {
    // ---- split epilogue: the fp32 partial (m, l, O) of this split, merged by the combine ----
    // Query row (b, qt) = b * s_q + qt; its split blockIdx.z; head slot = the head.
    const int64_t e0 = ((static_cast<int64_t>(b) * p.s_q + qt) * sa.ns_max + blockIdx.z) * sa.hpad;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int slot = h0 + hg * 16 + g + 8 * r;
      if (slot >= p.heads) continue;
      const SoftmaxState st = r ? st1 : st0;
      float* orow = sa.ws_o + (e0 + slot) * sa.ostride;
#pragma unroll
      for (int i = 0; i < NTILE; ++i) {
        const int col = quarter * CW + i * 8 + 2 * t;
        if (col >= pl.wv) continue;
        *reinterpret_cast<float2*>(orow + col) = make_float2(o[i][2 * r], o[i][2 * r + 1]);
      }
      if (quarter == 0 && t == 0) {
        sa.ws_ml[2 * (e0 + slot)] = st.m;
        sa.ws_ml[2 * (e0 + slot) + 1] = split_partial_l<M>(st, p.sink, slot);
      }
    }
    return;
  }

  // ---- epilogue: O * 1 / (l + exp(sink - m)), bf16 store of the real columns, LSE ----
  // The bf16 rows are staged in shared memory (the K tile's space, free once every warp is past
  // its last P*V) in the padded column layout, then copied out by all threads in 16-byte units
  // where the rows allow: a short loop instead of 2 x NTILE unrolled stores with their column
  // branches (ncu at B=32 topk=512: the unrolled epilogue took 17 % of the stall samples, mostly
  // instruction-cache misses).
  const float* sink = M == Mutant::kSinkIgnored ? nullptr : p.sink;
  uint16_t* stage_o = Ks;  // [BH][KS] bf16 (BH <= T rows of the K tile)
  static_assert(BH <= T, "the staged output rows must fit the K tile");
  __syncthreads();  // every warp's last P*V is done with Ks
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = hg * 16 + g + 8 * r, head = h0 + row;
    const SoftmaxState st = r ? st1 : st0;
    // Empty row: out = 0, never 0/0 (kEmptyRowNaN plants exactly that division).
    const bool has = softmax_has_tokens(st) || M == Mutant::kEmptyRowNaN;
    // One reciprocal per row and a product per element (correctly rounded: __frcp_rn, mul.rn),
    // not 2*NTILE divisions; cpu-mma's store does the same. Rows past H compute garbage that is
    // never copied out.
    const float rden = __frcp_rn(softmax_denominator(st, sink, head < p.heads ? head : h0));
#pragma unroll
    for (int i = 0; i < NTILE; ++i) {
      const int col = quarter * CW + i * 8 + 2 * t;
      const float y0 = has ? __fmul_rn(o[i][2 * r], rden) : 0.0f;
      const float y1 = has ? __fmul_rn(o[i][2 * r + 1], rden) : 0.0f;
      *reinterpret_cast<uint32_t*>(stage_o + row * KS + col) = pack_bf16x2(y0, y1);
    }
    if (quarter == 0 && t == 0 && head < p.heads) {
      Conventions conv = p.conv;
      if constexpr (M == Mutant::kSinkInLse) conv.sink_in_lse = true;
      float lse = softmax_lse(st, p.sink, head, conv);
      if constexpr (M == Mutant::kLseLog2) lse *= 1.4426950408889634f;  // log2(e)
      p.lse[static_cast<int64_t>(b) * p.lse_batch_stride +
            static_cast<int64_t>(qt) * p.lse_token_stride + head] = lse;
    }
  }
  __syncthreads();
  // Copy-out in 8-column units (nope and np are multiples of 16: a unit never straddles the
  // padding). Output column d comes from padded column d (nope) or np + d - nope (rope); padded
  // columns are never stored. kStorePaddedColumns stores the padded layout as is (columns
  // [0, wv) to d = col: past d_v, over rope).
  const int out_cols = M == Mutant::kStorePaddedColumns ? pl.wv : d_v(p.geom);
  const int upo = out_cols / 8;  // units per output row
  for (int u = tid; u < BH * upo; u += NT) {
    const int row = u / upo, d = (u - row * upo) * 8, head = h0 + row;
    if (head >= p.heads) continue;  // rows past H (H not a multiple of BH) are masked
    const int col = M == Mutant::kStorePaddedColumns || d < nope ? d : pl.np + d - nope;
    const uint4 v = *reinterpret_cast<const uint4*>(stage_o + row * KS + col);
    uint16_t* orow = p.out + static_cast<int64_t>(b) * p.out_batch_stride +
                     static_cast<int64_t>(qt) * p.out_token_stride +
                     static_cast<int64_t>(head) * p.out_head_stride + d;
    if (pl.out_vec16) {
      *reinterpret_cast<uint4*>(orow) = v;
    } else if (pl.out_vec4) {
      uint32_t* o4 = reinterpret_cast<uint32_t*>(orow);
      o4[0] = v.x, o4[1] = v.y, o4[2] = v.z, o4[3] = v.w;
    } else {
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        orow[2 * k] = static_cast<uint16_t>(w[k] & 0xffffu);
        orow[2 * k + 1] = static_cast<uint16_t>(w[k] >> 16);
      }
    }
  }
}

// Opt-in shared memory per block of the current device (0 when it cannot be queried, e.g. no
// device: the check is then left to the launch). 227 KiB on the H200; about 99 KiB on sm_120
// (RTX PRO 6000 Blackwell: 101376 bytes), where the default tiles do not fit and `cuda-mma`
// runs the small configuration (mma_small_selected).
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

// Whether the default configuration (BLOCK_H 32, 64-token tiles) does not fit the current
// device's shared memory while the small one does: `cuda-mma` (launch_mma_head_tiled with
// block_h 32) then runs the small configuration. False without a device (nothing to decide).
inline bool mma_small_selected() {
  const int have = device_smem_optin();
  return have > 0 && static_cast<size_t>(have) < mma_smem_bytes(kMmaDefaultBlockH) &&
         static_cast<size_t>(have) >= kMmaSmallSmemBytes;
}

// The explicit configuration's checks; smem: its dynamic shared memory.
inline std::optional<std::string> mma_unsupported_impl(const DecodeParams& p, int block_h,
                                                       size_t smem) {
  if (block_h != 32 && block_h != 64) return "block_h must be 32 or 64";
  if (auto why = common_unsupported(p)) return why;
  if (static_cast<int64_t>((p.heads + block_h - 1) / block_h) * p.s_q > 0x7fffffffLL)
    return "too many (query token, head block) pairs for grid x";
  const int have = device_smem_optin();
  if (have > 0 && static_cast<size_t>(have) < smem) {
    return "needs " + std::to_string(smem) +
           " bytes of shared memory per block, the device allows " + std::to_string(have);
  }
  return std::nullopt;
}
inline std::optional<std::string> mma_unsupported_impl(const DecodeParams& p, int block_h) {
  return mma_unsupported_impl(p, block_h, mma_smem_bytes(block_h));
}

template <int BH, int WG, Mutant M, bool EX, int T = kMmaTokenTile>
int launch_mma_kernel(const DecodeParams& p, void* stream) {
  const LayoutPlan pl = make_plan(p);
  constexpr size_t smem = mma_smem_bytes(BH, WG, T);
  static std::atomic<bool> attr_set{false};
  if (!attr_set.load()) {
    const cudaError_t e =
        cudaFuncSetAttribute(mma_head_tiled_kernel<BH, WG, M, EX, false, T>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, int{smem});
    if (e != cudaSuccess) return static_cast<int>(e);
    attr_set.store(true);
  }
  // x: (query token, head block) pairs, the head blocks of a token adjacent (they read the same
  // tokens: L2 reuse); y: batch rows.
  const dim3 grid(static_cast<unsigned>((p.heads + BH - 1) / BH * p.s_q), p.batch);
  mma_head_tiled_kernel<BH, WG, M, EX, false, T>
      <<<grid, BH / 16 * WG * 32, smem, static_cast<cudaStream_t>(stream)>>>(p, pl, SplitArgs{});
  return static_cast<int>(cudaGetLastError());
}

// The extra-cache kernel is instantiated for the normal kernel only: the planted bugs are about
// one cache (a mutant launch with an extra cache is refused).
// T: the token tile (kMmaSmallTile with WG = kMmaSmallWarps: the small configuration).
template <int BH, Mutant M, int WG = mma_default_wg(BH), int T = kMmaTokenTile>
int launch_mma_head_tiled_t(const DecodeParams& p, void* stream) {
  if (mma_unsupported_impl(p, BH, mma_smem_bytes(BH, WG, T))) return kErrUnsupported;
  if (p.has_extra) {
    if constexpr (M == Mutant::kNone) {
      return launch_mma_kernel<BH, WG, M, true, T>(p, stream);
    } else {
      return kErrUnsupported;
    }
  }
  return launch_mma_kernel<BH, WG, M, false, T>(p, stream);
}

// The small configuration (kMmaSmallSmemBytes of shared memory; see above).
template <Mutant M>
int launch_mma_small_t(const DecodeParams& p, void* stream) {
  return launch_mma_head_tiled_t<kMmaSmallBlockH, M, kMmaSmallWarps, kMmaSmallTile>(p, stream);
}

}  // namespace mla::cuda
