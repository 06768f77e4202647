// The per-element bound the host-model tests and the GPU tests hold a kernel (or its host model)
// to against the float64 oracle: SPEC.md section 5's model, made conservative. One copy for both
// test executables (tests/kernels/host_model_test.cc, tests/gpu/gpu_test.cc).
//
// - logit: |dx_k| <= gamma(d_qk + 2; u_acc) s sum_d |q_d K_kd| + 2u |x_k|  (any summation order;
//   the scale multiply, or SIMT's q*s rounding);
// - weight: every computed weight is exp(x_k + eps_k - m) with |eps_k| <= e_k = |dx_k|
//   + 2u (|x_k - x_max| + R) + 4u (nt + 2)  (exp-argument rounding, nt rescales whose arguments
//   sum to at most R = x_max - x_min, exp within 4 ulps);
//   |dO_d| <= exp(e) [sum_k w_k expm1(e_k) |V_kd - O_d| + w_s expm1(e) |O_d|];
// - accumulation: gamma(T + nt + 2; u_acc) sum_k w_k |V_kd| + gamma(T + nt + 5) |O_d| (the
//   division; the MMA kernel's reciprocal and product count two roundings);
// - MMA: p rounded to bf16 for P*V: u16 sum_k w_k |V_kd|;
// - bf16 store: u16 (|O_d| + delta) + 2^-133 (bf16 subnormal spacing);
// - underflow: 2^-126 (T + nt + 4 + sum_k |V_kd|); a sink more than 80 above every logit may
//   overflow exp in fp32 (out flushed to 0): |O_d| + sum_k w_k |V_kd| more.
// lse: e + gamma(T + nt + 2) + 4u (|lse| + |x_max| + 1) + 2u |lse| + 2^-126 T.
// Rows without a valid token get bound 0: out must be exactly 0 and lse exactly the
// convention's infinity.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "harness/core/materialize.h"
#include "oracle/oracle.h"

namespace mlafuzz::testing {

inline constexpr double kU32 = 0x1p-24;  // fp32 unit roundoff
inline constexpr double kU16 = 0x1p-8;   // bf16 unit roundoff

inline double gamma(double n, double u) { return n * u / (1 - n * u); }

struct Bound {
  std::vector<double> out, lse;
};

// bf16_p: the MMA pipeline (p rounded to bf16 for P*V); tile: tokens per online-softmax tile;
// u_acc: unit roundoff of the dot products and the P*V accumulation (2u for tensor cores, which
// may truncate when they accumulate; u for the host models and SIMT).
inline Bound pipeline_bound(const MaterializedCase& m, const OracleResult& ref, bool bf16_p,
                            int tile, double u_acc) {
  const int32_t H = m.heads, dv = m.d_v(), T = m.topk;
  const int32_t nt = (T + tile - 1) / tile;
  Bound bd;
  bd.out.assign(static_cast<size_t>(m.batch) * H * dv, 0.0);
  bd.lse.assign(static_cast<size_t>(m.batch) * H, 0.0);
  for (int32_t b = 0; b < m.batch; ++b) {
    const OracleRow row = gather_row(m, b);
    const int64_t n = static_cast<int64_t>(row.k.size());
    if (n == 0) continue;  // exact: out 0, lse the convention's infinity (checked exactly)
    const Eigen::MatrixXd Q = q_matrix(m, b);
    const Eigen::MatrixXd X = row_logits(m, b, row);
    const Eigen::MatrixXd A = m.sm_scale64 * (Q.cwiseAbs() * row.K.transpose().cwiseAbs());
    const Eigen::MatrixXd V = row.K.leftCols(dv);
    for (int32_t h = 0; h < H; ++h) {
      const size_t bh = static_cast<size_t>(b) * H + h;
      const double x_max = X.row(h).maxCoeff(), x_min = X.row(h).minCoeff();
      const double R = x_max - x_min;
      std::vector<double> e(static_cast<size_t>(n));
      double e_max = 0;
      for (int64_t k = 0; k < n; ++k) {
        const double dx = gamma(m.d_qk() + 2, u_acc) * A(h, k) + 2 * kU32 * std::abs(X(h, k));
        e[k] = dx + 2 * kU32 * (x_max - X(h, k) + R) + 4 * kU32 * (nt + 2);
        e_max = std::max(e_max, e[k]);
      }
      const double sink = m.sink.empty() ? -HUGE_VAL : m.sink[static_cast<size_t>(h)];
      const double M = std::isfinite(sink) ? std::max(x_max, sink) : x_max;
      double Z = 0;
      std::vector<double> w(static_cast<size_t>(n));
      for (int64_t k = 0; k < n; ++k) Z += (w[k] = std::exp(X(h, k) - M));
      const double ws_raw = std::isfinite(sink) ? std::exp(sink - M) : 0.0;
      Z += ws_raw;
      for (auto& wk : w) wk /= Z;
      const double ws = ws_raw / Z;
      std::vector<double> w_em(static_cast<size_t>(n));  // w_k expm1(e_k)
      for (int64_t k = 0; k < n; ++k) w_em[k] = w[k] * std::expm1(e[k]);
      const bool sink_overflow = std::isfinite(sink) && sink - x_max > 80;
      for (int32_t d = 0; d < dv; ++d) {
        const double O = ref.out[bh * dv + d];
        double soft = ws * std::expm1(e_max) * std::abs(O), wv = 0, v_abs = 0;
        for (int64_t k = 0; k < n; ++k) {
          soft += w_em[k] * std::abs(V(k, d) - O);
          wv += w[k] * std::abs(V(k, d));
          v_abs += std::abs(V(k, d));
        }
        double delta = std::exp(e_max) * soft + gamma(T + nt + 2, u_acc) * wv +
                       gamma(T + nt + 5, kU32) * std::abs(O) + 0x1p-126 * (T + nt + 4 + v_abs);
        if (bf16_p) delta += kU16 * wv;
        if (sink_overflow) delta += std::abs(O) + wv;
        bd.out[bh * dv + d] = delta * (1 + 0x1p-20) + kU16 * (std::abs(O) + delta) + 0x1p-133;
      }
      const double lse = ref.lse[bh];
      bd.lse[bh] = e_max + gamma(T + nt + 2, kU32) +
                   4 * kU32 * (std::abs(lse) + std::abs(x_max) + 1) + 2 * kU32 * std::abs(lse) +
                   0x1p-126 * T;
    }
  }
  return bd;
}

}  // namespace mlafuzz::testing
