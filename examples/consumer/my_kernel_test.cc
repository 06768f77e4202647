// A user's test: "my kernel" (here a naive fp32 loop over the cache layout helpers) checked
// against mlafuzz's float64 oracle on a few cases, with FlashMLA's allclose figures.
// Exits 0 when every case passes.
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/compare.h"
#include "core/materialize.h"
#include "mla/mla_params.h"
#include "oracle/oracle.h"

namespace {

// The kernel under test: fp32 dot products, two-pass softmax, no sink handling beyond the
// denominator. Writes out [B, H, d_v] and lse [B, H] as doubles.
mlafuzz::RunResult my_kernel(const mlafuzz::MaterializedCase& m) {
  mlafuzz::RunResult r;
  const int dv = m.d_v(), dqk = m.d_qk();
  r.out.assign(static_cast<size_t>(m.batch) * m.heads * dv, 0.0);
  r.lse.assign(static_cast<size_t>(m.batch) * m.heads, 0.0);
  const mla::DecodeParams p = m.host_params();
  for (int b = 0; b < m.batch; ++b) {
    for (int h = 0; h < m.heads; ++h) {
      const uint16_t* q = p.q + b * p.q_batch_stride + h * p.q_head_stride;
      std::vector<float> x(m.topk, -INFINITY);
      float mx = -INFINITY;
      for (int k = 0; k < m.topk; ++k) {
        const int32_t idx = p.indices[b * p.indices_batch_stride + k];
        const int32_t len = p.topk_length != nullptr ? p.topk_length[b] : -1;
        if (!mla::index_valid(idx, k, len, p.conv)) continue;
        const mla::TokenAddress a = mla::token_address(p.geom, idx);
        float s = 0;
        for (int d = 0; d < dqk; ++d) {
          s += mla::bf16_to_float(q[d]) * mla::dequant_k(p.geom, p.kv_cache, a, d);
        }
        x[k] = s * p.sm_scale;
        mx = std::fmax(mx, x[k]);
      }
      const size_t row = static_cast<size_t>(b) * m.heads + h;
      if (mx == -INFINITY) {  // empty row: out 0, lse per convention
        r.lse[row] = p.conv.empty_lse == mla::EmptyRowLse::kPosInf ? INFINITY : -INFINITY;
        continue;
      }
      float l = 0;
      std::vector<float> o(dv, 0.0f);
      for (int k = 0; k < m.topk; ++k) {
        if (x[k] == -INFINITY) continue;
        const float w = std::exp(x[k] - mx);
        l += w;
        const mla::TokenAddress a =
            mla::token_address(p.geom, p.indices[b * p.indices_batch_stride + k]);
        for (int d = 0; d < dv; ++d) o[d] += w * mla::dequant_k(p.geom, p.kv_cache, a, d);
      }
      const float denom = p.sink != nullptr ? l + std::exp(p.sink[h] - mx) : l;
      for (int d = 0; d < dv; ++d) r.out[row * dv + d] = o[d] / denom;
      r.lse[row] = mx + std::log(l);
    }
  }
  return r;
}

}  // namespace

int main() {
  int failed = 0;
  for (int page_size : {1, 61, 64}) {
    mlafuzz::Case c;
    c.geom.page_size = page_size;
    c.geom.num_pages = 8;
    c.batch = 2;
    c.heads = 4;
    c.topk = 37;
    c.index_spec.invalid_fraction = 0.1;
    c.data_seed = static_cast<uint64_t>(page_size);
    const mlafuzz::MaterializedCase m = mlafuzz::materialize(c);
    mlafuzz::RunResult ref;
    const mlafuzz::OracleResult o = mlafuzz::run_oracle_eigen(m);
    ref.out = o.out;
    ref.lse = o.lse;
    const mlafuzz::Comparison cmp = mlafuzz::compare_results(my_kernel(m), ref, m.batch, m.heads,
                                                             m.d_v(), "my-kernel", "oracle");
    std::printf("P=%d %s\n%s\n", page_size, cmp.original_line().c_str(),
                cmp.metrics_lines().c_str());
    if (!cmp.out_check.passed || !cmp.lse_check.passed) ++failed;
  }
  std::printf("%s\n", failed == 0 ? "my kernel: all cases pass" : "my kernel: FAILED");
  return failed == 0 ? 0 : 1;
}
