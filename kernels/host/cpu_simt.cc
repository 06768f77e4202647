// cpu-simt: host model of the SIMT per-head kernel (kernels/cuda/simt_per_head.cu; docs/SPEC.md
// section 4, first pipeline), operation for operation.
//
// Per (batch row, query token, head), tiles of mla::kSimtTokenTile = 32 tokens (a warp's lanes);
// with an extra cache (docs/SPEC.md section 8) the extra list's tiles follow the main list's in the
// same online softmax:
// - q * sm_scale rounded to fp32 once, in the padded column layout (padded columns zero).
// - logit of token j: 32 lanes, lane l owns the 8-column units l, l + 32, ... and accumulates
//   q * K with fp32 FMAs in column order; then the butterfly warp sum (xor 16, 8, 4, 2, 1). K is
//   dequantized to fp32 exactly as the kernel does (e4m3 * scale). Masked tokens: -inf.
// - tile max, softmax_advance, p_j = exp(x_j - m) (exactly 0 for masked tokens), the tile's
//   row sum by the same butterfly over the 32 lanes, l += it; O *= alpha.
// - P*V: every column accumulates fma(p_j, V_j, O) over the tile's valid tokens in order.
// - out = bf16(O / (l + exp(sink - m))), lse = m + log(l).
// The only differences from the kernel's bits are libm's expf/logf against CUDA's (a few ulps)
// and the sign of a zero logit (the kernel skips padded units, the model adds +0 * +0 there),
// which no output can show. K and V are decoded once per batch row and shared by the heads (the
// kernel re-reads them per head and gets the same values).
#include <cmath>

#include "kernels/host/host_models.h"
#include "kernels/host/host_pipeline.h"
#include "mla/tiling.h"

