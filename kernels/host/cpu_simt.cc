// cpu-simt: host model of the SIMT per-head kernel (SPEC.md section 4, first pipeline).
//
// One (batch row, head) at a time, as the kernel's thread blocks: q * sm_scale rounded to fp32,
// K and V dequantized to fp32 (decoded once per batch row here and shared by the heads; the
// kernel re-reads them per head, which gives the same values), fp32 dot products, online softmax
// over tiles of mla::kSimtTokenTile tokens, P*V in fp32, O / denominator rounded to bf16.
//
// Order of operations: each dot product is summed in 32 lane-strided partial sums added as a
// butterfly (host_pipeline.h, dot_lanes), the shape of a warp reduction; the row sum and P*V add
// token by token in index order. Where the kernel's order differs, results differ by fp32
// reassociation only, which the SIMT error bound (properties/tolerance) covers: gamma_n(2^-24)
// on each logit and on each accumulation.
#include "kernels/common/tiling.h"
#include "kernels/host/host_models.h"
#include "kernels/host/host_pipeline.h"

namespace mlafuzz {
namespace host {
namespace {

struct SimtScratch {
  DecodedRow row;
  std::vector<float> q;  // [width_qk] q * sm_scale of one head
  std::vector<float> o;  // [width_v] fp32 output accumulator
  std::vector<float> x;  // [kSimtTokenTile] logits of one tile
};

template <Mutant M>
void simt_per_head(const HostCall& call, SimtScratch& s) {
  const mla::DecodeParams& p = call.p;
  const PaddedColumns cols = padded_columns(p.geom);
  constexpr int32_t kTile = mla::kSimtTokenTile;
  s.q.resize(cols.width_qk);
  s.o.resize(cols.width_v);
  s.x.resize(kTile);
  const int32_t tiles = num_token_tiles<M>(p.topk, kTile);
  for (int32_t b = 0; b < p.batch; ++b) {
    decode_row<M, false>(call, cols, b, &s.row);
    for (int32_t h = 0; h < p.heads; ++h) {
      load_q_bf16<M>(p, cols, b, h, s.q.data());
      for (float& v : s.q) v = v * p.sm_scale;  // fp32 product, rounded once
      mla::SoftmaxState state;
      std::fill(s.o.begin(), s.o.end(), 0.0f);
      for (int32_t t = 0; t < tiles; ++t) {
        fold_tile<M, false>(s.row, cols, t * kTile, std::min(p.topk, (t + 1) * kTile), s.q.data(),
                            p.sm_scale, state, s.o.data(), s.x.data());
      }
      store_head<M>(call, cols, b, h, state, s.o.data());
    }
  }
}

class CpuSimtBackend final : public Backend {
 public:
  std::string name() const override { return "cpu-simt"; }
  Precision precision() const override { return Precision::kSimtFp32; }
  RunResult run(const MaterializedCase& m) override {
    return run_guarded(m, [this](const HostCall& c) { simt_per_head<Mutant::kNone>(c, scratch_); });
  }

 private:
  SimtScratch scratch_;
};

}  // namespace
}  // namespace host

std::unique_ptr<Backend> make_cpu_simt_backend() {
  return std::make_unique<host::CpuSimtBackend>();
}

}  // namespace mlafuzz
