// Device helpers shared by the two CUDA kernels: the per-launch layout plan, gathering a token's
// raw bytes into shared memory (cp.async, 16/8/4-byte units or bytes when the stride forbids),
// fp8 -> fp32 decode, tensor-core fragment loads and the envelope check.
//
// Address arithmetic mirrors mla/mla_params.h (token_address) but uses 32-bit
// division: indices are int32, so page = idx / P fits. Mutant hooks (mutants.h) sit exactly where
// the planted bug would be.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>

#include "mla/mla_params.h"
#include "mla/mutants.h"
#include "mla/online_softmax.h"
#include "mla/tiling.h"

namespace mla::cuda {

// Widest K row held in shared memory: padded nope (<= 512) + rope (<= 64).
inline constexpr int kMaxKCols = 576;
// Largest raw token in staging (V32 with nope 512: 512 + 16 + 128 = 656; MODEL1 <= 648 -> 656).
inline constexpr int kMaxRawStride = 656;

// Everything derived from DecodeParams once per launch (host side), passed by value.
struct LayoutPlan {
  int32_t np = 0;                       // padded nope (next power of two of nope_dim)
  int32_t dkp = 0;                      // K columns in smem: np + rope_dim (multiple of 16)
  int32_t wv = 0;                       // V columns in smem used by P*V: MODEL1 np + rope, V32 np
  int32_t tiles = 0;                    // scale tiles per token
  int32_t data_bytes = 0;               // MODEL1: bytes of a data row; V32: bytes of a token
  int32_t scale_bytes = 0;              // MODEL1: bytes of a scale row; V32: 0
  int32_t sec0_len = 0, sec0_gran = 1;  // bytes copied from the token's first byte, unit size
  int32_t sec1_len = 0, sec1_gran = 1;  // MODEL1 scale row, unit size
  int32_t raw_stride = 0;               // bytes per token in smem staging (multiple of 16)
  int32_t rope_off = 0;                 // offset of rope inside a staged token
  int32_t scale_off = 0;                // offset of the scales inside a staged token
  int32_t rope_vec16 = 0;               // rope_off % 16 == 0 (16-byte smem reads)
  int32_t q_vec16 = 0;                  // q rows 16-byte aligned (uint4 loads)
  int32_t out_vec4 = 0;                 // out rows 4-byte aligned (bf16x2 stores)
  int32_t out_vec8 = 0;                 // out rows 8-byte aligned (bf16x4 stores)
  int32_t out_vec16 = 0;                // out rows 16-byte aligned (bf16x8 stores)
  int32_t page_pow2 = 0;   // next power of two of page_size (kPageSizePow2 mutant only)
  int64_t min_stride = 0;  // P * token_bytes (kPageStrideIgnored mutant only)
  // The extra cache's copy units (docs/SPEC.md section 8: the main layout and dims, so every other
  // field above holds for it too; its base, page size and stride set the units). Unused when
  // the call has no extra cache.
  int32_t extra_sec0_gran = 1, extra_sec1_gran = 1;
};

inline int largest_unit(uint64_t v) {
  if (v % 16 == 0) return 16;
  if (v % 8 == 0) return 8;
  if (v % 4 == 0) return 4;
  return 1;
}

// Copy units of a cache's two sections (data rows, MODEL1 scale rows): the largest unit that
// divides the base address, the page stride and every section offset.
inline void section_units(const CacheGeometry& g, const uint8_t* cache, int32_t& gran0,
                          int32_t& gran1) {
  const uint64_t base = reinterpret_cast<uintptr_t>(cache);
  const uint64_t s0 = static_cast<uint64_t>(g.page_stride);
  if (g.layout == Layout::kModel1) {
    const uint64_t data = static_cast<uint64_t>(model1_data_bytes(g));
    gran0 = largest_unit(base | s0 | data);
    const uint64_t scale_base = static_cast<uint64_t>(g.page_size) * data;
    gran1 =
        largest_unit(base | s0 | scale_base | static_cast<uint64_t>(model1_scale_bytes(g)) | 0x8u);
  } else {
    gran0 = largest_unit(base | s0 | static_cast<uint64_t>(token_bytes(g)));
    gran1 = 1;
  }
}

inline LayoutPlan make_plan(const DecodeParams& p) {
  const CacheGeometry& g = p.geom;
  LayoutPlan pl;
  pl.np = padded_nope(g.nope_dim);
  pl.dkp = pl.np + g.rope_dim;
  pl.wv = g.layout == Layout::kModel1 ? pl.np + g.rope_dim : pl.np;
  pl.tiles = num_scale_tiles(g);
  section_units(g, p.kv_cache, pl.sec0_gran, pl.sec1_gran);
  if (p.has_extra)
    section_units(p.extra_geom, p.extra_kv_cache, pl.extra_sec0_gran, pl.extra_sec1_gran);
  if (g.layout == Layout::kModel1) {
    pl.data_bytes = model1_data_bytes(g);
    pl.scale_bytes = model1_scale_bytes(g);
    pl.sec0_len = pl.data_bytes;
    pl.sec1_len = pl.scale_bytes;
    pl.rope_off = g.nope_dim;
    pl.scale_off = pl.data_bytes;  // nope and rope are multiples of 16: 16-byte aligned
    pl.raw_stride = round_up(pl.data_bytes + pl.scale_bytes, 16);
  } else {
    pl.data_bytes = token_bytes(g);
    pl.sec0_len = pl.data_bytes;
    pl.scale_off = g.nope_dim;
    pl.rope_off = g.nope_dim + 4 * pl.tiles;
    pl.raw_stride = round_up(pl.data_bytes, 16);
  }
  pl.rope_vec16 = pl.rope_off % 16 == 0;
  // Token strides matter only with more than one query token per row (s is 0 otherwise).
  const bool multi = p.s_q > 1;
  pl.q_vec16 = (reinterpret_cast<uintptr_t>(p.q) % 16 == 0) && p.q_head_stride % 8 == 0 &&
               p.q_batch_stride % 8 == 0 && (!multi || p.q_token_stride % 8 == 0);
  const uintptr_t ob = reinterpret_cast<uintptr_t>(p.out);
  pl.out_vec4 = ob % 4 == 0 && p.out_head_stride % 2 == 0 && p.out_batch_stride % 2 == 0 &&
                (!multi || p.out_token_stride % 2 == 0);
  pl.out_vec8 = ob % 8 == 0 && p.out_head_stride % 4 == 0 && p.out_batch_stride % 4 == 0 &&
                (!multi || p.out_token_stride % 4 == 0);
  pl.out_vec16 = ob % 16 == 0 && p.out_head_stride % 8 == 0 && p.out_batch_stride % 8 == 0 &&
                 (!multi || p.out_token_stride % 8 == 0);
  int p2 = 1;
  while (p2 < g.page_size) p2 *= 2;
  pl.page_pow2 = p2;
  pl.min_stride = min_page_stride(g);
  return pl;
}

// Envelope of both kernels (see launch.h).
inline std::optional<std::string> common_unsupported(const DecodeParams& p) {
  const CacheGeometry& g = p.geom;
  if (p.batch < 1 || p.heads < 1 || p.topk < 1) return "B, H and topk must be >= 1";
  if (p.batch > 65535) return "B > 65535 (grid y limit)";
  if (g.nope_dim < 16 || g.nope_dim > 512 || g.nope_dim % 16 != 0)
    return "nope_dim must be a multiple of 16 in [16, 512]";
  if (g.scale_tile < 8 || g.scale_tile % 8 != 0 || g.nope_dim % g.scale_tile != 0)
    return "scale_tile must be a multiple of 8 dividing nope_dim";
  if (g.rope_dim < 0 || g.rope_dim > 64 || g.rope_dim % 16 != 0)
    return "rope_dim must be a multiple of 16 in [0, 64]";
  if (g.page_size < 1) return "page_size must be >= 1";
  if (g.page_stride < min_page_stride(g)) return "page_stride below the layout minimum";
  if (p.s_q < 1) return "s_q must be >= 1";
  // A batch row spans its s_q query tokens (docs/SPEC.md section 8); with s_q = 1 the token strides
  // are never used (callers of the version-1 problem leave them 0).
  const int64_t sq = p.s_q;
  const bool multi = p.s_q > 1;
  const int64_t q_tok = multi ? p.q_token_stride : p.q_head_stride * p.heads;
  const int64_t out_tok = multi ? p.out_token_stride : p.out_head_stride * p.heads;
  const int64_t lse_tok = multi ? p.lse_token_stride : p.heads;
  if (p.q_head_stride < d_qk(g) || q_tok < p.q_head_stride * p.heads ||
      p.q_batch_stride < (sq - 1) * q_tok + p.q_head_stride * p.heads)
    return "q strides too small";
  if (p.out_head_stride < d_v(g) || out_tok < p.out_head_stride * p.heads ||
      p.out_batch_stride < (sq - 1) * out_tok + p.out_head_stride * p.heads)
    return "out strides too small";
  if (p.indices_batch_stride < p.topk) return "indices_batch_stride below topk";
  if (multi && p.indices_token_stride < p.topk) return "indices_token_stride below topk";
  if (lse_tok < p.heads || p.lse_batch_stride < (sq - 1) * lse_tok + p.heads)
    return "lse strides too small";
  if (num_slots(g) > 0x7fffffffLL) return "more than 2^31-1 cache slots";
  if (p.has_extra) {
    const CacheGeometry& e = p.extra_geom;
    if (e.layout != g.layout || e.nope_dim != g.nope_dim || e.rope_dim != g.rope_dim ||
        e.scale_tile != g.scale_tile)
      return "the extra cache must have the main cache's layout and dims";
    if (p.extra_topk < 0) return "extra_topk must be >= 0";
    if (e.page_size < 1) return "extra page_size must be >= 1";
    if (e.page_stride < min_page_stride(e)) return "extra page_stride below the layout minimum";
    if (num_slots(e) > 0x7fffffffLL) return "more than 2^31-1 extra cache slots";
    if (p.extra_topk > 0 && p.extra_indices == nullptr) return "extra_indices missing";
    if (p.extra_indices_batch_stride < p.extra_topk)
      return "extra_indices_batch_stride below extra_topk";
    if (multi && p.extra_indices_token_stride < p.extra_topk)
      return "extra_indices_token_stride below extra_topk";
  }
  return std::nullopt;
}

inline bool sticky_error(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

// ---- device helpers ----

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Copies len bytes src -> dst (shared) with n lanes (this one is lane `sub` of them), in units
// of gran bytes (both addresses are multiples of gran; len is a multiple of gran). Units of 4..16
// bytes go through cp.async.
__device__ __forceinline__ void lanes_copy(uint8_t* dst, const uint8_t* src, int len, int gran,
                                           int sub, int n) {
  const uint32_t d = smem_u32(dst);
  if (gran == 16) {
    for (int u = sub; u < len / 16; u += n) cp_async16(d + 16 * u, src + 16 * u);
  } else if (gran == 8) {
    for (int u = sub; u < len / 8; u += n) cp_async8(d + 8 * u, src + 8 * u);
  } else if (gran == 4) {
    for (int u = sub; u < len / 4; u += n) cp_async4(d + 4 * u, src + 4 * u);
  } else {
    for (int u = sub; u < len; u += n) dst[u] = __ldg(src + u);
  }
}

// One index list of one query token and the cache it reads (docs/SPEC.md section 8): the token's
// main list, or its extra list (the same layout and dims, its own paging). Built per tile from the
// kernel parameters (a few constant-bank loads), so that the hot loops see one cache either way.
struct ListView {
  const uint8_t* kv = nullptr;
  const int32_t* idx = nullptr;  // entry 0 of the token's list
  int32_t topk = 0;
  int32_t topk_len = -1;  // -1: no length given
  int32_t page_size = 1;
  int32_t sec0_gran = 1, sec1_gran = 1;
  int64_t page_stride = 0;
};

__device__ __forceinline__ ListView main_list(const DecodeParams& p, const LayoutPlan& pl, int b,
                                              int s, int32_t topk_len) {
  ListView v;
  v.kv = p.kv_cache;
  v.idx = p.indices + static_cast<int64_t>(b) * p.indices_batch_stride +
          static_cast<int64_t>(s) * p.indices_token_stride;
  v.topk = p.topk;
  v.topk_len = topk_len;
  v.page_size = p.geom.page_size;
  v.sec0_gran = pl.sec0_gran;
  v.sec1_gran = pl.sec1_gran;
  v.page_stride = p.geom.page_stride;
  return v;
}

__device__ __forceinline__ ListView extra_list(const DecodeParams& p, const LayoutPlan& pl, int b,
                                               int s, int32_t topk_len) {
  ListView v;
  v.kv = p.extra_kv_cache;
  v.idx = p.extra_indices + static_cast<int64_t>(b) * p.extra_indices_batch_stride +
          static_cast<int64_t>(s) * p.extra_indices_token_stride;
  v.topk = p.extra_topk;
  v.topk_len = topk_len;
  v.page_size = p.extra_geom.page_size;
  v.sec0_gran = pl.extra_sec0_gran;
  v.sec1_gran = pl.extra_sec1_gran;
  v.page_stride = p.extra_geom.page_stride;
  return v;
}

// Entries of a list that can be valid: min(topk, topk_len) (topk_length given), else topk.
// Tiles past it hold no valid entry; skipping them is bit-identical (a masked tile has
// alpha = 1 and adds +0 to l), so the host models, which walk every tile, give the same bits.
template <Mutant M>
__device__ __forceinline__ int effective_entries(int topk, int32_t topk_len) {
  int n = topk;
  if constexpr (M != Mutant::kTopkLengthIgnored) {
    if (topk_len >= 0) n = min(n, max(topk_len, 0));
  }
  return n;
}

// Validity of top-k entry k of a list (docs/SPEC.md 3) and the slot it reads, with the index
// mutants.
template <Mutant M>
__device__ __forceinline__ bool entry_valid(const DecodeParams& p, const ListView& L, int32_t& idx,
                                            int k) {
  int32_t topk_len = L.topk_len;
  if constexpr (M == Mutant::kTopkLengthIgnored) topk_len = -1;
  if (k >= L.topk) return false;
  if constexpr (M == Mutant::kInvalidIndexUnmasked) {
    if (topk_len >= 0 && k >= topk_len) return false;
    if (!index_valid(idx, k, -1, p.conv)) idx = 0;  // clamped to slot 0, not masked
    return true;
  } else {
    return index_valid(idx, k, topk_len, p.conv);
  }
}

// Byte offsets of a valid slot's two sections in the list's cache (nope/data row, MODEL1 scale
// row). The page mutants use the main cache's page_pow2 and min_stride (the mutants do not cover
// the extra cache).
template <Mutant M>
__device__ __forceinline__ void slot_offsets(const ListView& L, const LayoutPlan& pl, int32_t idx,
                                             int64_t& sec0, int64_t& sec1) {
  const uint32_t P = static_cast<uint32_t>(L.page_size);
  uint32_t page, slot;
  if constexpr (M == Mutant::kPageSizePow2) {
    page = static_cast<uint32_t>(idx) / static_cast<uint32_t>(pl.page_pow2);
    slot = static_cast<uint32_t>(idx) % static_cast<uint32_t>(pl.page_pow2);
  } else {
    page = static_cast<uint32_t>(idx) / P;
    slot = static_cast<uint32_t>(idx) - page * P;
  }
  int64_t stride = L.page_stride;
  if constexpr (M == Mutant::kPageStrideIgnored) stride = pl.min_stride;
  const int64_t base = static_cast<int64_t>(page) * stride;
  sec0 = base + static_cast<int64_t>(slot) * pl.data_bytes;
  sec1 =
      base + static_cast<int64_t>(P) * pl.data_bytes + static_cast<int64_t>(slot) * pl.scale_bytes;
}

// Gathers one token's raw bytes (both sections) into its staging row, with n lanes (this one is
// lane `sub` of them): a warp, or a group of lanes when a warp gathers several tokens at once.
__device__ __forceinline__ void stage_token(const ListView& L, const LayoutPlan& pl, int64_t sec0,
                                            int64_t sec1, uint8_t* dst, int sub, int n = 32) {
  lanes_copy(dst, L.kv + sec0, pl.sec0_len, L.sec0_gran, sub, n);
  if (pl.sec1_len > 0)
    lanes_copy(dst + pl.scale_off, L.kv + sec1, pl.sec1_len, L.sec1_gran, sub, n);
}

// Byte offset of nope tile t's scale inside a staged token (MODEL1 ue8m0 byte, V32 fp32).
template <Mutant M>
__device__ __forceinline__ int staged_scale_offset(const DecodeParams& p, const LayoutPlan& pl,
                                                   int t) {
  if constexpr (M == Mutant::kWrongScaleGroup) {
    if (t == pl.tiles - 1 && t > 0) t -= 1;  // the tile beside the padding takes its neighbour's
  }
  return pl.scale_off + (p.geom.layout == Layout::kModel1 ? t : 4 * t);
}

// Scale of nope tile t of a staged token.
template <Mutant M>
__device__ __forceinline__ float staged_scale(const DecodeParams& p, const LayoutPlan& pl,
                                              const uint8_t* tok, int t) {
  const int off = staged_scale_offset<M>(p, pl, t);
  if (p.geom.layout == Layout::kModel1) return ue8m0_to_float(tok[off]);
  return *reinterpret_cast<const float*>(tok + off);
}

// Two e4m3 bytes (low byte first) -> two floats, bit-exact with mla::e4m3_to_float (fp8 -> fp16
// is exact for every e4m3 value including subnormals and NaN; fp16 -> fp32 is exact).
__device__ __forceinline__ float2 e4m3x2_to_float2(uint16_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(two, __NV_E4M3);
  __half2 hh;
  memcpy(&hh, &h, sizeof hh);
  return __half22float2(hh);
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // cvt.rn.bf16x2.f32
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}

__device__ __forceinline__ float bf16lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

}  // namespace mla::cuda

namespace mla::cuda {

// ---- tensor-core fragments (mma.sync m16n8k16 bf16, fp32 accumulate) ----

// Four 8x8 b16 matrices; lane l gives the address of row l%8 of matrix l/8.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Two 8x8 b16 matrices; lanes 0-15 give the row addresses.
__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2_trans(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

// exp(x) for softmax weights of the MMA kernel: ex2.approx.ftz(x * log2(e)), 3 instructions
// instead of expf's ~10. Error: the product's rounding (u |x|, x = logit - max <= 0), ex2's
// 2 ulps, and results below 2^-126 (x < -87) flushed to 0; inside the tolerance model's
// exp-argument, c_exp and underflow terms (properties/tolerance.h).
__device__ __forceinline__ float fast_exp(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x * 1.4426950408889634f));
  return y;
}

// d += a * b: a 16x16 row-major bf16 (4 regs), b 16x8 col-major bf16 (2 regs), d 16x8 fp32.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace mla::cuda
