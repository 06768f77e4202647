// Recipe -> exact host input buffers.
//
// Bit-identical on every machine and compiler: all randomness comes from the counter-based
// generator in rng.h (no std:: distributions), and every conversion is an integer-exact routine
// from kernels/common/fp_formats.h.
#pragma once

#include <cstdint>
#include <vector>

#include "harness/core/case.h"
#include "harness/core/shared_arena.h"
#include "kernels/common/mla_params.h"

namespace mlafuzz {

struct MaterializedCase {
  Case recipe;              // with indices made explicit (logical positions) and stride resolved
  mla::CacheGeometry geom;  // page_stride resolved
  int32_t batch = 0, heads = 0, topk = 0;
  float sm_scale = 0;     // fp32 value the kernels receive
  double sm_scale64 = 0;  // the same value widened (the oracle uses this, not the recipe's)
  mla::Conventions conv;

  // Every buffer is strided as the kernels see it; the gaps are filled per the recipe's pad_fill
  // (and poisoned by the poison property). Every stride must be set (>= its minimum). q and the
  // cache live in the shared arena (harness/core/shared_arena.h) when it is on, so that worker
  // processes read them without a copy.
  SharedVector<uint16_t> q;          // [B, q_batch_stride] bf16 bits, heads q_head_stride apart
  int64_t q_head_stride = 0;         // d_qk + q_head_pad
  int64_t q_batch_stride = 0;        // H * q_head_stride + q_batch_pad
  SharedVector<uint8_t> cache;       // [num_pages * page_stride] exact layout bytes
  std::vector<int32_t> indices;      // [B, indices_batch_stride] physical global slots
  int64_t indices_batch_stride = 0;  // topk + indices_row_pad
  std::vector<int32_t> topk_length;  // [B] or empty
  std::vector<float> sink;           // [H] or empty
  int64_t out_head_stride = 0;       // d_v + out_head_pad
  int64_t out_batch_stride = 0;      // H * out_head_stride + out_batch_pad
  int64_t lse_batch_stride = 0;      // H + lse_row_pad

  int32_t d_qk() const { return mla::d_qk(geom); }
  int32_t d_v() const { return mla::d_v(geom); }
  // Index entry k of row b, q element d of (b, h): the strided addressing in one place.
  int32_t index_at(int64_t b, int64_t k) const {
    return indices[static_cast<size_t>(b * indices_batch_stride + k)];
  }
  const uint16_t* q_row(int64_t b, int64_t h) const {
    return q.data() + b * q_batch_stride + h * q_head_stride;
  }
  // Sets the four batch strides to their contiguous minimum (for hand-built cases), keeping the
  // head strides; the buffers are not resized.
  void set_contiguous_batch_strides() {
    q_batch_stride = int64_t{heads} * q_head_stride;
    indices_batch_stride = topk;
    out_batch_stride = int64_t{heads} * out_head_stride;
    lse_batch_stride = heads;
  }

  // Params pointing at this struct's host buffers (out and lse left null).
  mla::DecodeParams host_params() const;
};

// Validates then materializes. Throws CaseError on an invalid recipe.
MaterializedCase materialize(const Case& c);

// Makes the index lists of a recipe explicit (as logical positions), resolving index_spec.
// Idempotent; used by shrinking so that every step edits explicit data.
Case with_explicit_indices(const Case& c);

// FNV-1a 64 over every input buffer and the scalar fields, for golden-hash tests and reports.
uint64_t content_hash(const MaterializedCase& m);

// ---- The pieces of materialization, exposed so that tests can check each independently ----

// Logical index lists [batch][topk] generated from the recipe's index_spec (the explicit lists
// when the recipe has them). Deterministic: CounterRng(data_seed, kIndices, b) per row.
std::vector<std::vector<int32_t>> generate_indices(const Case& c);

// Physical global slot of logical token position t: page_order[t / P] * P + t % P (identity
// when page_order is empty). Negative (invalid) entries are returned unchanged.
int64_t physical_slot(const Case& c, int64_t logical);

// The value element d of logical token t holds before quantization (d < nope_dim: drawn from
// kv_values; otherwise rope element d - nope_dim drawn from rope_values, before bf16 rounding).
// Values belong to logical tokens, so relocating pages never changes them.
float kv_source_value(const Case& c, int64_t logical_token, int32_t d);
// q[b][h][d] before bf16 rounding.
float q_source_value(const Case& c, int32_t b, int32_t h, int32_t d);

// The ue8m0 exponent the production writer stores for a tile whose largest magnitude is amax:
// 127 + ceil(log2(amax / 448)) computed exactly, clamped to [1, 254]; 127 when amax == 0.
int writer_exponent(float amax);

}  // namespace mlafuzz
