// A tiny writer that builds MaterializedCase objects by hand for the oracle tests: keys are
// given as exact values per token, written into the layout bytes with mla::token_address (the
// loop oracle reads them back with its own addressing). Every value must be representable
// exactly (e4m3 times the tile's power-of-two scale, bf16 rope, bf16 q): the writer throws
// otherwise, so a test always knows its inputs exactly.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/materialize.h"
#include "core/rng.h"
#include "mla/fp_formats.h"
#include "mla/mla_params.h"

namespace mlafuzz::testing {

struct HandGeometry {
  mla::Layout layout = mla::Layout::kModel1;
  int32_t nope = 448, rope = 64, tile = 64, page_size = 4, num_pages = 2;
  int64_t stride_pad = 0;  // bytes added to the minimum page stride
};

class HandCase {
 public:
  HandCase(const HandGeometry& hg, int32_t batch, int32_t heads, int32_t topk) {
    mla::CacheGeometry& g = m_.geom;
    g.layout = hg.layout;
    g.nope_dim = hg.nope;
    g.rope_dim = hg.rope;
    g.scale_tile = hg.tile;
    g.page_size = hg.page_size;
    g.num_pages = hg.num_pages;
    g.page_stride = mla::min_page_stride(g) + hg.stride_pad;
    m_.batch = batch;
    m_.heads = heads;
    m_.topk = topk;
    m_.sm_scale = 1.0f;
    m_.sm_scale64 = 1.0;
    m_.q_head_stride = m_.d_qk();
    m_.out_head_stride = m_.d_v();
    m_.set_contiguous_strides();
    m_.q.assign(static_cast<size_t>(batch) * heads * m_.q_head_stride, 0);
    m_.cache.mut().assign(static_cast<size_t>(mla::cache_bytes(g)), 0);
    m_.indices.assign(static_cast<size_t>(batch) * topk, -1);
    // Scale bytes default to 2^0 so an untouched token decodes to zeros.
    for (int64_t s = 0; s < mla::num_slots(g); ++s) set_exponents(s, std::vector<int>(tiles(), 0));
  }

  int32_t tiles() const { return mla::num_scale_tiles(m_.geom); }
  int32_t d_qk() const { return m_.d_qk(); }

  void set_sm_scale(float s) {
    m_.sm_scale = s;
    m_.sm_scale64 = s;
  }

  // Tile t of token `slot` gets scale 2^exps[t] (MODEL1 ue8m0 byte exps[t] + 127; V32 fp32).
  void set_exponents(int64_t slot, const std::vector<int>& exps) {
    const mla::TokenAddress a = mla::token_address(m_.geom, slot);
    for (int32_t t = 0; t < tiles(); ++t) {
      if (m_.geom.layout == mla::Layout::kModel1) {
        m_.cache.mut()[a.scale + t] = static_cast<uint8_t>(exps[t] + 127);
      } else {
        const float s = std::ldexp(1.0f, exps[t]);
        std::memcpy(&m_.cache.mut()[a.scale + 4 * t], &s, 4);
      }
    }
  }

  // Writes K values [d_qk] of `slot` with per-tile exponents; throws unless exact.
  void set_token(int64_t slot, const std::vector<double>& k, const std::vector<int>& exps) {
    set_exponents(slot, exps);
    const mla::TokenAddress a = mla::token_address(m_.geom, slot);
    const int32_t nope = m_.geom.nope_dim;
    for (int32_t d = 0; d < nope; ++d) {
      const double unscaled = std::ldexp(k[d], -exps[d / m_.geom.scale_tile]);
      const uint8_t code = mla::float_to_e4m3_sat(static_cast<float>(unscaled));
      if (static_cast<double>(mla::e4m3_to_float(code)) != unscaled) {
        throw std::invalid_argument("K[" + std::to_string(d) + "] not exact in e4m3");
      }
      m_.cache.mut()[a.nope + d] = code;
    }
    for (int32_t r = 0; r < m_.geom.rope_dim; ++r) {
      const uint16_t bits = exact_bf16(k[nope + r]);
      m_.cache.mut()[a.rope + 2 * r] = static_cast<uint8_t>(bits & 0xff);
      m_.cache.mut()[a.rope + 2 * r + 1] = static_cast<uint8_t>(bits >> 8);
    }
  }

  // A key that is zero except for the listed (dim, value) pairs, all tiles at scale 2^exp.
  void set_sparse_token(int64_t slot, const std::vector<std::pair<int, double>>& entries,
                        int exp = 0) {
    std::vector<double> k(d_qk(), 0.0);
    for (auto [d, v] : entries) k[d] = v;
    set_token(slot, k, std::vector<int>(tiles(), exp));
  }

