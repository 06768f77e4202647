// cpu-mma: host model of the head-tiled tensor-core kernel (SPEC.md section 4, second pipeline),
// as a template on the planted bug so that cpu_mma.cc (kNone) and cpu_mma_mutants.cc share it.
//
// Order of the kernel: one program per (batch row, block of BLOCK_H heads); per tile of
// mla::kMmaTokenTile selected tokens (decoded to bf16 once, for every head of the block), per
// head: logits x = fp32(q . K) * sm_scale (q bf16 unscaled; bf16 x bf16 products are exact in
// fp32), the tile max, softmax_advance, O *= alpha, then p = exp(x - m) in fp32 added to l
// unrounded and bf16(p) * V added to O in fp32. The store divides O by l (+ the sink term) and
// rounds to bf16. Heads never interact, so a head's result does not depend on its block.
//
// Order of additions: the tensor core's internal summation order is not IEEE-sequential; the
// model sums each dot product in 32 lane-strided partial sums and a butterfly (dot_lanes), and
// adds P*V token by token. With exact inputs (small integers, power-of-two scales) every order
// gives the same bits; otherwise the MMA error bound covers the reassociation.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/common/tiling.h"
#include "kernels/host/host_pipeline.h"

namespace mlafuzz::host {

struct MmaScratch {
  DecodedRow row;
  std::vector<float> q;                  // [block_h, width_qk] bf16 q of the block's heads
  std::vector<float> o;                  // [block_h, width_v] fp32 output accumulators
  std::vector<float> x;                  // [kMmaTokenTile] logits of one head in one tile
  std::vector<mla::SoftmaxState> state;  // [block_h]
};

template <Mutant M>
void mma_head_tiled(const HostCall& call, int32_t block_h, MmaScratch& s) {
  const mla::DecodeParams& p = call.p;
  const PaddedColumns cols = padded_columns(p.geom);
  constexpr int32_t kTile = mla::kMmaTokenTile;
  s.q.resize(static_cast<size_t>(block_h) * cols.width_qk);
  s.o.resize(static_cast<size_t>(block_h) * cols.width_v);
  s.x.resize(kTile);
  s.state.resize(block_h);
  const int32_t tiles = num_token_tiles<M>(p.topk, kTile);
  for (int32_t b = 0; b < p.batch; ++b) {
    decode_row<M, true>(call, cols, b, &s.row);
    for (int32_t h0 = 0; h0 < p.heads; h0 += block_h) {
      const int32_t nh = std::min(block_h, p.heads - h0);
      for (int32_t j = 0; j < nh; ++j) {
        load_q_bf16<M>(p, cols, b, h0 + j, s.q.data() + static_cast<size_t>(j) * cols.width_qk);
        s.state[j] = mla::SoftmaxState{};
      }
      std::fill(s.o.begin(), s.o.end(), 0.0f);
      for (int32_t t = 0; t < tiles; ++t) {
        const int32_t k0 = t * kTile, k1 = std::min(p.topk, k0 + kTile);
        for (int32_t j = 0; j < nh; ++j) {
          fold_tile<M, true>(
              s.row, cols, k0, k1, s.q.data() + static_cast<size_t>(j) * cols.width_qk, p.sm_scale,
              s.state[j], s.o.data() + static_cast<size_t>(j) * cols.width_v, s.x.data());
        }
      }
      for (int32_t j = 0; j < nh; ++j) {
        store_head<M>(call, cols, b, h0 + j, s.state[j],
                      s.o.data() + static_cast<size_t>(j) * cols.width_v);
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
