// The plain-loop float64 oracle, written straight from docs/SPEC.md sections 2 and 3 and
// deliberately independent of the Eigen oracle and of mla_params.h: its own byte addressing of both
// layouts, its own validity rule, its own softmax. It shares only the number-format decoders of
// fp_formats.h (checked separately against CUDA's conversions and a fixed table), so a bug in
// the shared addressing or masking code shows as a disagreement between the two oracles.
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "mla/fp_formats.h"
#include "oracle/oracle.h"

namespace mlafuzz {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Byte offsets of one token's parts, from the layout definitions in docs/SPEC.md section 2.
struct Where {
  int64_t nope, rope, scale;
};

struct LoopLayout {
  bool model1;
  int64_t nope, rope, tile, tiles, P, S0;

  explicit LoopLayout(const mla::CacheGeometry& g)
      : model1(g.layout == mla::Layout::kModel1),
        nope(g.nope_dim),
        rope(g.rope_dim),
        tile(g.scale_tile),
        tiles(g.scale_tile > 0 ? g.nope_dim / g.scale_tile : 0),
        P(g.page_size),
        S0(g.page_stride) {}

  // MODEL1 page: P data rows (nope e4m3 then rope bf16), then P scale rows of `tiles` ue8m0
  // bytes padded to a multiple of 8 (7 scales + 1 pad byte for 448/64).
  int64_t data_row() const { return nope + 2 * rope; }
  int64_t scale_row() const { return (tiles + 7) / 8 * 8; }
  // V32 token: nope e4m3, then `tiles` fp32 scales, then rope bf16, all together.
  int64_t v32_token() const { return nope + 4 * tiles + 2 * rope; }
  int64_t token_size() const { return model1 ? data_row() + scale_row() : v32_token(); }

