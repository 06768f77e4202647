// cpu-mma: host model of the head-tiled tensor-core kernel (kernels/cuda/mma_head_tiled.cuh;
// SPEC.md section 4, second pipeline), as a template on the planted bug so that cpu_mma.cc
// (kNone) and cpu_mma_mutants.cc share it.
//
// Order of the kernel: one program per (batch row, block of BLOCK_H heads); per tile of
// mla::kMmaTokenTile = 64 selected tokens (decoded to bf16 once, for every head of the block),
// per head: logits x = fp32(q . K) * sm_scale (q bf16 unscaled; bf16 x bf16 products are exact
// in fp32; masked tokens -inf), the tile max, softmax_advance, p = exp(x - m) in fp32 (exactly 0
// for masked tokens), the tile's row sum of the unrounded p in the kernel's order (4 quad lanes,
// each over 4 k-steps of 16 tokens, then xor-1 and xor-2 shuffles), l += it, O *= alpha, and
// bf16(p) * V added to O in fp32. The store divides O by l (+ the sink term) and rounds to bf16.
// Heads never interact, so a head's result does not depend on its block or BLOCK_H.
//
// Where the bits can differ from the kernel's: the tensor core's summation inside Q*K^T and P*V
// (the model sums each dot product in 32 lane-strided partial sums and a butterfly, and P*V
// token by token: any order gives the same bits when the sums are exact, e.g. small integers
// with power-of-two scales) and libm's expf/logf against CUDA's. The MMA bound covers both.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/common/tiling.h"
#include "kernels/host/host_pipeline.h"

