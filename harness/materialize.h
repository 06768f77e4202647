// Recipe -> exact host input buffers.
//
// Bit-identical on every machine and compiler: all randomness comes from the counter-based
// generator in rng.h (no std:: distributions), and every conversion is an integer-exact routine
// from kernels/common/fp_formats.h.
#pragma once

#include <cstdint>
#include <vector>

#include "harness/case.h"
#include "kernels/common/mla_params.h"

namespace mlafuzz {

struct MaterializedCase {
  Case recipe;               // with indices made explicit (logical positions) and stride resolved
  mla::CacheGeometry geom;   // page_stride resolved
  int32_t batch = 0, heads = 0, topk = 0;
  float sm_scale = 0;        // fp32 value the kernels receive
  double sm_scale64 = 0;     // the same value widened (the oracle uses this, not the recipe's)
  mla::Conventions conv;

  std::vector<uint16_t> q;          // [B, H, q_head_stride] bf16 bits (pad filled per recipe)
  int64_t q_head_stride = 0;        // d_qk + q_head_pad
  std::vector<uint8_t> cache;       // [num_pages * page_stride] exact layout bytes
  std::vector<int32_t> indices;     // [B, topk] physical global slots (invalid entries kept)
  std::vector<int32_t> topk_length; // [B] or empty
  std::vector<float> sink;          // [H] or empty
  int64_t out_head_stride = 0;      // d_v + out_head_pad

  int32_t d_qk() const { return mla::d_qk(geom); }
  int32_t d_v() const { return mla::d_v(geom); }

  // Params pointing at this struct's host buffers (out and lse left null).
  mla::DecodeParams host_params() const;
};

// Validates then materializes. Throws CaseError on an invalid recipe.
MaterializedCase materialize(const Case& c);

// Makes the index lists of a recipe explicit (as logical positions), resolving index_spec.
// Idempotent; used by shrinking so that every step edits explicit data.
Case with_explicit_indices(const Case& c);

// FNV-1a 64 over every input buffer, for golden-hash tests and reports.
uint64_t content_hash(const MaterializedCase& m);

}  // namespace mlafuzz