  Where locate(int64_t idx) const {
    const int64_t page = idx / P, j = idx % P;
    const int64_t base = page * S0;
    if (model1) {
      return {base + j * data_row(), base + j * data_row() + nope,
              base + P * data_row() + j * scale_row()};
    }
    const int64_t t = base + j * v32_token();
    return {t, t + nope + 4 * tiles, t + nope};
  }
};

uint16_t load_u16_le(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t load_u32_le(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// Dequantized key of the token at w, dimension d in [0, nope + rope), exactly in float64.
double key(const LoopLayout& L, const uint8_t* cache, const Where& w, int64_t d) {
  if (d >= L.nope) return mla::bf16_to_float(load_u16_le(cache + w.rope + 2 * (d - L.nope)));
  const int64_t t = d / L.tile;
  const double scale = L.model1 ? mla::ue8m0_to_float(cache[w.scale + t])
                                : mla::bits_to_float(load_u32_le(cache + w.scale + 4 * t));
  return static_cast<double>(mla::e4m3_to_float(cache[w.nope + d])) * scale;
}

// One cache and its index lists (docs/SPEC.md section 8: the main cache, or the extra cache).
struct LoopCache {
  LoopLayout L;
  const SharedVector<uint8_t>* bytes;
  int64_t pages;
  const std::vector<int32_t>* indices;  // [B, s_q, topk], list (b, s) at b*bstride + s*tstride
  const std::vector<int32_t>* lengths;  // [B] or empty
  int64_t topk, tstride, bstride;
  const char* name;
};

// docs/SPEC.md 3: entry k of a list is valid when k < its topk_length (if given) and the index is
// not invalid: exactly -1 (FlashMLA), any negative (SGLang, vLLM), or any index outside the
// cache's slots (out_of_range).
int32_t entry(const LoopCache& c, int64_t b, int64_t s, int64_t k) {
  return (*c.indices)[b * c.bstride + s * c.tstride + k];
}

bool entry_valid(const MaterializedCase& m, const LoopCache& c, int64_t b, int64_t s, int64_t k) {
  if (!c.lengths->empty() && k >= (*c.lengths)[b]) return false;
  const int32_t idx = entry(c, b, s, k);
  if (m.conv.invalid_index == mla::InvalidIndexRule::kAnyNegative) return idx >= 0;
  if (m.conv.invalid_index == mla::InvalidIndexRule::kOutOfRange) {
    return idx >= 0 && idx < c.L.P * c.pages;
  }
  return idx != -1;
}

[[noreturn]] void fail(const std::string& what) {
  throw std::invalid_argument("oracle-loop: " + what);
}

// Just enough checking that no read leaves a buffer.
void check(const MaterializedCase& m, const std::vector<LoopCache>& caches) {
  if (m.batch < 0 || m.heads < 0 || m.topk < 0 || m.s_q < 1) fail("bad shape");
  const LoopLayout& L = caches[0].L;
  if (m.q_head_stride < L.nope + L.rope ||
      static_cast<int64_t>(m.q.size()) < (m.batch - 1) * m.q_batch_stride +
                                             (m.s_q - 1) * m.q_token_stride +
                                             (m.heads - 1) * m.q_head_stride + L.nope + L.rope) {
    fail("q too small");
  }
  if (!m.sink.empty() && static_cast<int64_t>(m.sink.size()) != m.heads) fail("sink size");
  for (const LoopCache& c : caches) {
    const LoopLayout& l = c.L;
    if (l.P <= 0 || l.tile <= 0 || l.nope % l.tile != 0) fail("bad page size or scale tile");
    if (l.S0 < l.P * l.token_size()) fail("page stride below P * token bytes");
    if (c.pages < 0 || static_cast<int64_t>(c.bytes->size()) < c.pages * l.S0) {
      fail(std::string(c.name) + ": cache too small");
    }
    if (c.topk < 0 || static_cast<int64_t>(c.indices->size()) <
                          (m.batch - 1) * c.bstride + (m.s_q - 1) * c.tstride + c.topk) {
      fail(std::string(c.name) + " size");
    }
    if (!c.lengths->empty() && static_cast<int64_t>(c.lengths->size()) != m.batch) {
      fail(std::string(c.name) + ": topk_length size");
    }
    for (int32_t len : *c.lengths) {
      if (len < 0) fail("negative topk_length");
    }
    for (int64_t b = 0; b < m.batch; ++b) {
      for (int64_t s = 0; s < m.s_q; ++s) {
        for (int64_t k = 0; k < c.topk; ++k) {
          const int64_t idx = entry(c, b, s, k);
          if (entry_valid(m, c, b, s, k) && (idx < 0 || idx >= c.pages * l.P)) {
            fail("index " + std::to_string(idx) + " at " + c.name + "[" + std::to_string(b) + "][" +
                 std::to_string(s) + "][" + std::to_string(k) + "] outside the cache");
          }
        }
      }
    }
  }
}

// The main cache and, when the case has one, the extra cache, as the loops read them.
std::vector<LoopCache> loop_caches(const MaterializedCase& m) {
  std::vector<LoopCache> caches;
  caches.push_back({LoopLayout(m.geom), &m.cache.vec(), m.geom.num_pages, &m.indices,
                    &m.topk_length, m.topk, m.indices_token_stride, m.indices_batch_stride,
                    "indices"});
  if (m.has_extra) {
    caches.push_back({LoopLayout(m.extra_geom), &m.extra_cache.vec(), m.extra_geom.num_pages,
                      &m.extra_indices, &m.extra_topk_length, m.extra_topk,
                      m.extra_indices_token_stride, m.extra_indices_batch_stride, "extra_indices"});
  }
  return caches;
}

// The dequantized keys of row (b, s)'s valid entries, list by list: keys[list][k * dqk + d] is
// key(d) of entry k (what `key` returns), left unset for an invalid entry. Every head of the row
// reads the same keys, so they are decoded once per row rather than once per head.
void row_keys(const MaterializedCase& m, const std::vector<LoopCache>& caches, int64_t b, int64_t s,
              int64_t dqk, std::vector<std::vector<double>>& keys) {
  for (size_t c = 0; c < caches.size(); ++c) {
    const LoopCache& C = caches[c];
    for (int64_t k = 0; k < C.topk; ++k) {
      if (!entry_valid(m, C, b, s, k)) continue;
      const Where w = C.L.locate(entry(C, b, s, k));
      double* row = keys[c].data() + k * dqk;
      for (int64_t d = 0; d < dqk; ++d) row[d] = key(C.L, C.bytes->data(), w, d);
    }
  }
}

// Logits x_k = sm_scale * <q, K_k> over T(b, s): the valid entries of every list (a token in two
// lists counts twice), stored in x[list][k]; K_k from row_keys. Returns false when no entry is
// valid; otherwise mx is their max, NaN when any logit is NaN.
bool row_logits(const MaterializedCase& m, const std::vector<LoopCache>& caches, const uint16_t* q,
                int64_t b, int64_t s, int64_t dqk, const std::vector<std::vector<double>>& keys,
                std::vector<std::vector<double>>& x, double& mx) {
  const double scale = m.sm_scale64;
  mx = -kInf;
  bool any = false, nan = false;
  for (size_t c = 0; c < caches.size(); ++c) {
    const LoopCache& C = caches[c];
    for (int64_t k = 0; k < C.topk; ++k) {
      if (!entry_valid(m, C, b, s, k)) continue;
      const double* K = keys[c].data() + k * dqk;
      double dot = 0;
      for (int64_t d = 0; d < dqk; ++d) dot += mla::bf16_to_float(q[d]) * K[d];
      double& xk = x[c][static_cast<size_t>(k)];
      xk = scale * dot;
      nan = nan || std::isnan(xk);
      if (!any || xk > mx) mx = xk;
      any = true;
    }
  }
  if (nan) mx = std::numeric_limits<double>::quiet_NaN();  // NaN inputs give a NaN row
  return any;
}

// Returns l = sum exp(x_k - mx) and sets acc = sum exp(x_k - mx) V_k over the valid entries of
// row (b, s), list by list (V_k: the first dv of row_keys' K_k); duplicates are separate entries.
double row_weighted_sum(const MaterializedCase& m, const std::vector<LoopCache>& caches, int64_t b,
                        int64_t s, int64_t dqk, int64_t dv,
                        const std::vector<std::vector<double>>& keys,
                        const std::vector<std::vector<double>>& x, double mx,
                        std::vector<double>& acc) {
  double l = 0;
  for (int64_t d = 0; d < dv; ++d) acc[d] = 0;
  for (size_t c = 0; c < caches.size(); ++c) {
    const LoopCache& C = caches[c];
    for (int64_t k = 0; k < C.topk; ++k) {
      if (!entry_valid(m, C, b, s, k)) continue;
      const double* V = keys[c].data() + k * dqk;
      const double p = std::exp(x[c][static_cast<size_t>(k)] - mx);
      l += p;
      for (int64_t d = 0; d < dv; ++d) acc[d] += p * V[d];
    }
  }
  return l;
}

// Writes out = acc / (l + sink term) and the row's lse, folding head h's sink in as the case's
// conventions say.
void finish_row(const MaterializedCase& m, int64_t h, double l, double mx,
                const std::vector<double>& acc, int64_t dv, double* out, double& lse) {
  // Sink: exp(sink) on the same shifted scale. -inf (or absent) contributes nothing;
  // +inf makes the output exactly 0 (and the folded lse +inf).
  const bool has_sink = !m.sink.empty();
  const double sink = has_sink ? m.sink[h] : -kInf;
  if (sink == kInf) {
    for (int64_t d = 0; d < dv; ++d) out[d] = 0;
  } else {
    const double denom = l + (sink == -kInf ? 0.0 : std::exp(sink - mx));
    for (int64_t d = 0; d < dv; ++d) out[d] = acc[d] / denom;
  }
  if (m.conv.sink_in_lse && has_sink && sink != -kInf) {
    if (sink == kInf) {
      lse = kInf;
    } else if (sink > mx) {
      lse = sink + std::log(l * std::exp(mx - sink) + 1.0);
    } else {
      lse = mx + std::log(l + std::exp(sink - mx));
    }
  } else {
    lse = mx + std::log(l);
  }
}

}  // namespace

OracleResult run_oracle_loop(const MaterializedCase& m) {
  const std::vector<LoopCache> caches = loop_caches(m);
  check(m, caches);
  const LoopLayout& L = caches[0].L;
  const int64_t B = m.batch, H = m.heads, S = m.s_q;
  const int64_t dqk = L.nope + L.rope;
  // MODEL1: V is the whole dequantized vector; V32: the nope part only.
  const int64_t dv = L.model1 ? dqk : L.nope;

  OracleResult res;
  res.out.assign(B * S * H * dv, 0.0);
  res.lse.assign(B * S * H, 0.0);
  std::vector<std::vector<double>> x(caches.size()), keys(caches.size());
  for (size_t c = 0; c < caches.size(); ++c) {
    x[c].resize(static_cast<size_t>(caches[c].topk));
    keys[c].resize(static_cast<size_t>(caches[c].topk * dqk));
  }
  std::vector<double> acc(dv);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) {
      row_keys(m, caches, b, s, dqk, keys);
      for (int64_t h = 0; h < H; ++h) {
        const uint16_t* q =
            m.q.data() + b * m.q_batch_stride + s * m.q_token_stride + h * m.q_head_stride;
        const int64_t row = (b * S + s) * H + h;
        double* out = res.out.data() + row * dv;
        double& lse = res.lse[row];
        double mx;
        if (!row_logits(m, caches, q, b, s, dqk, keys, x, mx)) {
          // No valid entry: out stays 0; lse is the convention's infinity, sink or not.
          lse = m.conv.empty_lse == mla::EmptyRowLse::kPosInf ? kInf : -kInf;
          continue;
        }
        const double l = row_weighted_sum(m, caches, b, s, dqk, dv, keys, x, mx, acc);
        finish_row(m, h, l, mx, acc, dv, out, lse);
      }
    }
  }
  return res;
}

}  // namespace mlafuzz