  void set_q(int32_t b, int32_t h, const std::vector<double>& q) {
    for (int32_t d = 0; d < d_qk(); ++d) {
      m_.q[(static_cast<int64_t>(b) * m_.heads + h) * m_.q_head_stride + d] = exact_bf16(q[d]);
    }
  }
  void set_sparse_q(int32_t b, int32_t h, const std::vector<std::pair<int, double>>& entries) {
    std::vector<double> q(d_qk(), 0.0);
    for (auto [d, v] : entries) q[d] = v;
    set_q(b, h, q);
  }

  void set_indices(int32_t b, const std::vector<int32_t>& idx) {
    for (size_t k = 0; k < idx.size(); ++k) m_.indices[b * m_.topk + k] = idx[k];
  }

  MaterializedCase& m() { return m_; }

  // bf16 bits of v; throws unless v is exactly representable (NaN allowed).
  static uint16_t exact_bf16(double v) {
    const uint16_t bits = mla::float_to_bf16(static_cast<float>(v));
    if (!std::isnan(v) && static_cast<double>(mla::bf16_to_float(bits)) != v) {
      throw std::invalid_argument("value not exact in bf16");
    }
    return bits;
  }

 private:
  MaterializedCase m_;
};

// A random case written byte by byte: random e4m3 codes (NaN codes excluded), random tile
// exponents in [exp_lo, exp_hi], random bf16 rope and q, random indices with invalid entries
// and duplicates, optional topk_length and sink (including +-inf), random conventions.
struct RandomSpec {
  HandGeometry geom;
  int32_t batch = 2, heads = 4, topk = 16;
  int exp_lo = -10, exp_hi = -5;  // keeps logits O(1): K up to 448 * 2^-5
  double invalid_fraction = 0.1, duplicate_fraction = 0.1;
  bool topk_length = false, sink = false;
  mla::Conventions conv;
  float sm_scale = 0.0f;  // 0: d_qk^-0.5 rounded to fp32
};

inline MaterializedCase random_case(const RandomSpec& spec, uint64_t seed) {
  HandCase hc(spec.geom, spec.batch, spec.heads, spec.topk);
  MaterializedCase& m = hc.m();
  m.conv = spec.conv;
  hc.set_sm_scale(spec.sm_scale != 0.0f
                      ? spec.sm_scale
                      : static_cast<float>(1.0 / std::sqrt(static_cast<double>(hc.d_qk()))));
  CounterRng rng(seed, Stream::kGenerator);
  const mla::CacheGeometry& g = m.geom;
  for (int64_t s = 0; s < mla::num_slots(g); ++s) {
    std::vector<int> exps(hc.tiles());
    for (int& e : exps) e = static_cast<int>(rng.uniform_int(spec.exp_lo, spec.exp_hi));
    hc.set_exponents(s, exps);
    const mla::TokenAddress a = mla::token_address(g, s);
    for (int32_t d = 0; d < g.nope_dim; ++d) {
      uint8_t code;
      do {
        code = static_cast<uint8_t>(rng.uniform_int(0, 255));
      } while ((code & 0x7f) == 0x7f);
      m.cache.mut()[a.nope + d] = code;
    }
    for (int32_t r = 0; r < g.rope_dim; ++r) {
      const uint16_t bits = mla::float_to_bf16(static_cast<float>(rng.normal()));
      m.cache.mut()[a.rope + 2 * r] = static_cast<uint8_t>(bits & 0xff);
      m.cache.mut()[a.rope + 2 * r + 1] = static_cast<uint8_t>(bits >> 8);
    }
  }
  for (auto& q : m.q) q = mla::float_to_bf16(static_cast<float>(rng.normal()));
  const int64_t slots = mla::num_slots(g);
  for (int32_t b = 0; b < m.batch; ++b) {
    for (int32_t k = 0; k < m.topk; ++k) {
      int32_t& idx = m.indices[b * m.topk + k];
      idx = static_cast<int32_t>(rng.uniform_int(0, slots - 1));
      if (k > 0 && rng.bernoulli(spec.duplicate_fraction)) {
        idx = m.indices[b * m.topk + rng.uniform_int(0, k - 1)];
      }
      if (rng.bernoulli(spec.invalid_fraction)) {
        idx = spec.conv.invalid_index == mla::InvalidIndexRule::kAnyNegative
                  ? -static_cast<int32_t>(rng.uniform_int(1, 1000))
                  : -1;
      }
    }
  }
  if (spec.topk_length) {
    m.topk_length.resize(m.batch);
    for (auto& l : m.topk_length) l = static_cast<int32_t>(rng.uniform_int(0, m.topk));
  }
  if (spec.sink) {
    m.sink.resize(m.heads);
    for (auto& s : m.sink) {
      const int64_t kind = rng.uniform_int(0, 9);
      s = kind == 0 ? HUGE_VALF : kind == 1 ? -HUGE_VALF : static_cast<float>(rng.normal() * 2.0);
    }
  }
  return m;
}

}  // namespace mlafuzz::testing
