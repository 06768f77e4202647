// The sparse MLA decode problem as plain data, shared by host and device code.
//
// Layouts, masking rules and the launch parameter struct live here, once. The oracle, the host
// models and both CUDA kernels read the cache only through these functions, so an addressing or
// masking bug shows on the CPU as well as on the GPU. See docs/SPEC.md sections 2 and 3.
#pragma once

#include <cstdint>

#include "fp_formats.h"

namespace mla {

enum class Layout : int32_t {
  kModel1 = 0,  // DeepSeek-V4-Flash: per page, P token data rows (nope fp8 + rope bf16), then
                // P scale rows (ue8m0 bytes). FlashMLA tests/quant.py MODEL1 branch.
  kV32 = 1,     // DeepSeek-V3.2: per token nope fp8, fp32 scales, rope bf16 stored together.
};

// Which negative index values mark an invalid top-k entry.
enum class InvalidIndexRule : int32_t {
  kMinusOneOnly = 0,  // FlashMLA: only exactly -1 is invalid (other negatives are UB, rejected)
  kAnyNegative = 1,   // SGLang, vLLM: any negative index is invalid
  // Any index outside the cache's slots: negative, or >= num_slots (FlashMLA masks these to
  // match its reference). Host code only: the CUDA kernels' envelope excludes it, and
  // index_valid below (the one device code calls) reads it as kAnyNegative; host code calls
  // index_valid_in, which knows the slot count.
  kOutOfRange = 2,
};

// LSE of a row with no valid token.
enum class EmptyRowLse : int32_t {
  kPosInf = 0,  // FlashMLA convention
  kNegInf = 1,  // SGLang, vLLM
};

struct Conventions {
  InvalidIndexRule invalid_index = InvalidIndexRule::kMinusOneOnly;
  EmptyRowLse empty_lse = EmptyRowLse::kPosInf;
  // SGLang's Triton path returns lse = ln(sum_k exp(x_k) + exp(sink)); FlashMLA excludes the sink.
  bool sink_in_lse = false;
};

// Geometry of the paged FP8 KV cache. Every size is a parameter; nothing is hard-coded.
struct CacheGeometry {
  Layout layout = Layout::kModel1;
  int32_t nope_dim = 448;   // quantized dims (multiple of scale_tile)
  int32_t rope_dim = 64;    // bf16 dims, not quantized
  int32_t scale_tile = 64;  // nope dims per scale (64 for MODEL1, 128 for V32)
  int32_t page_size = 256;  // P: tokens per page
  int64_t page_stride = 0;  // S0: bytes from one page to the next (>= min_page_stride)
  int32_t num_pages = 1;
};

MLA_HD int32_t round_up(int32_t x, int32_t m) { return (x + m - 1) / m * m; }

MLA_HD int32_t num_scale_tiles(const CacheGeometry& g) { return g.nope_dim / g.scale_tile; }
MLA_HD int32_t d_qk(const CacheGeometry& g) { return g.nope_dim + g.rope_dim; }
// MODEL1: V is the whole dequantized vector (rope included). V32: V is the nope part only.
MLA_HD int32_t d_v(const CacheGeometry& g) {
  return g.layout == Layout::kModel1 ? g.nope_dim + g.rope_dim : g.nope_dim;
}

// MODEL1 data row: nope bytes then rope bf16 (576 bytes for 448 + 64).
MLA_HD int32_t model1_data_bytes(const CacheGeometry& g) { return g.nope_dim + 2 * g.rope_dim; }
// MODEL1 scale row: one ue8m0 byte per tile, padded to 8 bytes (7 scales + 1 unused byte).
MLA_HD int32_t model1_scale_bytes(const CacheGeometry& g) {
  return round_up(num_scale_tiles(g), 8);
}
// Bytes one token occupies, all sections together (584 MODEL1, 656 V32).
MLA_HD int32_t token_bytes(const CacheGeometry& g) {
  return g.layout == Layout::kModel1 ? model1_data_bytes(g) + model1_scale_bytes(g)
                                     : g.nope_dim + 4 * num_scale_tiles(g) + 2 * g.rope_dim;
}
MLA_HD int64_t min_page_stride(const CacheGeometry& g) {
  return static_cast<int64_t>(g.page_size) * token_bytes(g);
}
MLA_HD int64_t cache_bytes(const CacheGeometry& g) { return g.page_stride * g.num_pages; }
MLA_HD int64_t num_slots(const CacheGeometry& g) {
  return static_cast<int64_t>(g.page_size) * g.num_pages;
}

// Byte offsets of one token's sections inside the cache. page = idx / P, slot = idx % P
// (indices are global slots; there is no block table).
struct TokenAddress {
  int64_t nope;   // first e4m3 byte
  int64_t rope;   // first bf16 rope element (2 bytes each)
  int64_t scale;  // first scale: ue8m0 byte (MODEL1) or little-endian fp32 (V32)
};

MLA_HD TokenAddress token_address(const CacheGeometry& g, int64_t global_slot) {
  const int64_t page = global_slot / g.page_size;
  const int64_t slot = global_slot % g.page_size;
  const int64_t base = page * g.page_stride;
  TokenAddress a;
  if (g.layout == Layout::kModel1) {
    a.nope = base + slot * model1_data_bytes(g);
    a.rope = a.nope + g.nope_dim;
    a.scale = base + static_cast<int64_t>(g.page_size) * model1_data_bytes(g) +
              slot * model1_scale_bytes(g);
  } else {
    a.nope = base + slot * token_bytes(g);
    a.scale = a.nope + g.nope_dim;
    a.rope = a.scale + 4 * num_scale_tiles(g);
  }
  return a;
}

// Scale of nope tile t of the token at address a.
MLA_HD float tile_scale(const CacheGeometry& g, const uint8_t* cache, const TokenAddress& a,
                        int32_t t) {
  if (g.layout == Layout::kModel1) return ue8m0_to_float(cache[a.scale + t]);
  const uint8_t* p = cache + a.scale + 4 * t;
  const uint32_t u = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                     (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
  return bits_to_float(u);
}

// Dequantized K[d] for d in [0, d_qk): e4m3 * scale for nope dims, bf16 rope after them.
// The product is exact in fp32 for the power-of-two scales the writer emits.
MLA_HD float dequant_k(const CacheGeometry& g, const uint8_t* cache, const TokenAddress& a,
                       int32_t d) {
  if (d < g.nope_dim) {
    return e4m3_to_float(cache[a.nope + d]) * tile_scale(g, cache, a, d / g.scale_tile);
  }
  const uint8_t* r = cache + a.rope + 2 * (d - g.nope_dim);
  return bf16_to_float(static_cast<uint16_t>(r[0] | (r[1] << 8)));
}

// Is top-k entry k of a row valid? topk_len < 0 means "no topk_length given".
MLA_HD bool index_valid(int32_t idx, int32_t k, int32_t topk_len, const Conventions& c) {
  if (topk_len >= 0 && k >= topk_len) return false;
  return c.invalid_index == InvalidIndexRule::kMinusOneOnly ? idx != -1 : idx >= 0;
}

// Host-side validity with the cache's slot count (num_slots of the list's cache): under
// kOutOfRange an index >= slots is invalid too; the other rules as index_valid. Not MLA_HD: the
// CUDA kernels never receive kOutOfRange and keep calling index_valid.
inline bool index_valid_in(int32_t idx, int32_t k, int32_t topk_len, const Conventions& c,
                           int64_t slots) {
  if (c.invalid_index == InvalidIndexRule::kOutOfRange) {
    return (topk_len < 0 || k < topk_len) && idx >= 0 && idx < slots;
  }
  return index_valid(idx, k, topk_len, c);
}

// Everything a backend needs for one call. Pointers are host or device pointers depending on
// the backend; shapes and strides are in elements.
struct DecodeParams {
  CacheGeometry geom;
  Conventions conv;
  int32_t batch = 0;  // B
  int32_t heads = 0;  // H
  int32_t topk = 0;
  float sm_scale = 0;  // softmax scale applied to q.K (fp32, as the kernels take it)

  const uint16_t* q = nullptr;        // [B, H, d_qk] bf16 bits; head stride q_head_stride >= d_qk
  int64_t q_head_stride = 0;          // elements between heads of one row
  int64_t q_batch_stride = 0;         // elements between batch rows
  const uint8_t* kv_cache = nullptr;  // [num_pages * page_stride] bytes
  const int32_t* indices = nullptr;   // [B, topk] global slots; -1 (or <0) invalid
  int64_t indices_batch_stride = 0;   // elements between index rows (>= topk)
  const int32_t* topk_length = nullptr;  // [B], may be nullptr (all topk entries considered)
  const float* sink = nullptr;           // [H] attention sink logits, may be nullptr
  uint16_t* out = nullptr;               // [B, H, d_v] bf16 bits; head stride out_head_stride
  int64_t out_head_stride = 0;           // elements between heads (>= d_v)
  int64_t out_batch_stride = 0;          // elements between batch rows
  float* lse = nullptr;                  // [B, H] natural-log LSE; heads contiguous
  int64_t lse_batch_stride = 0;          // elements between batch rows (>= H)

  // The production decode (docs/SPEC.md section 8; plugin ABI version 2): s_q query tokens per
  // batch row, each with its own index lists, and an optional extra cache read in the same softmax.
  // q, indices, out and lse gain the token axis [B, s_q, ...]: the *_batch_stride fields step
  // over a batch row (all its tokens), the *_token_stride fields over one token. topk_length
  // (and extra_topk_length) stay [B]. s_q = 1 without an extra cache is the problem above.
  int32_t s_q = 1;
  int64_t q_token_stride = 0;        // elements between query tokens of a row (>= H * head stride)
  int64_t indices_token_stride = 0;  // elements between the index lists of a row's tokens
  int64_t out_token_stride = 0;      // elements between query tokens of a row in out
  int64_t lse_token_stride = 0;      // elements between query tokens of a row in lse
  bool has_extra = false;
  CacheGeometry extra_geom;  // the main layout and dims with the extra cache's paging
  const uint8_t* extra_kv_cache = nullptr;
  int32_t extra_topk = 0;
  const int32_t* extra_indices = nullptr;  // [B, s_q, extra_topk] global slots of the extra cache
  int64_t extra_indices_batch_stride = 0;  // elements between batch rows
  int64_t extra_indices_token_stride = 0;  // elements between the lists of a row's tokens
  const int32_t* extra_topk_length = nullptr;  // [B], may be nullptr
};

}  // namespace mla
