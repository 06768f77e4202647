// Helpers of the host-model tests: random recipes over the whole envelope, sub-cases (one batch
// row, one head), poisoning of every byte a correct kernel must not read, and raw-bit equality.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/case.h"
#include "core/materialize.h"
#include "core/rng.h"
#include "mla/mla_params.h"

namespace mlafuzz::testing {

template <typename T>
const T& pick(CounterRng& rng, const std::vector<T>& v) {
  return v[static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(v.size()) - 1))];
}

// A random recipe: both layouts (and non-production dims), page sizes 1, 2, 61, 64, 69, 256 and
// random ones, padded strides, shuffled pages, B, H (incl. 33 and 64), topk incl. non-multiples
// of 64, invalid entries and duplicates, topk_length, sinks incl. +-inf, every convention, q/out
// head padding, every pad fill. Values stay where fp32 cannot overflow (no bf16-max q).
inline Case random_recipe(CounterRng& rng) {
  Case c;
  c.name = "host-model-random";
  mla::CacheGeometry& g = c.geom;
  const int64_t shape = rng.uniform_int(0, 9);
  if (shape < 6) {  // MODEL1 production dims
    g.layout = mla::Layout::kModel1;
  } else if (shape < 9) {  // V32 production dims
    g.layout = mla::Layout::kV32;
    g.nope_dim = 512;
    g.scale_tile = 128;
  } else {  // other dims: MODEL1 192 + 32 (padded to 256), V32 256 + 16
    g.layout = rng.bernoulli(0.5) ? mla::Layout::kModel1 : mla::Layout::kV32;
    g.nope_dim = g.layout == mla::Layout::kModel1 ? 192 : 256;
    g.rope_dim = g.layout == mla::Layout::kModel1 ? 32 : 16;
    g.scale_tile = g.layout == mla::Layout::kModel1 ? 64 : 128;
  }
  g.page_size = static_cast<int32_t>(
      rng.bernoulli(0.2) ? rng.uniform_int(1, 100) : pick<int64_t>(rng, {1, 2, 61, 64, 69, 256}));
  const int64_t max_pages = std::max<int64_t>(1, 1200 / g.page_size);
  g.num_pages = static_cast<int32_t>(rng.uniform_int(1, std::min<int64_t>(max_pages, 40)));
  g.page_stride = rng.bernoulli(0.5) ? 0 : mla::min_page_stride(g) + rng.uniform_int(1, 3000);
  if (rng.bernoulli(0.5)) {
    c.page_order.resize(static_cast<size_t>(g.num_pages));
    for (int32_t i = 0; i < g.num_pages; ++i) c.page_order[static_cast<size_t>(i)] = i;
    for (int32_t i = g.num_pages - 1; i > 0; --i) {
      std::swap(c.page_order[static_cast<size_t>(i)],
                c.page_order[static_cast<size_t>(rng.uniform_int(0, i))]);
    }
  }
  c.batch = static_cast<int32_t>(pick<int64_t>(rng, {1, 1, 2, 3, 5}));
  c.heads = static_cast<int32_t>(pick<int64_t>(rng, {1, 2, 3, 8, 33, 64}));
  c.topk =
      static_cast<int32_t>(rng.bernoulli(0.3) ? rng.uniform_int(1, 300)
                                              : pick<int64_t>(rng, {1, 63, 64, 65, 128, 200, 512}));
  c.index_spec.rule =
      pick<IndexRule>(rng, {IndexRule::kRandom, IndexRule::kSequential, IndexRule::kPageRuns});
  c.index_spec.invalid_fraction = pick<double>(rng, {0.0, 0.0, 0.1, 0.5, 1.0});
  c.index_spec.duplicate_fraction = pick<double>(rng, {0.0, 0.1});
  if (rng.bernoulli(0.3)) {
    c.topk_length = std::vector<int32_t>(static_cast<size_t>(c.batch));
    for (auto& l : *c.topk_length) l = static_cast<int32_t>(rng.uniform_int(0, c.topk));
  }
  if (rng.bernoulli(0.3)) {
    c.sink = std::vector<double>(static_cast<size_t>(c.heads));
    for (auto& s : *c.sink) {
      const int64_t kind = rng.uniform_int(0, 9);
      s = kind == 0 ? HUGE_VAL : kind == 1 ? -HUGE_VAL : rng.normal() * 2.0;
    }
  }
  c.conventions.invalid_index = rng.bernoulli(0.5) ? mla::InvalidIndexRule::kMinusOneOnly
                                                   : mla::InvalidIndexRule::kAnyNegative;
  c.conventions.empty_lse =
      rng.bernoulli(0.5) ? mla::EmptyRowLse::kPosInf : mla::EmptyRowLse::kNegInf;
  c.conventions.sink_in_lse = rng.bernoulli(0.3);
  c.q_head_pad = rng.bernoulli(0.3) ? static_cast<int32_t>(rng.uniform_int(1, 16)) : 0;
  c.out_head_pad = rng.bernoulli(0.3) ? static_cast<int32_t>(rng.uniform_int(1, 16)) : 0;
  c.q_values.dist =
      pick<ValueDist>(rng, {ValueDist::kNormal, ValueDist::kUniform, ValueDist::kSmallInt});
  c.q_values.magnitude = pick<double>(rng, {0.25, 1.0, 1.0, 4.0});
  c.kv_values.dist = pick<ValueDist>(rng, {ValueDist::kNormal, ValueDist::kUniform});
  c.kv_values.magnitude = pick<double>(rng, {0.5, 1.0, 2.0});
  c.kv_values.special_fraction = pick<double>(rng, {0.0, 0.0, 0.05});
  c.rope_values.magnitude = pick<double>(rng, {0.5, 1.0});
  if (rng.bernoulli(0.3)) {
    c.scales.mode = ScaleMode::kRandom;
    c.scales.exp_lo = 120;
    c.scales.exp_hi = 128;
  }
  c.pad_fill = pick<Fill>(rng, {Fill::kZero, Fill::kNaN, Fill::kGarbage});
  c.data_seed = rng.next();
  return c;
}

