// The plain-loop float64 oracle, written straight from SPEC.md sections 2 and 3 and deliberately
// independent of the Eigen oracle and of mla_params.h: its own byte addressing of both layouts,
// its own validity rule, its own softmax. It shares only the number-format decoders of
// fp_formats.h (checked separately against CUDA's conversions and a fixed table), so a bug in
// the shared addressing or masking code shows as a disagreement between the two oracles.
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/common/fp_formats.h"
#include "oracle/oracle.h"

namespace mlafuzz {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Byte offsets of one token's parts, from the layout definitions in SPEC.md section 2.
struct Where {
  int64_t nope, rope, scale;
};

struct LoopLayout {
  bool model1;
  int64_t nope, rope, tile, tiles, P, S0;

  explicit LoopLayout(const MaterializedCase& m)
      : model1(m.geom.layout == mla::Layout::kModel1),
        nope(m.geom.nope_dim),
        rope(m.geom.rope_dim),
        tile(m.geom.scale_tile),
        tiles(m.geom.scale_tile > 0 ? m.geom.nope_dim / m.geom.scale_tile : 0),
        P(m.geom.page_size),
        S0(m.geom.page_stride) {}

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

// SPEC.md 3: entry k of a row is valid when k < topk_length (if given) and the index is not
// the invalid marker: exactly -1 (FlashMLA) or any negative (SGLang, vLLM).
bool entry_valid(const MaterializedCase& m, int64_t b, int64_t k) {
  if (!m.topk_length.empty() && k >= m.topk_length[b]) return false;
  const int32_t idx = m.indices[b * m.indices_batch_stride + k];
  if (m.conv.invalid_index == mla::InvalidIndexRule::kAnyNegative) return idx >= 0;
  return idx != -1;
}

[[noreturn]] void fail(const std::string& what) {
  throw std::invalid_argument("oracle-loop: " + what);
}

// Just enough checking that no read leaves a buffer.
void check(const MaterializedCase& m, const LoopLayout& L) {
  if (m.batch < 0 || m.heads < 0 || m.topk < 0) fail("negative shape");
  if (L.P <= 0 || L.tile <= 0 || L.nope % L.tile != 0) fail("bad page size or scale tile");
  if (L.S0 < L.P * L.token_size()) fail("page stride below P * token bytes");
  const int64_t pages = m.geom.num_pages;
  if (pages < 0 || static_cast<int64_t>(m.cache.size()) < pages * L.S0) fail("cache too small");
  if (m.q_head_stride < L.nope + L.rope || m.q_batch_stride < m.heads * m.q_head_stride ||
      static_cast<int64_t>(m.q.size()) < int64_t{m.batch} * m.q_batch_stride) {
    fail("q too small");
  }
  if (m.indices_batch_stride < m.topk ||
      static_cast<int64_t>(m.indices.size()) != int64_t{m.batch} * m.indices_batch_stride) {
    fail("indices size");
  }
  if (!m.topk_length.empty() && static_cast<int64_t>(m.topk_length.size()) != m.batch) {
    fail("topk_length size");
  }
  for (int32_t len : m.topk_length) {
    if (len < 0) fail("negative topk_length");
  }
  if (!m.sink.empty() && static_cast<int64_t>(m.sink.size()) != m.heads) fail("sink size");
  for (int64_t b = 0; b < m.batch; ++b) {
    for (int64_t k = 0; k < m.topk; ++k) {
      const int64_t idx = m.indices[b * m.indices_batch_stride + k];
      if (entry_valid(m, b, k) && (idx < 0 || idx >= pages * L.P)) {
        fail("index " + std::to_string(idx) + " at [" + std::to_string(b) + "][" +
             std::to_string(k) + "] outside the cache");
      }
    }
  }
}

}  // namespace

OracleResult run_oracle_loop(const MaterializedCase& m) {
  const LoopLayout L(m);
  check(m, L);
  const int64_t B = m.batch, H = m.heads, topk = m.topk;
  const int64_t dqk = L.nope + L.rope;
  // MODEL1: V is the whole dequantized vector; V32: the nope part only.
  const int64_t dv = L.model1 ? dqk : L.nope;
  const double scale = m.sm_scale64;
  const uint8_t* cache = m.cache.data();

  OracleResult res;
  res.out.assign(B * H * dv, 0.0);
  res.lse.assign(B * H, 0.0);
  std::vector<double> x(topk), acc(dv);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const uint16_t* q = m.q.data() + b * m.q_batch_stride + h * m.q_head_stride;
      double* out = res.out.data() + (b * H + h) * dv;
      double& lse = res.lse[b * H + h];
      // Logits x_k = sm_scale * <q, K_k>; the row max m of the valid ones.
      double mx = -kInf;
      bool any = false, nan = false;
      for (int64_t k = 0; k < topk; ++k) {
        if (!entry_valid(m, b, k)) continue;
        const Where w = L.locate(m.indices[b * m.indices_batch_stride + k]);
        double dot = 0;
        for (int64_t d = 0; d < dqk; ++d) dot += mla::bf16_to_float(q[d]) * key(L, cache, w, d);
        x[k] = scale * dot;
        nan = nan || std::isnan(x[k]);
        if (!any || x[k] > mx) mx = x[k];
        any = true;
      }
      if (!any) {
        // No valid entry: out stays 0; lse is the convention's infinity, sink or not.
        lse = m.conv.empty_lse == mla::EmptyRowLse::kPosInf ? kInf : -kInf;
        continue;
      }
      if (nan) mx = std::numeric_limits<double>::quiet_NaN();  // NaN inputs give a NaN row
      // l = sum exp(x_k - m) and acc = sum exp(x_k - m) V_k; duplicates are separate entries.
      double l = 0;
      for (int64_t d = 0; d < dv; ++d) acc[d] = 0;
      for (int64_t k = 0; k < topk; ++k) {
        if (!entry_valid(m, b, k)) continue;
        const Where w = L.locate(m.indices[b * m.indices_batch_stride + k]);
        const double p = std::exp(x[k] - mx);
        l += p;
        for (int64_t d = 0; d < dv; ++d) acc[d] += p * key(L, cache, w, d);
      }
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
  }
  return res;
}

}  // namespace mlafuzz
