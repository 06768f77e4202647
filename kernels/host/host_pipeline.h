// Pieces shared by the two host models (cpu_simt.cc, cpu_mma.h): the kernels' padded column
// layout, token decoding, masking, the final store, input checks and the guarded-run wrapper.
//
// Internal to kernels/host. Everything a planted bug (mla/mutants.h) can change is a
// template on mla::Mutant tested with `if constexpr`, so the normal build compiles only kNone.
// Cache addressing and number formats come from mla (the code the CUDA kernels use);
// a host model never reads outside the buffers it is given, even as a mutant.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/materialize.h"
#include "mla/fp_formats.h"
#include "mla/mla_params.h"
#include "mla/mutants.h"
#include "mla/online_softmax.h"
#include "mla/tiling.h"

namespace mlafuzz::host {

using mla::Mutant;

// The kernels' padded column space of one token (and of one q row): nope dims at [0, nope),
// padded columns [nope, padded_nope) that are masked to zero, rope dims at padded_nope + r.
// MODEL1: 448 nope + 64 pad + 64 rope = 576 columns; V32: 512 + 64.
struct PaddedColumns {
  int32_t nope = 0;         // quantized dims
  int32_t padded_nope = 0;  // mla::padded_nope(nope)
  int32_t rope = 0;         // bf16 dims
  int32_t dkp = 0;          // padded_nope + rope: the K columns of the kernels' shared memory
  int32_t width_v = 0;      // columns P*V accumulates: up to the column of V dim d_v - 1
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
  int64_t extra_cache_bytes = 0;
  uint16_t* out_end = nullptr;
};

// One index list of one query token and the cache it reads: the main list of token s of batch
// row b, or its extra list (docs/SPEC.md section 8; the same layout and dims, its own paging).
struct ListSource {
  mla::CacheGeometry geom;
  const uint8_t* cache = nullptr;
  int64_t cache_bytes = 0;
  const int32_t* idx = nullptr;
  int32_t topk = 0;
  int32_t topk_len = -1;  // -1: no length given
};

inline ListSource main_list(const HostCall& call, int32_t b, int32_t s) {
  const mla::DecodeParams& p = call.p;
  return {p.geom,           p.kv_cache,
          call.cache_bytes, p.indices + b * p.indices_batch_stride + s * p.indices_token_stride,
          p.topk,           p.topk_length != nullptr ? p.topk_length[b] : -1};
}

inline ListSource extra_list(const HostCall& call, int32_t b, int32_t s) {
  const mla::DecodeParams& p = call.p;
  return {p.extra_geom,
          p.extra_kv_cache,
          call.extra_cache_bytes,
          p.extra_indices + b * p.extra_indices_batch_stride + s * p.extra_indices_token_stride,
          p.extra_topk,
          p.extra_topk_length != nullptr ? p.extra_topk_length[b] : -1};
}

// Reason the case cannot be run without reading or writing outside its buffers (inconsistent
// shapes, a valid index outside the cache, a negative index the convention treats as valid),
// or nullopt. The harness rejects such cases earlier; this keeps a hand-built case from
// crashing the model.
std::optional<std::string> check_inputs(const MaterializedCase& m);

// Checks inputs, allocates guarded outputs, runs `model`, collects the outputs. Never throws:
// check failures and exceptions become RunStatus::kError.
RunResult run_guarded(const MaterializedCase& m, const std::function<void(const HostCall&)>& model);

// Where a host model keeps each padded column in its decoded tokens, q rows and O accumulators
// (the order its arithmetic wants). Positions no column maps to hold zero.
struct ColumnLayout {
  int32_t width = 0;         // floats per decoded token, q row and O
  std::vector<int32_t> pos;  // [dkp] padded column -> position
};

// Columns in order, width rounded up to a multiple of `multiple`.
ColumnLayout identity_layout(const PaddedColumns& cols, int32_t multiple);

// ---- Addressing and masking (the mutants that break them live here) ----

// Is top-k entry k of a row valid, and which global slot does it read? kInvalidIndexUnmasked
// reads an invalid index as slot 0 and keeps it; kTopkLengthIgnored drops the topk_length test.
// `slots`: the list's cache's slot count (out_of_range makes an index past it invalid).
template <Mutant M>
bool entry_valid(int32_t idx, int32_t k, int32_t topk_len, const mla::Conventions& conv,
                 int64_t slots, int64_t* slot) {
  if constexpr (M == Mutant::kTopkLengthIgnored) topk_len = -1;
  bool valid = mla::index_valid_in(idx, k, topk_len, conv, slots);
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

// Decodes one token into its dkp padded columns: e4m3 * scale for nope, bf16 for rope, zero for
// the padded columns; with kRoundBf16 every value is then rounded to bf16 (the MMA
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
  if constexpr (kRoundBf16) {
    for (int32_t c = 0; c < cols.dkp; ++c) dst[c] = mla::round_to_bf16(dst[c]);
  }
}

// One batch row's selected tokens, decoded once and shared by every head.
struct DecodedRow {
  std::vector<uint8_t> valid;  // [topk] 1 if the entry takes part (masked entries are not read)
  std::vector<float> kv;       // [topk, layout.width] decoded tokens (invalid entries: stale)
  std::vector<float> token;    // [dkp] one token in column order
  int32_t dkp = -1;            // the column count kv was zero-filled for
};

template <Mutant M, bool kRoundBf16>
void decode_row(const ListSource& src, const mla::Conventions& conv, const PaddedColumns& cols,
                const ColumnLayout& layout, DecodedRow* row) {
  row->valid.assign(src.topk, 0);
  const size_t size = static_cast<size_t>(src.topk) * layout.width;
  if (row->kv.size() != size || row->dkp != cols.dkp) {
    row->kv.assign(size, 0.0f);  // positions no column maps to stay zero from here on
    row->dkp = cols.dkp;
  }
  row->token.resize(cols.dkp);
  const int32_t* idx = src.idx;
  const int64_t slots = mla::num_slots(src.geom);
  for (int32_t k = 0; k < src.topk; ++k) {
    int64_t slot = 0;
    if (!entry_valid<M>(idx[k], k, src.topk_len, conv, slots, &slot)) continue;
    if constexpr (M != Mutant::kNone) {
      // check_inputs vouches for the indices kNone reads; a mutant may read others (slot 0 of
      // an empty cache, an entry past topk_length): keep them inside the cache.
      if (slots <= 0) continue;
      slot = std::clamp<int64_t>(slot, 0, slots - 1);
    }
    row->valid[k] = 1;
    const mla::TokenAddress a = token_address<M>(src.geom, slot, src.cache_bytes);
    decode_token<M, kRoundBf16>(src.geom, src.cache, src.cache_bytes, a, cols, row->token.data());
    float* dst = row->kv.data() + static_cast<size_t>(k) * layout.width;
    for (int32_t c = 0; c < cols.dkp; ++c) dst[layout.pos[c]] = row->token[c];
  }
}

// q of head h of query token s in batch row b as bf16 values widened to fp32, at layout positions
// (the padded columns zero; dst has layout.width floats). kUnmaskedPadColumns loads the padded
// columns from q memory at the same offsets (MODEL1: q's first rope elements), never past the
// head's d_qk elements.
template <Mutant M>
void load_q_bf16(const mla::DecodeParams& p, const PaddedColumns& cols, const ColumnLayout& layout,
                 int32_t b, int32_t s, int32_t h, float* __restrict dst) {
  const uint16_t* q = p.q + b * p.q_batch_stride + s * p.q_token_stride + h * p.q_head_stride;
  const int32_t d_qk = cols.nope + cols.rope;
  std::fill(dst, dst + layout.width, 0.0f);
  for (int32_t d = 0; d < d_qk; ++d) dst[layout.pos[cols.col(d)]] = mla::bf16_to_float(q[d]);
  if constexpr (M == Mutant::kUnmaskedPadColumns) {
    for (int32_t c = cols.nope; c < cols.padded_nope && c < d_qk; ++c) {
      dst[layout.pos[c]] = mla::bf16_to_float(q[c]);
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

// Weight of logit x after advance: exactly 0 for a masked token (x = -inf, as the kernels set
// it), also while m is still -inf (where exp(x - m) would be NaN).
inline float weight(const mla::SoftmaxState& s, float x) {
  return x == mla::neg_inf() ? 0.0f : mla::softmax_weight(s, x);
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

// Writes out[b][t][h][0, d_v) = bf16(O / denominator) (0 for an empty row) and lse[b][h]; O is in
// layout order. With reciprocal (the MMA kernel), bf16(O * (1 / denominator)) instead: one
// correctly rounded reciprocal per row and a product per element. kSinkIgnored drops the sink from
// the denominator (the LSE still follows the convention); kSinkInLse folds it into the LSE;
// kLseLog2 multiplies the LSE by log2(e); kEmptyRowNaN divides an empty row's O = 0 by its
// denominator (0 without a sink: NaN); kStorePaddedColumns stores the padded column layout as is,
// out[c] for c in [0, width_v): zeros over out[nope, padded_nope) and the rope outputs shifted past
// d_v (into the head's padding, the next head or the guard band; clamped to the buffer). These are
// the mechanics of the same mutants in kernels/cuda/mma_head_tiled.cuh.
template <Mutant M>
void store_head(const HostCall& call, const PaddedColumns& cols, const ColumnLayout& layout,
                int32_t b, int32_t t, int32_t h, const mla::SoftmaxState& s, const float* O,
                bool reciprocal = false) {
  const mla::DecodeParams& p = call.p;
  const float* sink = p.sink;
  if constexpr (M == Mutant::kSinkIgnored) sink = nullptr;
  uint16_t* out = p.out + b * p.out_batch_stride + t * p.out_token_stride + h * p.out_head_stride;
  bool has_tokens = mla::softmax_has_tokens(s);
  if constexpr (M == Mutant::kEmptyRowNaN) has_tokens = true;
  const float denom = mla::softmax_denominator(s, sink, h);
  const float rden = 1.0f / denom;
  auto value = [&](int32_t c) -> uint16_t {
    // Empty row: out = 0 whatever the sink (SPEC section 3), never 0/0.
    if (!has_tokens) return 0;
    const float o = O[layout.pos[c]];
    return mla::float_to_bf16(reciprocal ? o * rden : o / denom);
  };
  if constexpr (M == Mutant::kStorePaddedColumns) {
    for (int32_t c = 0; c < cols.width_v && out + c < call.out_end; ++c) out[c] = value(c);
  } else {
    for (int32_t d = 0; d < cols.d_v; ++d) out[d] = value(cols.col(d));
  }
  mla::Conventions conv = p.conv;
  if constexpr (M == Mutant::kSinkInLse) conv.sink_in_lse = true;
  float lse = mla::softmax_lse(s, p.sink, h, conv);
  if constexpr (M == Mutant::kLseLog2) lse *= 1.44269504f;  // log2(e) rounded to fp32
  p.lse[b * p.lse_batch_stride + t * p.lse_token_stride + h] = lse;
}

}  // namespace mlafuzz::host