// The sub-case made of batch rows [b0, b0 + nb) (same cache, sinks and conventions).
inline MaterializedCase slice_batch(const MaterializedCase& m, int32_t b0, int32_t nb) {
  MaterializedCase s = m;
  const int64_t q_row = m.q_batch_stride, i_row = m.indices_batch_stride;
  s.batch = nb;
  s.recipe.batch = nb;
  s.q.assign(m.q.begin() + b0 * q_row, m.q.begin() + (b0 + nb) * q_row);
  s.indices.assign(m.indices.begin() + b0 * i_row, m.indices.begin() + (b0 + nb) * i_row);
  if (!m.topk_length.empty()) {
    s.topk_length.assign(m.topk_length.begin() + b0, m.topk_length.begin() + b0 + nb);
  }
  return s;
}

// The sub-case made of heads [h0, h0 + nh) of every batch row.
inline MaterializedCase slice_heads(const MaterializedCase& m, int32_t h0, int32_t nh) {
  MaterializedCase s = m;
  s.heads = nh;
  s.recipe.heads = nh;
  // The row gaps keep their size; each batch stride loses the heads left out.
  const int64_t q_gap = m.q_batch_stride - int64_t{m.heads} * m.q_head_stride;
  s.q_batch_stride = int64_t{nh} * m.q_head_stride + q_gap;
  s.out_batch_stride = m.out_batch_stride - int64_t{m.heads - nh} * m.out_head_stride;
  s.lse_batch_stride = m.lse_batch_stride - (m.heads - nh);
  s.q.clear();
  for (int32_t b = 0; b < m.batch; ++b) {
    const auto row = m.q.begin() + b * m.q_batch_stride;
    const auto first = row + h0 * m.q_head_stride;
    s.q.insert(s.q.end(), first, first + int64_t{nh} * m.q_head_stride);
    s.q.insert(s.q.end(), row + m.heads * m.q_head_stride, row + m.q_batch_stride);
  }
  if (!m.sink.empty()) s.sink.assign(m.sink.begin() + h0, m.sink.begin() + h0 + nh);
  s.set_contiguous_strides();
  return s;
}