namespace mlafuzz {
namespace host {
namespace {

constexpr int32_t kWarp = 32;
constexpr int32_t kUnit = 8;  // columns per lane step (one 8-byte fp8 / 16-byte rope smem read)

// The warp's column order: pass i holds units [32 i, 32 i + n_i) as [column in unit][lane], so
// lane l's FMAs for column j of its unit are contiguous across lanes (vectorizable).
struct WarpColumns {
  ColumnLayout layout;
  std::vector<int32_t> lanes;  // [passes] lanes holding a unit in the pass
};

WarpColumns warp_columns(const PaddedColumns& cols) {
  WarpColumns w;
  const int32_t units = (cols.dkp + kUnit - 1) / kUnit;
  for (int32_t u0 = 0; u0 < units; u0 += kWarp) w.lanes.push_back(std::min(kWarp, units - u0));
  w.layout.width = units * kUnit;
  w.layout.pos.resize(static_cast<size_t>(cols.dkp));
  for (int32_t c = 0; c < cols.dkp; ++c) {
    const int32_t u = c / kUnit, j = c % kUnit, pass = u / kWarp, lane = u % kWarp;
    const int32_t n = w.lanes[static_cast<size_t>(pass)];
    w.layout.pos[static_cast<size_t>(c)] = pass * kWarp * kUnit + j * n + lane;
  }
  return w;
}

// Butterfly sum of 32 lane values as __shfl_xor_sync gives it (every lane ends with lane 0's).
inline float warp_sum(float (&v)[kWarp]) {
  for (int32_t off = kWarp / 2; off > 0; off /= 2) {
    for (int32_t l = 0; l < off; ++l) v[l] += v[l + off];
  }
  return v[0];
}

float warp_dot(const float* __restrict q, const float* __restrict k, const WarpColumns& w) {
  float acc[kWarp] = {};
  int32_t base = 0;
  for (const int32_t n : w.lanes) {
    for (int32_t j = 0; j < kUnit; ++j) {
      const float* __restrict qj = q + base + j * n;
      const float* __restrict kj = k + base + j * n;
      for (int32_t l = 0; l < n; ++l) acc[l] = std::fma(qj[l], kj[l], acc[l]);
    }
    base += kUnit * n;
  }
  return warp_sum(acc);
}

struct SimtScratch {
  DecodedRow row;
  DecodedRow extra;      // the token's extra list (docs/SPEC.md section 8)
  std::vector<float> q;  // [width] q * sm_scale of one head, warp column order
  std::vector<float> o;  // [width] fp32 output accumulator, warp column order
};

// Folds tokens [k0, k0 + 32) (those < topk) into one head's state and accumulator.
template <Mutant M>
void fold_tile(const DecodedRow& row, const WarpColumns& w, int32_t k0, int32_t topk,
               const float* q, mla::SoftmaxState& s, float* __restrict O) {
  const int32_t width = w.layout.width;
  float x[kWarp], p[kWarp], terms[kWarp];
  float tile_max = mla::neg_inf();
  for (int32_t j = 0; j < kWarp; ++j) {
    const int32_t k = k0 + j;
    const bool valid = k < topk && row.valid[k];
    x[j] = valid ? warp_dot(q, row.kv.data() + static_cast<size_t>(k) * width, w) : mla::neg_inf();
    tile_max = x[j] > tile_max ? x[j] : tile_max;  // NaN logits are skipped, as fmaxf does
  }
  const float alpha = advance<M>(s, tile_max);
  for (int32_t j = 0; j < kWarp; ++j) {
    p[j] = weight(s, x[j]);
    terms[j] = row_sum_term<M>(p[j]);
  }
  s.l += warp_sum(terms);
  if constexpr (M != Mutant::kNoRescale) {
    if (alpha != 1.0f) {  // x * 1 == x bit for bit: skipping is exact
      for (int32_t c = 0; c < width; ++c) O[c] *= alpha;
    }
  }
  for (int32_t j = 0; j < kWarp; ++j) {
    const int32_t k = k0 + j;
    if (k >= topk || !row.valid[k]) continue;
    const float pj = p[j];
    const float* __restrict v = row.kv.data() + static_cast<size_t>(k) * width;
    for (int32_t c = 0; c < width; ++c) O[c] = std::fma(pj, v[c], O[c]);
  }
}

template <Mutant M>
void simt_per_head(const HostCall& call, SimtScratch& s) {
  const mla::DecodeParams& p = call.p;
  const PaddedColumns cols = padded_columns(p.geom);
  const WarpColumns w = warp_columns(cols);
  const ColumnLayout& layout = w.layout;
  s.q.resize(layout.width);
  s.o.resize(layout.width);
  const int32_t tiles = num_token_tiles<M>(p.topk, mla::kSimtTokenTile);
  const int32_t extra_tiles =
      p.has_extra ? num_token_tiles<M>(p.extra_topk, mla::kSimtTokenTile) : 0;
  const int32_t d_qk = cols.nope + cols.rope;
  for (int32_t b = 0; b < p.batch; ++b) {
    for (int32_t t = 0; t < p.s_q; ++t) {
      decode_row<M, false>(main_list(call, b, t), p.conv, cols, layout, &s.row);
      if (p.has_extra) decode_row<M, false>(extra_list(call, b, t), p.conv, cols, layout, &s.extra);
      for (int32_t h = 0; h < p.heads; ++h) {
        const uint16_t* q = p.q + b * p.q_batch_stride + t * p.q_token_stride + h * p.q_head_stride;
        std::fill(s.q.begin(), s.q.end(), 0.0f);
        for (int32_t d = 0; d < d_qk; ++d) {
          s.q[layout.pos[cols.col(d)]] = mla::bf16_to_float(q[d]) * p.sm_scale;  // fp32, once
        }
        mla::SoftmaxState state;
        std::fill(s.o.begin(), s.o.end(), 0.0f);
        // The main tiles, then the extra tiles, through one online softmax.
        for (int32_t i = 0; i < tiles; ++i) {
          fold_tile<M>(s.row, w, i * mla::kSimtTokenTile, p.topk, s.q.data(), state, s.o.data());
        }
        for (int32_t i = 0; i < extra_tiles; ++i) {
          fold_tile<M>(s.extra, w, i * mla::kSimtTokenTile, p.extra_topk, s.q.data(), state,
                       s.o.data());
        }
        store_head<M>(call, cols, layout, b, t, h, state, s.o.data());
      }
    }
  }
}

class CpuSimtBackend final : public TraitsBackend<Backend> {
 public:
  CpuSimtBackend() {
    traits_.name = "cpu-simt";
    traits_.precision = Precision::kSimtFp32;
    // The kernel's envelope: a host model runs what the kernel it models runs.
    traits_.envelope = builtin_kernel_envelope();
  }

 protected:
  RunResult run_case(const MaterializedCase& m) override {
    return run_guarded(m, [this](const HostCall& c) { simt_per_head<Mutant::kNone>(c, scratch_); });
  }

 private:
  SimtScratch scratch_;
};

}  // namespace
}  // namespace host

std::unique_ptr<Backend> make_cpu_simt_backend() {
  static_assert(mla::kSimtTokenTile == host::kWarp, "one lane per token of a tile");
  return std::make_unique<host::CpuSimtBackend>();
}

}  // namespace mlafuzz
