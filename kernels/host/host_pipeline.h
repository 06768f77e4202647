// Pieces shared by the two host models (cpu_simt.cc, cpu_mma.h): the kernels' padded column
// layout, token decoding, masking, the final store, input checks and the guarded-run wrapper.
//
// Internal to kernels/host. Everything a planted bug (kernels/common/mutants.h) can change is a
// template on mla::Mutant tested with `if constexpr`, so the normal build compiles only kNone.
// Cache addressing and number formats come from kernels/common (the code the CUDA kernels use);
// a host model never reads outside the buffers it is given, even as a mutant.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "harness/backend.h"
#include "harness/materialize.h"
#include "kernels/common/fp_formats.h"
#include "kernels/common/mla_params.h"
#include "kernels/common/mutants.h"
#include "kernels/common/online_softmax.h"
#include "kernels/common/tiling.h"

namespace mlafuzz::host {

using mla::Mutant;

// Partial sums of a dot product: lane l sums columns l, l+32, l+64, ... in order, then the lanes
// are added as a butterfly (off = 16, 8, 4, 2, 1), the order a warp's shuffle reduction gives.
inline constexpr int kLanes = 32;

// The kernels' padded column space of one token (and of one q row): nope dims at [0, nope),
// padded columns [nope, padded_nope) that are masked to zero, rope dims at padded_nope + r, and
// zero columns up to a multiple of kLanes. MODEL1: 448 nope + 64 pad + 64 rope = 576 columns.
struct PaddedColumns {
  int32_t nope = 0;         // quantized dims
  int32_t padded_nope = 0;  // mla::padded_nope(nope)
  int32_t rope = 0;         // bf16 dims
  int32_t width_qk = 0;     // columns of a decoded token / q row (multiple of kLanes)
  int32_t width_v = 0;      // columns O accumulates: up to the column of V dim d_v - 1
  int32_t d_v = 0;