// Output bits of head h in batch row b ([d_v] elements) and its lse bits.
inline std::vector<uint16_t> head_out_bits(const MaterializedCase& m, const RunResult& r, int32_t b,
                                           int32_t h) {
  const int64_t at = OutputBuffers::kGuard + b * m.out_batch_stride + h * m.out_head_stride;
  return {r.out_raw.begin() + at, r.out_raw.begin() + at + m.d_v()};
}
inline uint32_t head_lse_bits(const MaterializedCase& m, const RunResult& r, int32_t b, int32_t h) {
  uint32_t u;
  std::memcpy(
      &u, &r.lse_raw[static_cast<size_t>(OutputBuffers::kGuard + b * m.lse_batch_stride + h)], 4);
  return u;
}

// Replaces every cache byte that no valid entry reads (page padding, unselected tokens, tokens
// of masked entries, the unused MODEL1 scale byte) with `poison` (or random bytes when
// poison < 0), every q element past d_qk with a NaN, every masked index with another value the
// kernel must ignore (another negative under kAnyNegative, a random slot past topk_length).
inline void poison_unread(MaterializedCase& m, int poison, uint64_t seed) {
  const mla::CacheGeometry& g = m.geom;
  std::vector<uint8_t> read(m.cache.size(), 0);
  auto mark = [&](int64_t at, int64_t len) {
    std::fill(read.begin() + at, read.begin() + at + len, uint8_t{1});
  };
  const int32_t tiles = mla::num_scale_tiles(g);
  for (int32_t b = 0; b < m.batch; ++b) {
    const int32_t len = m.topk_length.empty() ? -1 : m.topk_length[static_cast<size_t>(b)];
    for (int32_t s = 0; s < m.s_q; ++s) {
      for (int32_t k = 0; k < m.topk; ++k) {
        const int32_t idx = m.index_at(b, s, k);
        if (!mla::index_valid(idx, k, len, m.conv)) continue;
        const mla::TokenAddress a = mla::token_address(g, idx);
        mark(a.nope, g.nope_dim);
        mark(a.rope, 2 * int64_t{g.rope_dim});
        mark(a.scale, g.layout == mla::Layout::kModel1 ? tiles : 4 * tiles);
      }
    }
  }
  CounterRng rng(seed, Stream::kPoison);
  CacheBytes::Vector& cache = m.cache.mut();
  for (size_t i = 0; i < cache.size(); ++i) {
    if (!read[i]) cache[i] = static_cast<uint8_t>(poison >= 0 ? poison : rng.next() & 0xff);
  }
  for (size_t i = 0; i < m.q.size(); ++i) {
    const int64_t in_row = static_cast<int64_t>(i) % m.q_batch_stride;
    const int64_t in_token = in_row % m.q_token_stride;
    if (in_row >= m.s_q * m.q_token_stride || in_token >= m.heads * m.q_head_stride ||
        in_token % m.q_head_stride >= m.d_qk()) {
      m.q[i] = 0x7fc1;
    }
  }
  const int64_t slots = mla::num_slots(g);
  for (int32_t b = 0; b < m.batch; ++b) {
    const int32_t len = m.topk_length.empty() ? -1 : m.topk_length[static_cast<size_t>(b)];
    for (int32_t s = 0; s < m.s_q; ++s) {
      for (int32_t k = 0; k < m.topk; ++k) {
        int32_t& idx = m.indices[static_cast<size_t>(b * m.indices_batch_stride +
                                                     s * m.indices_token_stride + k)];
        if (mla::index_valid(idx, k, len, m.conv)) continue;
        if (len >= 0 && k >= len && idx >= 0) {
          idx = static_cast<int32_t>(rng.uniform_int(0, slots - 1));
        } else if (m.conv.invalid_index == mla::InvalidIndexRule::kAnyNegative) {
          idx = -static_cast<int32_t>(rng.uniform_int(1, 1 << 30));
        }
      }
    }
  }
}

inline bool same_bits(const RunResult& a, const RunResult& b) {
  return a.out_raw == b.out_raw && a.lse_raw.size() == b.lse_raw.size() &&
         std::memcmp(a.lse_raw.data(), b.lse_raw.data(), a.lse_raw.size() * sizeof(float)) == 0;
}

}  // namespace mlafuzz::testing