namespace mlafuzz::host {

inline constexpr int32_t kDotLanes = 32;

// Dot product over `width` columns (a multiple of kDotLanes): lane l sums columns l, l + 32, ...
// in order, then the lanes are added as a butterfly (16, 8, 4, 2, 1). fp32 multiplies and adds,
// never contracted (-ffp-contract=off); bf16 x bf16 products are exact, so FMA would not differ.
inline float dot_lanes(const float* __restrict a, const float* __restrict b, int32_t width) {
  float acc[kDotLanes] = {};
  for (int32_t c = 0; c < width; c += kDotLanes) {
    for (int32_t l = 0; l < kDotLanes; ++l) acc[l] += a[c + l] * b[c + l];
  }
  for (int32_t off = kDotLanes / 2; off > 0; off /= 2) {
    for (int32_t l = 0; l < off; ++l) acc[l] += acc[l + off];
  }
  return acc[0];
}

struct MmaScratch {
  DecodedRow row;
  std::vector<float> q;                  // [block_h, width] bf16 q of the block's heads
  std::vector<float> o;                  // [block_h, width] fp32 output accumulators
  std::vector<mla::SoftmaxState> state;  // [block_h]
};

// Folds tokens [k0, k0 + 64) (those < topk) into one head's state and accumulator.
template <Mutant M>
void fold_tile(const DecodedRow& row, const PaddedColumns& cols, const ColumnLayout& layout,
               int32_t k0, int32_t topk, const float* q, float sm_scale, mla::SoftmaxState& s,
               float* __restrict O) {
  constexpr int32_t kTile = mla::kMmaTokenTile;
  static_assert(kTile == 64, "the row-sum order below is the kernel's for 64-token tiles");
  const int32_t width = layout.width;
  float x[kTile], p[kTile];
  float tile_max = mla::neg_inf();
  for (int32_t j = 0; j < kTile; ++j) {
    const int32_t k = k0 + j;
    x[j] = k < topk && row.valid[k]
               ? dot_lanes(q, row.kv.data() + static_cast<size_t>(k) * width, width) * sm_scale
               : mla::neg_inf();
    tile_max = x[j] > tile_max ? x[j] : tile_max;  // NaN logits are skipped, as fmaxf does
  }
  const float alpha = advance<M>(s, tile_max);
  for (int32_t j = 0; j < kTile; ++j) p[j] = weight(s, x[j]);
  // Row sum: quad lane t holds tokens 16kk + {2t, 2t+1, 8+2t, 9+2t} of k-step kk.
  float lane_sum[4];
  for (int32_t t = 0; t < 4; ++t) {
    float acc = 0.0f;
    for (int32_t kk = 0; kk < 4; ++kk) {
      const float* pk = p + 16 * kk + 2 * t;
      acc += ((row_sum_term<M>(pk[0]) + row_sum_term<M>(pk[1])) + row_sum_term<M>(pk[8])) +
             row_sum_term<M>(pk[9]);
    }
    lane_sum[t] = acc;
  }
  s.l += (lane_sum[0] + lane_sum[1]) + (lane_sum[2] + lane_sum[3]);
  if constexpr (M != Mutant::kNoRescale) {
    if (alpha != 1.0f) {  // x * 1 == x bit for bit: skipping is exact
      for (int32_t c = 0; c < cols.width_v; ++c) O[c] *= alpha;
    }
  }
  for (int32_t j = 0; j < kTile; ++j) {
    const int32_t k = k0 + j;
    if (k >= topk || !row.valid[k]) continue;
    const float pb = mla::round_to_bf16(p[j]);  // the A operand of the P*V MMA
    const float* __restrict v = row.kv.data() + static_cast<size_t>(k) * width;
    for (int32_t c = 0; c < cols.width_v; ++c) O[c] += pb * v[c];
  }
}

template <Mutant M>
void mma_head_tiled(const HostCall& call, int32_t block_h, MmaScratch& s) {
  const mla::DecodeParams& p = call.p;
  const PaddedColumns cols = padded_columns(p.geom);
  const ColumnLayout layout = identity_layout(cols, kDotLanes);
  const size_t width = static_cast<size_t>(layout.width);
  s.q.resize(block_h * width);
  s.o.resize(block_h * width);
  s.state.resize(block_h);
  const int32_t tiles = num_token_tiles<M>(p.topk, mla::kMmaTokenTile);
  for (int32_t b = 0; b < p.batch; ++b) {
    decode_row<M, true>(call, cols, layout, b, &s.row);
    for (int32_t h0 = 0; h0 < p.heads; h0 += block_h) {
      const int32_t nh = std::min(block_h, p.heads - h0);
      for (int32_t j = 0; j < nh; ++j) {
        load_q_bf16<M>(p, cols, layout, b, h0 + j, s.q.data() + j * width);
        s.state[j] = mla::SoftmaxState{};
      }
      std::fill(s.o.begin(), s.o.end(), 0.0f);
      for (int32_t t = 0; t < tiles; ++t) {
        for (int32_t j = 0; j < nh; ++j) {
          fold_tile<M>(s.row, cols, layout, t * mla::kMmaTokenTile, p.topk, s.q.data() + j * width,
                       p.sm_scale, s.state[j], s.o.data() + j * width);
        }
      }
      for (int32_t j = 0; j < nh; ++j) {
        store_head<M>(call, cols, layout, b, h0 + j, s.state[j], s.o.data() + j * width);
      }
    }
  }
}

template <Mutant M>
class CpuMmaBackend final : public Backend {
 public:
  explicit CpuMmaBackend(int block_h) : block_h_(std::max(1, block_h)) {}
  std::string name() const override {
    std::string n =
        block_h_ == mla::kMmaDefaultBlockH ? "cpu-mma" : "cpu-mma-h" + std::to_string(block_h_);
    if constexpr (M != Mutant::kNone) n += std::string("~") + mla::mutant_name(M);
    return n;
  }
  Precision precision() const override { return Precision::kMmaBf16; }
  RunResult run(const MaterializedCase& m) override {
    return run_guarded(m, [this](const HostCall& c) { mma_head_tiled<M>(c, block_h_, scratch_); });
  }

 private:
  int32_t block_h_;
  MmaScratch scratch_;
};

}  // namespace mlafuzz::host