  // Column of logical dim d in [0, d_qk) (and of output dim d in [0, d_v)).
  int32_t col(int32_t d) const { return d < nope ? d : padded_nope + (d - nope); }
};

PaddedColumns padded_columns(const mla::CacheGeometry& g);

// The 256 e4m3fn encodings as fp32, built from mla::e4m3_to_float (bit-identical to it).
const float* e4m3_table();

// Everything one host-model call reads and writes. `p.out`/`p.lse` point into the canary-guarded
// OutputBuffers; `out_end` is one past that buffer (stores of mutants are clamped to it).
struct HostCall {
  mla::DecodeParams p;
  int64_t cache_bytes = 0;
  uint16_t* out_end = nullptr;
};

// Reason the case cannot be run without reading or writing outside its buffers (inconsistent
// shapes, a valid index outside the cache, a negative index the convention treats as valid),
// or nullopt. The harness rejects such cases earlier; this keeps a hand-built case from
// crashing the model.
std::optional<std::string> check_inputs(const MaterializedCase& m);

// Checks inputs, allocates guarded outputs, runs `model`, collects the outputs. Never throws:
// check failures and exceptions become RunStatus::kError.
RunResult run_guarded(const MaterializedCase& m, const std::function<void(const HostCall&)>& model);

// Dot product over `width` columns (a multiple of kLanes) in the lane order above. fp32
// multiplies and adds, never contracted (the project builds with -ffp-contract=off).
inline float dot_lanes(const float* __restrict a, const float* __restrict b, int32_t width) {
  float acc[kLanes] = {};
  for (int32_t c = 0; c < width; c += kLanes) {
    for (int32_t l = 0; l < kLanes; ++l) acc[l] += a[c + l] * b[c + l];
  }
  for (int32_t off = kLanes / 2; off > 0; off /= 2) {
    for (int32_t l = 0; l < off; ++l) acc[l] += acc[l + off];
  }
  return acc[0];
}

// ---- Addressing and masking (the mutants that break them live here) ----

// Is top-k entry k of a row valid, and which global slot does it read? kInvalidIndexUnmasked
// reads an invalid index as slot 0 and keeps it; kTopkLengthIgnored drops the topk_length test.
template <Mutant M>
bool entry_valid(int32_t idx, int32_t k, int32_t topk_len, const mla::Conventions& conv,
                 int64_t* slot) {
  if constexpr (M == Mutant::kTopkLengthIgnored) topk_len = -1;
  bool valid = mla::index_valid(idx, k, topk_len, conv);
  if constexpr (M == Mutant::kInvalidIndexUnmasked) {
    if (!valid && (topk_len < 0 || k < topk_len)) {
      valid = true;
      idx = 0;
    }
  }
  *slot = idx;
  return valid;
}

// Largest offset a token's section may start at so that `len` bytes stay in the cache.
inline int64_t clamp_section(int64_t offset, int64_t len, int64_t cache_bytes) {
  return std::clamp<int64_t>(offset, 0, std::max<int64_t>(cache_bytes - len, 0));
}

// Byte addresses of a token. kPageStrideIgnored uses the minimum stride P*token_bytes for the
// page base; kPageSizePow2 splits the slot with the next power of two above P (page = idx / P2,
// slot = idx % P2, so slot can pass the page's last token). Mutant addresses are clamped so
// that every section lies inside the cache: the host model must never read out of bounds,
// where the buggy kernel would read a neighbour page or fault.
template <Mutant M>
mla::TokenAddress token_address(const mla::CacheGeometry& g, int64_t slot, int64_t cache_bytes) {
  if constexpr (M == Mutant::kPageStrideIgnored) {
    mla::CacheGeometry wrong = g;
    wrong.page_stride = mla::min_page_stride(g);
    return mla::token_address(wrong, slot);
  } else if constexpr (M == Mutant::kPageSizePow2) {
    const int64_t p2 = mla::padded_nope(g.page_size);  // next power of two >= P
    const int64_t page = slot / p2, in_page = slot % p2;
    // The address of slot 0 of the page, then in_page tokens further on, section by section.
    mla::TokenAddress a = mla::token_address(g, page * g.page_size);
    const int64_t data =
        g.layout == mla::Layout::kModel1 ? mla::model1_data_bytes(g) : mla::token_bytes(g);
    const int64_t scale = g.layout == mla::Layout::kModel1 ? mla::model1_scale_bytes(g) : data;
    a.nope += in_page * data;
    a.rope += in_page * data;
    a.scale += in_page * scale;
    a.nope = clamp_section(a.nope, g.nope_dim, cache_bytes);
    a.rope = clamp_section(a.rope, 2 * static_cast<int64_t>(g.rope_dim), cache_bytes);
    const int64_t scale_bytes =
        mla::num_scale_tiles(g) * (g.layout == mla::Layout::kModel1 ? 1 : 4);
    a.scale = clamp_section(a.scale, scale_bytes, cache_bytes);
    return a;
  } else {
    (void)cache_bytes;
    return mla::token_address(g, slot);
  }
}

// Decodes one token into padded columns: e4m3 * scale for nope, bf16 for rope, zero for the
// padded and tail columns; with kRoundBf16 every value is then rounded to bf16 (the MMA
// kernel's shared-memory K tile; exact for in-range power-of-two scales). Bit-identical to
// mla::dequant_k for every logical dim (same fp32 product; the table is e4m3_to_float).
//
// kWrongScaleGroup: the last nope tile takes the previous tile's scale.
// kUnmaskedPadColumns: padded columns [nope, padded_nope) are loaded from the token's bytes at
// the same offsets (MODEL1: the first rope bytes, read as e4m3) with the last nope tile's scale
// (the scale registers hold num_scale_tiles values; the buggy tile index is clamped to the
// last one) instead of being masked to zero.
template <Mutant M, bool kRoundBf16>
void decode_token(const mla::CacheGeometry& g, const uint8_t* cache, int64_t cache_bytes,
                  const mla::TokenAddress& a, const PaddedColumns& cols, float* __restrict dst) {
  const float* table = e4m3_table();
  const int32_t tiles = mla::num_scale_tiles(g);
  const uint8_t* nope = cache + a.nope;
  for (int32_t t = 0; t < tiles; ++t) {
    int32_t scale_tile = t;
    if constexpr (M == Mutant::kWrongScaleGroup) {
      if (t == tiles - 1 && t > 0) scale_tile = t - 1;
    }
    const float scale = mla::tile_scale(g, cache, a, scale_tile);
    const int32_t d0 = t * g.scale_tile;
    for (int32_t d = d0; d < d0 + g.scale_tile; ++d) dst[d] = table[nope[d]] * scale;
  }
  for (int32_t c = cols.nope; c < cols.padded_nope; ++c) dst[c] = 0.0f;
  if constexpr (M == Mutant::kUnmaskedPadColumns) {
    if (tiles > 0) {
      const float scale = mla::tile_scale(g, cache, a, tiles - 1);
      for (int32_t c = cols.nope; c < cols.padded_nope; ++c) {
        const int64_t at = std::min<int64_t>(a.nope + c, cache_bytes - 1);
        dst[c] = table[cache[at]] * scale;
      }
    }
  }
  const uint8_t* rope = cache + a.rope;
  float* rope_dst = dst + cols.padded_nope;
  for (int32_t r = 0; r < cols.rope; ++r) {
    rope_dst[r] = mla::bf16_to_float(static_cast<uint16_t>(rope[2 * r] | (rope[2 * r + 1] << 8)));
  }
  for (int32_t c = cols.padded_nope + cols.rope; c < cols.width_qk; ++c) dst[c] = 0.0f;
  if constexpr (kRoundBf16) {
    for (int32_t c = 0; c < cols.width_qk; ++c) dst[c] = mla::round_to_bf16(dst[c]);
  }
}

// One batch row's selected tokens, decoded once and shared by every head.
struct DecodedRow {
  std::vector<uint8_t> valid;  // [topk] 1 if the entry takes part (masked entries are not read)
  std::vector<float> kv;       // [topk, width_qk] decoded tokens (rows of invalid entries stale)
};

template <Mutant M, bool kRoundBf16>
void decode_row(const HostCall& call, const PaddedColumns& cols, int32_t b, DecodedRow* row) {
  const mla::DecodeParams& p = call.p;
  row->valid.assign(p.topk, 0);
  row->kv.resize(static_cast<size_t>(p.topk) * cols.width_qk);
  const int32_t* idx = p.indices + static_cast<int64_t>(b) * p.topk;
  const int32_t topk_len = p.topk_length != nullptr ? p.topk_length[b] : -1;
  for (int32_t k = 0; k < p.topk; ++k) {
    int64_t slot = 0;
    if (!entry_valid<M>(idx[k], k, topk_len, p.conv, &slot)) continue;
    if constexpr (M != Mutant::kNone) {
      // check_inputs vouches for the indices kNone reads; a mutant may read others (slot 0 of
      // an empty cache, an entry past topk_length): keep them inside the cache.
      const int64_t slots = mla::num_slots(p.geom);
      if (slots <= 0) continue;
      slot = std::clamp<int64_t>(slot, 0, slots - 1);
    }
    row->valid[k] = 1;
    const mla::TokenAddress a = token_address<M>(p.geom, slot, call.cache_bytes);
    decode_token<M, kRoundBf16>(p.geom, p.kv_cache, call.cache_bytes, a, cols,
                                row->kv.data() + static_cast<size_t>(k) * cols.width_qk);
  }
}

// q of head h in batch row b as bf16 values widened to fp32 in padded columns (pad and tail
// zero). kUnmaskedPadColumns loads the padded columns from q memory at the same offsets (MODEL1:
// q's first rope elements), never past the head's d_qk elements.
template <Mutant M>
void load_q_bf16(const mla::DecodeParams& p, const PaddedColumns& cols, int32_t b, int32_t h,
                 float* __restrict dst) {
  const uint16_t* q = p.q + b * p.q_batch_stride + h * p.q_head_stride;
  const int32_t d_qk = cols.nope + cols.rope;
  std::fill(dst, dst + cols.width_qk, 0.0f);
  for (int32_t d = 0; d < d_qk; ++d) dst[cols.col(d)] = mla::bf16_to_float(q[d]);
  if constexpr (M == Mutant::kUnmaskedPadColumns) {
    for (int32_t c = cols.nope; c < cols.padded_nope && c < d_qk; ++c) {
      dst[c] = mla::bf16_to_float(q[c]);
    }
  }
}

// ---- Online softmax steps and the final store (mutants of the softmax live here) ----

// softmax_advance; kNoRescale keeps l unscaled (and the caller skips O *= alpha).
template <Mutant M>
float advance(mla::SoftmaxState& s, float tile_max) {
  const float l = s.l;
  const float alpha = mla::softmax_advance(s, tile_max);
  if constexpr (M == Mutant::kNoRescale) s.l = l;
  return alpha;
}

// Row-sum term of weight p (fp32; kRowSumBf16 adds the bf16-rounded p).
template <Mutant M>
float row_sum_term(float p) {
  if constexpr (M == Mutant::kRowSumBf16) return mla::round_to_bf16(p);
  return p;
}

// Token tiles of a row: ceil(topk / tile); kDropPartialTile skips a partial last tile.
template <Mutant M>
int32_t num_token_tiles(int32_t topk, int32_t tile) {
  int32_t n = (topk + tile - 1) / tile;
  if constexpr (M == Mutant::kDropPartialTile) {
    if (topk % tile != 0) --n;
  }
  return n;
}

// Folds tokens [k0, k1) of a decoded row into one head's softmax state s and fp32 output
// accumulator O[width_v], as one kernel tile: logits of the valid tokens, the tile max, one
// rescale, then p = exp(x - m) added to l and p * V added to O token by token.
// kMma: the logit is fp32(dot(q, K)) * sm_scale (scaled after the product, q unscaled) and P*V
// takes p rounded to bf16 (l keeps the fp32 p). Otherwise (SIMT) q is already scaled and
// everything stays fp32. x is scratch for the tile's logits (k1 - k0 floats).
template <Mutant M, bool kMma>
void fold_tile(const DecodedRow& row, const PaddedColumns& cols, int32_t k0, int32_t k1,
               const float* q, float sm_scale, mla::SoftmaxState& s, float* __restrict O,
               float* __restrict x) {
  float tile_max = mla::neg_inf();
  for (int32_t k = k0; k < k1; ++k) {
    if (!row.valid[k]) continue;
    float xk = dot_lanes(q, row.kv.data() + static_cast<size_t>(k) * cols.width_qk, cols.width_qk);
    if constexpr (kMma) xk = xk * sm_scale;
    x[k - k0] = xk;
    tile_max = xk > tile_max ? xk : tile_max;  // NaN logits are skipped, as fmaxf does
  }
  const float alpha = advance<M>(s, tile_max);
  if constexpr (M != Mutant::kNoRescale) {
    if (alpha != 1.0f) {  // x * 1 == x bit for bit: skipping is exact
      for (int32_t c = 0; c < cols.width_v; ++c) O[c] *= alpha;
    }
  }
  for (int32_t k = k0; k < k1; ++k) {
    if (!row.valid[k]) continue;
    const float p = mla::softmax_weight(s, x[k - k0]);
    s.l += row_sum_term<M>(p);
    const float pv = kMma ? mla::round_to_bf16(p) : p;
    const float* __restrict v = row.kv.data() + static_cast<size_t>(k) * cols.width_qk;
    for (int32_t c = 0; c < cols.width_v; ++c) O[c] += pv * v[c];
  }
}

// Writes out[b][h][0, d_v) = bf16(O / denominator) (0 for an empty row) and lse[b][h].
// kSinkIgnored drops the sink from the denominator; kSinkInLse folds it into the LSE; kLseLog2
// returns LSE / ln 2; kEmptyRowNaN divides an empty row's O = 0 by its denominator (0 without a
// sink: NaN); kStorePaddedColumns also stores the padded columns [nope, padded_nope) right
// after d_v (into the head's padding, the next head or the guard band; clamped to the buffer).
template <Mutant M>
void store_head(const HostCall& call, const PaddedColumns& cols, int32_t b, int32_t h,
                const mla::SoftmaxState& s, const float* O) {
  const mla::DecodeParams& p = call.p;
  const float* sink = p.sink;
  if constexpr (M == Mutant::kSinkIgnored) sink = nullptr;
  mla::Conventions conv = p.conv;
  if constexpr (M == Mutant::kSinkInLse) conv.sink_in_lse = true;

  uint16_t* out = p.out + b * p.out_batch_stride + h * p.out_head_stride;
  bool has_tokens = mla::softmax_has_tokens(s);
  if constexpr (M == Mutant::kEmptyRowNaN) has_tokens = true;
  const float denom = has_tokens ? mla::softmax_denominator(s, sink, h) : 0.0f;
  auto value = [&](int32_t c) -> uint16_t {
    // Empty row: out = 0 whatever the sink (SPEC section 3), never 0/0.
    return has_tokens ? mla::float_to_bf16(O[c] / denom) : uint16_t{0};
  };
  for (int32_t d = 0; d < cols.d_v; ++d) out[d] = value(cols.col(d));
  if constexpr (M == Mutant::kStorePaddedColumns) {
    for (int32_t c = cols.nope; c < cols.padded_nope; ++c) {
      uint16_t* at = out + cols.d_v + (c - cols.nope);
      if (at < call.out_end) *at = value(c);
    }
  }
  float lse = mla::softmax_lse(s, sink, h, conv);
  if constexpr (M == Mutant::kLseLog2) lse = lse / 0.693147182f;  // ln 2 rounded to fp32
  p.lse[static_cast<int64_t>(b) * p.heads + h] = lse;
}

}  // namespace mlafuzz::host
