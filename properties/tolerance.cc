// The tolerance model (derivation in tolerance.h): the terms every pipeline shares (BoundTerms),
// then one function (head_bound) that computes each pipeline's bound from them, so the model can
// be read top to bottom next to its derivation.
#include "properties/tolerance.h"

#include <fmt/format.h>

#include <Eigen/Core>
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "harness/core/value_format.h"
#include "kernels/common/fp_formats.h"
#include "kernels/common/split_kv.h"
#include "kernels/common/tiling.h"
#include "properties/tolerance_pass.h"

namespace mlafuzz {
namespace {

constexpr double kU16 = 0x1p-8;  // bf16 unit roundoff (8 significant bits)
constexpr double kInf = std::numeric_limits<double>::infinity();
// A p = exp(x - max) below exp(-80) may be subnormal in fp32/bf16 (2^-126 ~ exp(-87.3)) or
// flushed to zero: its relative error is unbounded, so it gets an absolute allowance instead.
constexpr double kUnderflowArg = -80.0;
// An fp32 exp overflows at 88.7; a finite sink more than 80 above every logit may overflow in a
// kernel whose running max excludes the sink.
constexpr double kSinkOverflowArg = 80.0;
// A logit error bound past this makes exp(e) (and sums of such terms) overflow float64.
constexpr double kHopelessLogitError = 600.0;
// Second-order slack: the products of first-order terms the sums above leave out.
constexpr double kSecondOrder = 1.0 + 0x1p-20;

double gamma(double m, double u) {
  const double mu = m * u;
  return mu < 0.5 ? mu / (1.0 - mu) : kInf;
}

// 2 (expm1(e) - e) / e^2 = sum_j 2 e^j / (j + 2)!, for e >= 0 (increasing; 1 at 0).
double phi2(double e) {
  if (e < 0x1p-10) return 1 + e / 3 + e * e / 12 + e * e * e / 50;  // the tail below e^3 / 50
  return 2 * (std::expm1(e) - e) / (e * e);
}

}  // namespace

Pipeline pipeline_for(Precision p) {
  Pipeline pl;
  pl.precision = p;
  switch (p) {
    case Precision::kFloat64:
    case Precision::kCustom:
      // The oracles: double arithmetic, one pass over the list, no store rounding. Subnormal
      // doubles are kept by the CPU (no flush-to-zero): eta is the double subnormal spacing.
      pl.u = pl.u_acc = 0x1p-53;
      pl.eta = 0x1p-1074;
      break;
    case Precision::kSimtFp32:
      pl.u = pl.u_acc = 0x1p-24;
      pl.bf16_out = true;
      pl.token_tile = mla::kSimtTokenTile;
      pl.eta = 0x1p-126;  // fp32 flush-to-zero allowed
      break;
    case Precision::kMmaBf16:
      pl.u = 0x1p-24;
      pl.u_acc = 0x1p-23;  // tensor-core accumulation may truncate instead of rounding
      pl.bf16_p = true;
      pl.bf16_out = true;
      pl.token_tile = mla::kMmaTokenTile;
      pl.eta = 0x1p-126;
      pl.split_kv = true;  // cuda-mma-split*, cpu-mma-split* (and split-KV bf16_mma plugins)
      break;
  }
  return pl;
}

namespace {

using RowMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstRowMap = Eigen::Map<const RowMatrix>;
using ConstColMap = Eigen::Map<const Eigen::MatrixXd>;

// The list length T and the online-softmax tile count nt that a bound's rounding terms count.
struct Counts {
  int T = 0, nt = 1;
};

int tiles(const Pipeline& p, int n) {
  return p.token_tile > 0 ? (n + p.token_tile - 1) / p.token_tile : 1;
}

// A joint softmax folds the main list's tiles, then the extra list's (tolerance.h).
Counts joint_counts(const Pipeline& p, int topk, int extra_topk) {
  return {topk + extra_topk,
          tiles(p, topk) + (extra_topk > 0 && p.token_tile > 0 ? tiles(p, extra_topk) : 0)};
}

// One query row's inputs in the layouts the terms read, reused from row to row: the logits and
// A_k = s sum_d |q_d K_kd| with one head's entries contiguous, and the pass's weights.
struct RowWork {
  RowMatrix x, a;   // [H, n]
  RowMatrix c1, w;  // [H, n] the pass's weights w_k f_k and w_k (tiny ones zeroed)
  std::vector<double> sum_c1, sum_w;  // per head: the weights' sums
  // [H, n] 1 for a token with x_k - x_max < -80 (underflow: model step 5), else 0, and the
  // pass's sum of |V_kd| over them [H, d_v], when some head has one.
  RowMatrix under;
  bool any_under = false;
  std::vector<double> under_sum;
  // The float pass's inputs, outputs and the heads' weight scales (float_pass).
  std::vector<float> vf, of, c1f, wf, uf, g1f, g0f, ww, wu;
  std::vector<double> scale, tiny, rowmax;
};

// Weights below this in the float pass's units (2^-120 of the head's largest) are left out of its
// sums and bounded with max_d |V_kd| (float_pass); in the double pass, non-zero weights below
// 2^-1000 are raised to it. Either way the pass stays clear of subnormal operands, which cost a
// hundred cycles each.
constexpr double kFloatWeightFloor = 0x1p-100, kDoubleWeightFloor = 0x1p-1000;

// Whether every value is finite: x * 0 is 0 for a finite x and NaN otherwise, and their sum
// vectorizes (Eigen's allFinite compares one value at a time).
template <typename M>
bool all_finite(const M& m) {
  return (m.array() * 0.0).sum() == 0;
}

// x rounded up to float (x >= 0): never below x, so a sum of such weights bounds the sum of the
// weights.
inline float round_up_to_float(double x) {
  const float f = static_cast<float>(x);
  const uint32_t up = static_cast<double>(f) < x ? 1 : 0;
  return std::bit_cast<float>(std::bit_cast<uint32_t>(f) + up);
}

// 2^e with 2^e <= |x| < 2^(e+1), for finite non-zero x.
double pow2_floor(double x) {
  return std::bit_cast<double>(std::bit_cast<uint64_t>(std::fabs(x)) & 0x7ff0000000000000);
}

// The pass over V in float (tolerance.h, "Evaluation": the sums may be formed in any precision
// whose rounding is bounded), for a row whose values are finite. Everything is scaled by powers
// of two (exactly) so that no float sum overflows: V and O by sigma (their largest magnitude to
// [2^59, 2^60)), then rounded to nearest; each head's weights by s (the largest to [2^20,
// 2^21)), then rounded up, those below 2^-100 left out (0) and their terms bounded with c_k
// (max_d |V_kd| + |O_d|); O below 2^-61 is taken as 0.
// A row whose non-zero values of V span at most 2^120 then has them all in [2^-61, 2^60): every
// value and difference (0 or at least 2^-84) is 0 or a normal float, rounded relatively; a
// product or sum may round to a subnormal (an absolute error of at most eta = 2^-150). With u =
// 2^-24: a recursive sum S of m non-negative rounded terms bounds the exact sum by (S + m eta) /
// (1 - m u); |V| <= |V~| / (1 - u); |V - O| <= t~ / (1 - u) + u |V| + e_O with t~ the float |V~
// - O~| and e_O = u |O| (|O| where O~ = 0); and c_k <= w_k f_max. The bounds are then scaled
// back. Returns false (nothing written) for a row the float pass cannot take: the caller takes
// the double pass.
bool float_pass(const OracleRowView& v, RowWork& rw, int32_t H, int32_t dqk, int32_t dv,
                Eigen::Index k0, Eigen::Index n, const double* O, const BoundTerms::Head* heads,
                double* g1, double* g0, double* w) {
  if (n == 0 || n > (int64_t{1} << 20)) return false;
  const size_t nv = static_cast<size_t>(n) * dv, no = static_cast<size_t>(H) * dv;
  const size_t nc = static_cast<size_t>(H) * n;
  // The largest and the smallest non-zero magnitude of V and O (Eigen's reductions vectorize).
  const Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>> Vm(v.K + k0 * dqk, n, dv,
                                                                Eigen::OuterStride<>(dqk));
  bool finite = all_finite(Vm) && all_finite(ConstRowMap(O, H, dv));
  for (int32_t h = 0; h < H; ++h) finite &= std::isfinite(heads[h].f_max);
  if (!finite) return false;
  // |O| <= max |V| (O is a weighted mean of V): O's range is V's.
  const double vmax = Vm.cwiseAbs().maxCoeff();
  const double vmin = (Vm.array() == 0).select(kInf, Vm.array().abs()).minCoeff();
  // Values of V spanning more than 2^120 (special values: the largest finite and subnormals in
  // one row) would lose the small ones in float, and values all below 2^-900 would scale past the
  // double range: the double pass takes those rows.
  if (vmax > 0 && (vmax < 0x1p-900 || vmin < vmax * 0x1p-120)) return false;
  const double sigma = vmax > 0 ? 0x1p59 / pow2_floor(vmax) : 1.0;
  rw.vf.resize(nv);
  rw.of.resize(no);
  for (Eigen::Index k = 0; k < n; ++k) {
    const double* src = v.K + (k0 + k) * dqk;
    float* dst = rw.vf.data() + k * dv;
    for (int32_t d = 0; d < dv; ++d) dst[d] = static_cast<float>(src[d] * sigma);
  }
  // An O below 2^-61 in these units (an output the sink all but cancels) is taken as 0: its
  // error |O| is added to every term below (an |O| sum of c).
  for (size_t i = 0; i < no; ++i) {
    const double o = O[i] * sigma;
    rw.of[i] = std::fabs(o) < 0x1p-61 ? 0.0f : static_cast<float>(o);
  }
  rw.c1f.resize(nc);
  rw.wf.resize(nc);
  std::vector<double>& scale = rw.scale;  // [2 H]
  scale.assign(2 * static_cast<size_t>(H), 1.0);
  // Per head and weight: the tiny ones' sum of c_k and of c_k max_d |V_kd|.
  rw.tiny.assign(4 * static_cast<size_t>(H), 0.0);
  bool any_tiny = false;
  for (int32_t h = 0; h < H; ++h) {
    const auto weights = [&](const double* c, float* cf, double* s, double* tiny) {
      int64_t bits = 0;  // of the largest weight (>= 0: ordered as the values)
      for (Eigen::Index k = 0; k < n; ++k) {
        const int64_t b = std::bit_cast<int64_t>(c[k]);
        bits = b > bits ? b : bits;
      }
      const double cmax = std::bit_cast<double>(bits);
      if (!(cmax >= 0x1p-900)) {  // all tiny (or 0): no head's term is lost below
        for (Eigen::Index k = 0; k < n; ++k) cf[k] = 0;
        any_tiny = true;
        tiny[0] = -1;  // every token
        return;
      }
      *s = 0x1p20 / pow2_floor(cmax);
      for (Eigen::Index k = 0; k < n; ++k) {
        const double x = c[k] * *s;
        const bool small = x < kFloatWeightFloor;  // 0, or a tiny weight: out of the sums
        cf[k] = small ? 0.0f : round_up_to_float(x);
        any_tiny |= small & (x > 0);
        tiny[0] += small & (x > 0) ? 1.0 : 0.0;
      }
    };
    double* tiny = rw.tiny.data() + 4 * static_cast<size_t>(h);
    weights(rw.c1.row(h).data(), rw.c1f.data() + static_cast<size_t>(h) * n, &scale[2 * h], tiny);
    weights(rw.w.row(h).data(), rw.wf.data() + static_cast<size_t>(h) * n, &scale[2 * h + 1],
            tiny + 2);
  }
  if (any_tiny) {
    // max_d |V_kd| per token, then the tiny weights' sums (in the weights' own units).
    rw.rowmax.resize(static_cast<size_t>(n));
    for (Eigen::Index k = 0; k < n; ++k) rw.rowmax[k] = Vm.row(k).cwiseAbs().maxCoeff();
    for (int32_t h = 0; h < H; ++h) {
      for (int j = 0; j < 2; ++j) {
        double* tiny = rw.tiny.data() + 4 * static_cast<size_t>(h) + 2 * j;
        if (tiny[0] == 0) continue;
        const double* c = j == 0 ? rw.c1.row(h).data() : rw.w.row(h).data();
        const double limit = tiny[0] < 0 ? kInf : kFloatWeightFloor / scale[2 * h + j];
        double sc = 0, scv = 0;
        for (Eigen::Index k = 0; k < n; ++k) {
          if (c[k] < limit) {
            sc += c[k];
            scv += c[k] * rw.rowmax[k];
          }
        }
        tiny[0] = sc;
        tiny[1] = scv;
      }
    }
  }
  if (rw.any_under) {
    rw.uf.resize(nc);
    for (int32_t h = 0; h < H; ++h) {
      const double* src = rw.under.row(h).data();
      float* dst = rw.uf.data() + static_cast<size_t>(h) * n;
      for (Eigen::Index k = 0; k < n; ++k) dst[k] = static_cast<float>(src[k]);
    }
    rw.wu.resize(no);
  }
  rw.g1f.resize(no);
  rw.g0f.resize(no);
  rw.ww.resize(no);
  weighted_abs_sums(rw.vf.data(), dv, n, H, dv, rw.of.data(), dv, rw.c1f.data(), rw.wf.data(),
                    rw.wf.data(), rw.any_under ? rw.uf.data() : nullptr, n, rw.g1f.data(),
                    rw.g0f.data(), rw.ww.data(), rw.any_under ? rw.wu.data() : nullptr, dv);
  const double u = 0x1p-24, eta = 0x1p-150, m_eta = static_cast<double>(n) * eta;
  const double raise = 1 / ((1 - static_cast<double>(n) * u) * (1 - u));
  for (int32_t h = 0; h < H; ++h) {
    const size_t hh = static_cast<size_t>(h);
    const double sw = rw.sum_w[hh], sc1 = rw.sum_c1[hh];
    const double unit1 = raise / (scale[2 * hh] * sigma);
    const double unitw = raise / (scale[2 * hh + 1] * sigma);
    const double f_max = heads[h].f_max;
    const size_t at = hh * dv;
    // The tiny weights' terms: c_k |V_kd - O_d| <= c_k (max_d |V_kd| + |O_d|).
    const double* tiny = rw.tiny.data() + 4 * hh;
    for (int32_t d = 0; d < dv; ++d) {
      const double od = std::fabs(O[at + d]);
      const double oe = rw.of[at + d] == 0 ? od : u * od;  // O's error (flushed: all of it)
      const double wb = (rw.ww[at + d] + m_eta) * unitw + tiny[3];
      w[at + d] = wb;
      g0[at + d] = (rw.g0f[at + d] + m_eta) * unitw + u * wb + oe * sw + tiny[3] + od * tiny[2];
      g1[at + d] =
          (rw.g1f[at + d] + m_eta) * unit1 + u * f_max * wb + oe * sc1 + tiny[1] + od * tiny[0];
    }
    if (rw.any_under) {
      const double unitu = raise / sigma;
      for (int32_t d = 0; d < dv; ++d) rw.under_sum[at + d] = (rw.wu[at + d] + m_eta) * unitu;
    }
  }
  return true;
}

// |x| scaled by a power of two, rounded up to float, and raised to at least 2^-40 when not 0.
template <typename In>
void abs_up_to_float(const In& x, double scale, float* out) {
  for (Eigen::Index i = 0; i < x.size(); ++i) {
    const double a = std::fabs(x(i)) * scale;
    const float f = round_up_to_float(a);
    out[i] = a > 0 && f < 0x1p-40f ? 0x1p-40f : f;
  }
}

// A = s |Q| |K|^T, the logits' error scale (model step 1), from a float product where the values
// allow: only an upper bound on A is needed (every term of the model grows with A). |q| and |K|
// are scaled by powers of two (their largest to [2^30, 2^31)), rounded up and raised to at
// least 2^-40 when not 0: every product and partial sum is then 0 or a normal float, each a sum
// of non-negative terms with at most 2 d_qk + 16 roundings (Eigen's blocked product), so the
// exact sum is at most the float one times 1 + gamma(2 d_qk + 16; 2^-24). Returns false when a
// value is not finite (the double product then).
bool float_a(const OracleRowView& v, int32_t H, int32_t dqk, double s, RowWork& rw) {
  using FloatRows = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const ConstRowMap Q(v.Q, H, dqk), K(v.K, v.n, dqk);
  if (!all_finite(Q) || !all_finite(K)) return false;
  const double qmax = Q.cwiseAbs().maxCoeff(), kmax = K.cwiseAbs().maxCoeff();
  if (!(qmax > 0x1p-900 && kmax > 0x1p-900)) return false;
  const double sq = 0x1p30 / pow2_floor(qmax), sk = 0x1p30 / pow2_floor(kmax);
  static thread_local FloatRows qf, kf;
  static thread_local Eigen::MatrixXf af;
  qf.resize(H, dqk);
  kf.resize(v.n, dqk);
  abs_up_to_float(Q.reshaped<Eigen::RowMajor>(), sq, qf.data());
  abs_up_to_float(K.reshaped<Eigen::RowMajor>(), sk, kf.data());
  af.noalias() = qf * kf.transpose();
  const double raise = 1 / (1 - (2.0 * dqk + 16) * 0x1p-24);
  rw.a = af.cast<double>() * (s * raise * (1 + 0x1p-50) / (sq * sk));
  return true;
}

void prepare_row(const OracleRowView& v, int32_t H, int32_t dqk, double s, RowWork& rw) {
  const ConstColMap X(v.X, H, v.n);
  rw.x = X;
  if (!float_a(v, H, dqk, s, rw)) {
    const ConstRowMap Q(v.Q, H, dqk), K(v.K, v.n, dqk);
    rw.a.resize(H, v.n);
    rw.a.noalias() = Q.cwiseAbs() * K.cwiseAbs().transpose();
    rw.a *= s;
  }
  rw.c1.resize(H, v.n);
  rw.w.resize(H, v.n);
}

// The terms (BoundTerms::Head and the sums G1, G0, W, underflow) of every head of a row over the
// valid entries [k0, k0 + n), against reference outputs O (row h at O + h * d_v: the row's
// output, or one list's exact partial result), with the heads' sinks (null: none). under is
// called for a head with tokens that may underflow and returns where its d_v sums go.
template <typename Under>
void subset_terms(const OracleRowView& v, RowWork& rw, int32_t H, int32_t dqk, int32_t dv,
                  Eigen::Index k0, Eigen::Index n, const double* O, const double* sinks,
                  bool sink_in_lse, BoundTerms::Head* heads, double* g1, double* g0, double* w,
                  Under under) {
  const double lambda = 2.0 / (dqk + 2);
  const size_t hs = static_cast<size_t>(H);
  rw.sum_c1.assign(hs, 0.0);
  rw.sum_w.assign(hs, 0.0);
  rw.under.setZero(H, rw.w.cols());  // the weights' layout
  rw.any_under = false;
  for (int32_t h = 0; h < H; ++h) {
    BoundTerms::Head& t = heads[h];
    t = BoundTerms::Head{};
    t.sink = sinks != nullptr ? sinks[h] : -kInf;
    if (n == 0) continue;
    t.empty = false;
    const auto x = rw.x.row(h).segment(k0, n).array();
    const auto a = rw.a.row(h).segment(k0, n).array();
    auto wk = rw.w.row(h).head(n).array();
    auto c1 = rw.c1.row(h).head(n).array();
    t.x_max = x.maxCoeff();
    t.R = t.x_max - x.minCoeff();
    const bool sink_finite = std::isfinite(t.sink);
    // The output weights, the sink in the denominator (model step 2).
    const double M = sink_finite ? std::max(t.x_max, t.sink) : t.x_max;
    const double sink_num = sink_finite ? std::exp(t.sink - M) : 0.0;
    wk = (x - M).exp();
    const double Z = wk.sum() + sink_num;
    wk /= Z;
    t.w_s = sink_num / Z;
    // X_k = |x_k| + |x_k - x_max| in c1 for now.
    c1 = x.abs() + (x - t.x_max).abs();
    t.a_max = a.maxCoeff();
    t.xd_max = c1.maxCoeff();
    // The LSE's sums, its weights the output weights unless a finite sink is left out of the lse.
    const auto lse_sums = [&](const auto& wl, double scale) {
      t.L[0] = (wl * a).sum() * scale;
      t.L[1] = (wl * c1).sum() * scale;
      t.L[2] = wl.sum() * scale;
      t.L[3] = (wl * a.square()).sum() * scale;
      t.L[4] = (wl * a * c1).sum() * scale;
      t.L[5] = (wl * c1.square()).sum() * scale;
    };
    const bool lse_sink = sink_in_lse && sink_finite;
    if (sink_finite && !lse_sink) {
      const Eigen::Array<double, 1, Eigen::Dynamic> el = (x - t.x_max).exp();
      lse_sums(el, 1 / el.sum());
    } else {
      lse_sums(wk, 1.0);
      t.wl_s = lse_sink ? t.w_s : 0.0;
    }
    c1 = a + lambda * c1;
    t.f_max = c1.maxCoeff();
    c1 *= wk;
    const size_t hh = static_cast<size_t>(h);
    rw.sum_c1[hh] = c1.sum();
    rw.sum_w[hh] = wk.sum();
    rw.under.row(h).head(n) = (x - t.x_max < kUnderflowArg).cast<double>();
    t.any_under = rw.under.row(h).head(n).sum() > 0;
    rw.any_under = rw.any_under || t.any_under;
  }
  if (rw.any_under) rw.under_sum.assign(hs * dv, 0.0);
  if (!float_pass(v, rw, H, dqk, dv, k0, n, O, heads, g1, g0, w)) {
    // Subnormal weights raised (bounds only grow), as the float pass raises its own.
    for (double* c : {rw.c1.data(), rw.w.data()}) {
      for (Eigen::Index i = 0; i < rw.c1.size(); ++i) {
        if (c[i] > 0 && c[i] < kDoubleWeightFloor) c[i] = kDoubleWeightFloor;
      }
    }
    weighted_abs_sums(v.K + k0 * dqk, dqk, n, H, dv, O, dv, rw.c1.data(), rw.w.data(), rw.w.data(),
                      rw.any_under ? rw.under.data() : nullptr, rw.w.cols(), g1, g0, w,
                      rw.any_under ? rw.under_sum.data() : nullptr, dv);
  }
  // 2^-126 sum_k |V_kd| over the tokens whose p may be subnormal or flushed (model step 5).
  for (int32_t h = 0; h < H; ++h) {
    if (!heads[h].any_under) continue;
    double* u = under(h);
    const double* sum = rw.under_sum.data() + static_cast<size_t>(h) * dv;
    for (int32_t d = 0; d < dv; ++d) u[d] = 0x1p-126 * sum[d];
  }
}

// What head_bound reads besides its head's scalars: the row's shapes and the head's element
// arrays (underflow sums null when none).
struct HeadInputs {
  double s;
  int32_t dqk, dv;
  bool sink_in_lse;
  const double *O, *g1, *g0, *w, *under;
  double lse_ref;
};

// One pipeline's bound of one head (the model of tolerance.h in the form of its "Evaluation"):
// ob[d_v] and *lb (left 0 where the value must be exact). Returns E, the bound on every e_k
// and e_s (+inf when the model bounds nothing for this head). Writes every element (the
// buffers may hold another case's values).
double head_bound(const BoundTerms::Head& t, const HeadInputs& in, const Pipeline& p, Counts c,
                  double* ob, double* lb) {
  *lb = 0;
  if (t.empty) {  // out exactly 0, lse exactly the convention's infinity
    std::fill(ob, ob + in.dv, 0.0);
    return 0;
  }
  const double u = p.u, s = in.s;
  const int dqk = in.dqk, dv = in.dv, T = c.T, nt = c.nt;
  // Split-KV: at most ns splits, each adding a product and a sum to O and l; one more rescale
  // argument per token (|m_i - M| <= R), so rescale arguments sum to 2R (derivation above).
  const int ns = p.split_kv ? std::min(nt, mla::kMaxSplits) : 0;
  const double r_mult = p.split_kv ? 2.0 : 1.0;
  const double g_num = gamma(T + nt + 2 + 2 * ns, p.u_acc);
  // The division: one rounding, or two (MMA: 1/d, *).
  const double g_den = gamma(T + nt + 5 + 2 * ns, u);
  const double g_lse = gamma(T + nt + 2 + 2 * ns, u);
  const double exp_ulps = (nt + 2) * p.c_exp * u;
  // e_k <= alpha f_k + delta for every token (steps 1 and 2).
  const double alpha = gamma(dqk + 2, p.u_acc);
  const double delta = s * (dqk + 2) * p.eta + 2 * u * r_mult * t.R + exp_ulps;
  const double two_u = 2 * u;
  const double E = std::min(alpha * t.f_max, alpha * t.a_max + two_u * t.xd_max) + delta;
  const bool sink_pos_inf = t.sink == kInf;
  const bool sink_finite = std::isfinite(t.sink);
  const double e_s =
      sink_finite ? 2 * u * (std::fabs(t.sink - t.x_max) + r_mult * t.R) + exp_ulps : 0.0;
  const bool lse_exact = (in.sink_in_lse && sink_pos_inf) || !std::isfinite(in.lse_ref);
  // Logit errors so large that exp(e) overflows float64 (|x| ~ 1e7 with large scales): the
  // model bounds nothing for this head, so every element's bound is +inf (not 0 * exp(e) =
  // NaN).
  if (E > kHopelessLogitError || e_s > kHopelessLogitError) {
    if (!lse_exact) *lb = kInf;
    std::fill(ob, ob + dv, sink_pos_inf ? 0.0 : kInf);
    return kInf;
  }
  // expm1(e_k) <= e_k phi(E).
  const double phi = E > 0 ? std::expm1(E) / E : 1.0;
  if (!lse_exact) {
    // S1 >= sum_k w'_k e_k, S2 >= sum_k w'_k e_k^2. With the sink's LSE weight, the weights sum
    // to 1: log sum w' exp(e) <= log1p(sum w' expm1(e)), expm1(e) <= e + phi2(E) e^2 / 2
    // (Taylor, the remainder's coefficient increasing in e); -log sum w' exp(-e) <= sum w' e
    // (Jensen).
    const double* L = t.L;
    const double S1 = alpha * L[0] + two_u * L[1] + delta * L[2];
    const double S2 = alpha * alpha * L[3] + two_u * two_u * L[5] + delta * delta * L[2] +
                      2 * (alpha * two_u * L[4] + alpha * delta * L[0] + two_u * delta * L[1]);
    const bool lse_sink = in.sink_in_lse && sink_finite;
    const double up =
        std::min(phi * S1, S1 + 0.5 * phi2(E) * S2) + (lse_sink ? t.wl_s * std::expm1(e_s) : 0.0);
    const double down = S1 + (lse_sink ? t.wl_s * e_s : 0.0);
    const double lw = std::max(std::log1p(up), down);
    *lb = lw - std::log1p(-g_lse) + p.c_exp * u * (std::fabs(in.lse_ref) + std::fabs(t.x_max) + 1) +
          2 * u * std::fabs(in.lse_ref) + T * p.eta;
  }
  const double E_all = std::max(E, e_s);
  if (sink_pos_inf) {  // out exactly 0: exp(+inf - m) = inf in the denominator
    std::fill(ob, ob + dv, 0.0);
    return E_all;
  }
  const double grow = std::exp(E_all);
  // Per element: grow (phi (alpha G1 + delta G0) + w_s expm1(e_s) |O| + g_den |O| + (g_num +
  // u16 with bf16 p) W), times the second-order slack, plus the absolute terms.
  const double k1 = grow * phi * alpha, k0 = grow * phi * delta;
  const double ko = grow * (t.w_s * std::expm1(e_s) + g_den);
  const double kw = grow * (g_num + (p.bf16_p ? kU16 : 0.0));
  const double abs_base = p.eta * (T + nt + 4 + 2 * ns);
  const double overflow = sink_finite && t.sink - t.x_max > kSinkOverflowArg ? 1.0 : 0.0;
  const auto elements = [&](auto under) {
    for (int d = 0; d < dv; ++d) {
      const double od = std::fabs(in.O[d]);
      const double first = k1 * in.g1[d] + k0 * in.g0[d] + ko * od + kw * in.w[d];
      ob[d] = first * kSecondOrder + abs_base + overflow * (od + in.w[d]) + under(d);
    }
  };
  if (in.under != nullptr) {
    elements([&](int d) { return in.under[d]; });
  } else {
    elements([](int) { return 0.0; });
  }
  return E_all;
}

// The LSE-merged pipeline (tolerance.h, the production decode) of one head: each list's partial
// bound (delta_i, dl_i against its exact partial O_i, l_i), its bf16 rounding, then the merge of
// the two partials as two "tokens" with LSE errors dl_i, the sink added at the merge.
struct Part {
  const double* O = nullptr;      // [d_v] exact partial output
  const double* delta = nullptr;  // [d_v] its bound
  double l = -kInf, dl = 0;       // its exact LSE and the LSE's bound
};

void merged_head_bound(const Pipeline& p, const Part* parts, size_t count, bool hopeless,
                       double sink, bool sink_in_lse, const double* O, double lse_ref, int dv,
                       double* ob, double* lb) {
  const double u = p.u;
  const bool sink_pos_inf = sink == kInf;
  const bool sink_finite = std::isfinite(sink);
  const bool lse_exact = (sink_in_lse && sink_pos_inf) || !std::isfinite(lse_ref);
  if (hopeless) {
    if (!lse_exact) *lb = kInf;
    if (!sink_pos_inf) std::fill(ob, ob + dv, kInf);
    return;
  }
  double l_max = -kInf, l_min = kInf;
  for (size_t i = 0; i < count; ++i) {
    l_max = std::max(l_max, parts[i].l);
    l_min = std::min(l_min, parts[i].l);
  }
  if (sink_finite) l_min = std::min(l_min, sink);
  const double M = sink_finite ? std::max(l_max, sink) : l_max;
  const double R = std::max(l_max, M) - l_min;
  // The merge's own arithmetic: l_i - M, exp, the weights' sum and division, two products and a
  // sum per element: c_exp ulps per exp, a few roundings.
  const double merge_exp = 3 * p.c_exp * u;
  double e[2] = {0, 0};
  double e_max = 0;
  for (size_t i = 0; i < count; ++i) {
    e[i] = parts[i].dl + 2 * u * (std::fabs(parts[i].l - M) + R) + merge_exp;
    e_max = std::max(e_max, e[i]);
  }
  const double e_s = sink_finite ? 2 * u * (std::fabs(sink - M) + R) + merge_exp : 0.0;
  e_max = std::max(e_max, e_s);
  if (e_max > kHopelessLogitError) {
    if (!lse_exact) *lb = kInf;
    if (!sink_pos_inf) std::fill(ob, ob + dv, kInf);
    return;
  }
  const double g_merge = gamma(6, u);
  if (!lse_exact) {
    const bool lse_sink = sink_in_lse && sink_finite;
    const double Ml = lse_sink ? M : l_max;
    double zl = lse_sink ? std::exp(sink - Ml) : 0.0;
    for (size_t i = 0; i < count; ++i) zl += std::exp(parts[i].l - Ml);
    double up = lse_sink ? std::exp(sink - Ml) / zl * std::exp(e_s) : 0.0;
    double down = lse_sink ? std::exp(sink - Ml) / zl * std::exp(-e_s) : 0.0;
    for (size_t i = 0; i < count; ++i) {
      const double wi = std::exp(parts[i].l - Ml) / zl;
      up += wi * std::exp(e[i]);
      down += wi * std::exp(-e[i]);
    }
    const double lw = std::max(std::log(up), -std::log(down));
    *lb = lw - std::log1p(-g_merge) + p.c_exp * u * (std::fabs(lse_ref) + std::fabs(Ml) + 1) +
          2 * u * std::fabs(lse_ref) + 8 * p.eta;
  }
  if (sink_pos_inf) return;  // out exactly 0
  double Z = sink_finite ? std::exp(sink - M) : 0.0;
  for (size_t i = 0; i < count; ++i) Z += std::exp(parts[i].l - M);
  const double a_s = sink_finite ? std::exp(sink - M) / Z : 0.0;
  const double grow = std::exp(e_max);
  const bool sink_overflow = sink_finite && sink - l_max > kSinkOverflowArg;
  double a[2] = {0, 0};
  for (size_t i = 0; i < count; ++i) a[i] = std::exp(parts[i].l - M) / Z;
  for (int d = 0; d < dv; ++d) {
    const double od = std::fabs(O[d]);
    double weights = a_s * std::expm1(e_s) * od, stored = 0, mags = od, abs_terms = 8 * p.eta;
    for (size_t i = 0; i < count; ++i) {
      const Part& pt = parts[i];
      const double oi = std::fabs(pt.O[d]);
      const double di = pt.delta[d];
      weights += a[i] * std::expm1(e[i]) * std::fabs(pt.O[d] - O[d]);
      // The partial's error before its store, and its bf16 rounding (of the computed value).
      stored += a[i] * (di * (1 + kU16) + kU16 * oi);
      mags += a[i] * oi;
      // A partial whose merge weight may be subnormal or flushed.
      if (pt.l - l_max < kUnderflowArg) abs_terms += 0x1p-126 * (oi + di);
    }
    if (sink_overflow) abs_terms += od + mags;
    // The computed weights are a_i exp(eps_i) / Z~ with Z~ >= exp(-e_max): at most a_i
    // exp(2 e_max) on the stored partials' errors.
    ob[d] =
        (grow * weights + grow * grow * stored + grow * g_merge * mags) * kSecondOrder + abs_terms;
  }
}

// The LSE-merged requests of a case with an extra cache, row by row: each list's exact partial
// result and its terms, each request's partial bounds, then their merge.
class MergedBounds final : public OracleRowVisitor {
 public:
  struct Request {
    const Pipeline* p;
    int T_main, T_extra;
    Bounds* out;
  };
  MergedBounds(const MaterializedCase& m, std::vector<Request> requests)
      : m_(m), requests_(std::move(requests)) {}

  void visit(const OracleRowView& v) override {
    if (v.n == 0) return;  // empty row: out exactly 0, lse exactly the convention's infinity
    const int32_t H = m_.heads, dv = m_.d_v(), dqk = m_.d_qk();
    const double s = std::fabs(m_.sm_scale64);
    prepare_row(v, H, dqk, s, rw_);
    const Eigen::Index k0[2] = {0, v.n_main}, len[2] = {v.n_main, v.n - v.n_main};
    for (int l = 0; l < 2; ++l) {
      List& li = lists_[l];
      li.n = len[l];
      if (li.n == 0) continue;
      li.O.assign(static_cast<size_t>(H) * dv, 0.0);
      li.lse.assign(static_cast<size_t>(H), 0.0);
      partial_results(v, H, dqk, dv, k0[l], li.n, li.O.data(), li.lse.data());
      li.heads.resize(static_cast<size_t>(H));
      li.g1.assign(static_cast<size_t>(H) * dv, 0.0);
      li.g0.assign(li.g1.size(), 0.0);
      li.w.assign(li.g1.size(), 0.0);
      li.under.clear();
      subset_terms(v, rw_, H, dqk, dv, k0[l], li.n, li.O.data(), nullptr, false, li.heads.data(),
                   li.g1.data(), li.g0.data(), li.w.data(), [&](int32_t h) {
                     if (li.under.empty()) li.under.assign(static_cast<size_t>(H) * dv, 0.0);
                     return li.under.data() + static_cast<size_t>(h) * dv;
                   });
    }
    std::vector<double> delta[2];
    for (const Request& rq : requests_) {
      const Pipeline& p = *rq.p;
      const int Tl[2] = {rq.T_main, rq.T_extra};
      for (int32_t h = 0; h < H; ++h) {
        const size_t rh = static_cast<size_t>(v.row) * H + h;
        Part parts[2];
        size_t count = 0;
        bool hopeless = false;
        for (int l = 0; l < 2; ++l) {
          const List& li = lists_[l];
          if (li.n == 0) continue;  // no valid token: weight exactly 0 (LSE -inf)
          delta[l].assign(static_cast<size_t>(dv), 0.0);
          const size_t hd = static_cast<size_t>(h) * dv;
          const HeadInputs in{s,
                              dqk,
                              dv,
                              false,
                              li.O.data() + hd,
                              li.g1.data() + hd,
                              li.g0.data() + hd,
                              li.w.data() + hd,
                              li.under.empty() ? nullptr : li.under.data() + hd,
                              li.lse[static_cast<size_t>(h)]};
          Part& pt = parts[count++];
          pt.O = in.O;
          pt.delta = delta[l].data();
          pt.l = in.lse_ref;
          if (!(head_bound(li.heads[static_cast<size_t>(h)], in, p, {Tl[l], tiles(p, Tl[l])},
                           delta[l].data(), &pt.dl) <= kHopelessLogitError)) {
            hopeless = true;
          }
        }
        const double sink = m_.sink.empty() ? -kInf : static_cast<double>(m_.sink[h]);
        merged_head_bound(p, parts, count, hopeless, sink, m_.conv.sink_in_lse, v.out + h * dv,
                          v.lse[h], dv, rq.out->out.data() + rh * dv, &rq.out->lse[rh]);
      }
    }
  }

 private:
  struct List {
    Eigen::Index n = 0;
    std::vector<double> O, lse, g1, g0, w, under;
    std::vector<BoundTerms::Head> heads;
  };

  // The exact softmax of every head over entries [k0, k0 + n) of the row, without the sink: the
  // partial output O_i and LSE l_i an LSE-merged kernel computes for one list.
  void partial_results(const OracleRowView& v, int32_t H, int32_t dqk, int32_t dv, Eigen::Index k0,
                       Eigen::Index n, double* O, double* lse) {
    RowMatrix P(H, n);
    for (int32_t h = 0; h < H; ++h) {
      const auto x = rw_.x.row(h).segment(k0, n).array();
      const double x_max = x.maxCoeff();
      P.row(h).array() = (x - x_max).exp();
      const double z = P.row(h).sum();
      P.row(h) /= z;
      lse[h] = x_max + std::log(z);
    }
    const Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>> V(v.K + k0 * dqk, n, dv,
                                                                 Eigen::OuterStride<>(dqk));
    Eigen::Map<RowMatrix>(O, H, dv).noalias() = P * V;
  }

  const MaterializedCase& m_;
  std::vector<Request> requests_;
  RowWork rw_;
  List lists_[2];
};

}  // namespace

BoundTermsBuilder::BoundTermsBuilder(const MaterializedCase& m, BoundTerms recycled)
    : m_(m), t_(std::move(recycled)) {
  t_.rows = m.query_rows();
  t_.heads = m.heads;
  t_.d_v = m.d_v();
  t_.d_qk = m.d_qk();
  t_.s = std::fabs(m.sm_scale64);
  t_.sink_in_lse = m.conv.sink_in_lse;
  const size_t rh = static_cast<size_t>(t_.rows) * t_.heads;
  t_.head.assign(rh, BoundTerms::Head{});
  if (!m.sink.empty()) {
    for (size_t i = 0; i < rh; ++i) t_.head[i].sink = m.sink[i % static_cast<size_t>(t_.heads)];
  } else {
    for (BoundTerms::Head& hd : t_.head) hd.sink = -kInf;
  }
  // Every row's sums are written by visit() (an empty row's zeroed): resized, not cleared.
  t_.g1.resize(rh * t_.d_v);
  t_.g0.resize(rh * t_.d_v);
  t_.w.resize(rh * t_.d_v);
  t_.under.assign(static_cast<size_t>(t_.rows), {});
  row_seconds_.assign(static_cast<size_t>(t_.rows), 0.0);
}

void BoundTermsBuilder::visit(const OracleRowView& v) {
  if (v.n == 0) {  // empty row: the heads stay empty (bounds 0)
    const size_t at = static_cast<size_t>(v.row) * t_.heads * t_.d_v;
    const size_t len = static_cast<size_t>(t_.heads) * t_.d_v;
    for (std::vector<double>* a : {&t_.g1, &t_.g0, &t_.w}) {
      std::fill(a->begin() + static_cast<std::ptrdiff_t>(at),
                a->begin() + static_cast<std::ptrdiff_t>(at + len), 0.0);
    }
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  thread_local RowWork rw;
  const int32_t H = t_.heads, dv = t_.d_v, dqk = t_.d_qk;
  prepare_row(v, H, dqk, t_.s, rw);
  std::vector<double> sinks;
  if (!m_.sink.empty()) sinks.assign(m_.sink.begin(), m_.sink.end());
  const size_t at = static_cast<size_t>(v.row) * H;
  std::vector<double>& under = t_.under[static_cast<size_t>(v.row)];
  subset_terms(v, rw, H, dqk, dv, 0, v.n, v.out, sinks.empty() ? nullptr : sinks.data(),
               t_.sink_in_lse, t_.head.data() + at, t_.g1.data() + at * dv, t_.g0.data() + at * dv,
               t_.w.data() + at * dv, [&](int32_t h) {
                 if (under.empty()) under.assign(static_cast<size_t>(H) * dv, 0.0);
                 return under.data() + static_cast<size_t>(h) * dv;
               });
  row_seconds_[static_cast<size_t>(v.row)] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double BoundTermsBuilder::seconds() const {
  double s = 0;
  for (const double x : row_seconds_) s += x;
  return s;
}

BoundTerms bound_terms(const MaterializedCase& m, const OracleResult& ref) {
  BoundTermsBuilder b(m);
  visit_oracle_rows(m, ref, b);
  return b.take();
}

std::vector<Bounds> joint_bounds(const BoundTerms& t, const OracleResult& ref,
                                 const std::vector<JointRequest>& requests,
                                 std::vector<Bounds>* reuse) {
  const size_t rh = static_cast<size_t>(t.rows) * t.heads;
  if (ref.out.size() != rh * t.d_v || ref.lse.size() != rh || t.head.size() != rh) {
    throw std::invalid_argument("joint_bounds: the oracle result does not have the terms' shape");
  }
  std::vector<Bounds> out(requests.size());
  std::vector<Counts> counts;
  for (size_t j = 0; j < requests.size(); ++j) {
    // Every element is written below: a reused buffer is only resized (not cleared).
    if (reuse != nullptr && !reuse->empty()) {
      out[j] = std::move(reuse->back());
      reuse->pop_back();
    }
    out[j].out.resize(rh * t.d_v);
    out[j].lse.resize(rh);
    const JointRequest& rq = requests[j];
    counts.push_back(joint_counts(rq.pipeline, rq.topk, rq.extra_topk));
  }
  // Head by head, every request: a head's terms are read from memory once.
  for (size_t i = 0; i < rh; ++i) {
    const size_t at = i * t.d_v;
    const std::vector<double>& under = t.under[i / static_cast<size_t>(t.heads)];
    const HeadInputs in{
        t.s,
        t.d_qk,
        t.d_v,
        t.sink_in_lse,
        ref.out.data() + at,
        t.g1.data() + at,
        t.g0.data() + at,
        t.w.data() + at,
        under.empty() ? nullptr : under.data() + (i % static_cast<size_t>(t.heads)) * t.d_v,
        ref.lse[i]};
    for (size_t j = 0; j < requests.size(); ++j) {
      head_bound(t.head[i], in, requests[j].pipeline, counts[j], out[j].out.data() + at,
                 &out[j].lse[i]);
    }
  }
  return out;
}

Bounds joint_bounds(const BoundTerms& t, const OracleResult& ref, const Pipeline& p, int32_t topk,
                    int32_t extra_topk) {
  return std::move(joint_bounds(t, ref, {JointRequest{p, topk, extra_topk}}, nullptr)[0]);
}

std::vector<Bounds> compute_bounds_set(const MaterializedCase& m, const OracleResult& ref,
                                       const std::vector<BoundsRequest>& requests) {
  std::vector<Bounds> out(requests.size());
  std::vector<MergedBounds::Request> merged;
  bool any_joint = false;
  for (size_t i = 0; i < requests.size(); ++i) {
    const BoundsRequest& rq = requests[i];
    const int topk = rq.tile_topk > 0 ? rq.tile_topk : m.topk;
    if (rq.pipeline.lse_merged && m.has_extra) {
      out[i].out.assign(ref.out.size(), 0.0);
      out[i].lse.assign(ref.lse.size(), 0.0);
      merged.push_back({&rq.pipeline, topk, m.extra_topk, &out[i]});
    } else {
      any_joint = true;
    }
  }
  if (any_joint) {
    std::vector<JointRequest> joint;
    std::vector<size_t> at;
    for (size_t i = 0; i < requests.size(); ++i) {
      const BoundsRequest& rq = requests[i];
      if (rq.pipeline.lse_merged && m.has_extra) continue;
      joint.push_back(
          {rq.pipeline, rq.tile_topk > 0 ? rq.tile_topk : m.topk, m.has_extra ? m.extra_topk : 0});
      at.push_back(i);
    }
    std::vector<Bounds> got = joint_bounds(bound_terms(m, ref), ref, joint, nullptr);
    for (size_t j = 0; j < at.size(); ++j) out[at[j]] = std::move(got[j]);
  }
  if (!merged.empty()) {
    MergedBounds mb(m, std::move(merged));
    visit_oracle_rows(m, ref, mb);
  }
  return out;
}

Bounds compute_bounds(const MaterializedCase& m, const OracleResult& ref, const Pipeline& p,
                      int tile_topk) {
  return std::move(compute_bounds_set(m, ref, {BoundsRequest{p, tile_topk}})[0]);
}

Pipeline pipeline_of(const Backend& be) {
  Pipeline pl = pipeline_for(be.precision());
  pl.lse_merged = be.extra_pipeline() == ExtraPipeline::kLseMerged;
  // The backend's own tile where it is not the precision's (cpu-mma-small, cuda-mma-small: 32):
  // its online-softmax tile boundaries, whose count nt enters every rounding term.
  if (be.token_tile() > 0 && pl.token_tile > 0) pl.token_tile = be.token_tile();
  return pl;
}

Bounds custom_bounds(const OracleResult& ref, double abs_tol, double rel_tol) {
  Bounds bd;
  bd.out.resize(ref.out.size());
  bd.lse.resize(ref.lse.size());
  for (size_t i = 0; i < ref.out.size(); ++i) bd.out[i] = abs_tol + rel_tol * std::fabs(ref.out[i]);
  for (size_t i = 0; i < ref.lse.size(); ++i) bd.lse[i] = abs_tol + rel_tol * std::fabs(ref.lse[i]);
  return bd;
}

Bounds add_bounds(const Bounds& a, const Bounds& b) {
  Bounds r = a;
  for (size_t i = 0; i < r.out.size() && i < b.out.size(); ++i) r.out[i] += b.out[i];
  for (size_t i = 0; i < r.lse.size() && i < b.lse.size(); ++i) r.lse[i] += b.lse[i];
  return r;
}

void bf16_rounding_interval(double v, double* lo, double* hi) {
  if (!std::isfinite(v)) {
    *lo = *hi = v;
    return;
  }
  const double a = std::fabs(v);
  double away, toward;  // half-spacings away from and toward zero
  if (a < 0x1p-126) {
    away = toward = 0x1p-134;  // subnormal bf16 spacing 2^-133
  } else {
    // a is a normal double: its exponent and "a is a power of two" read from the bits, and the
    // ulp 2^(ex - 7) built from them (what ilogb and ldexp give, without their cost: check_bounds
    // calls this for every output element).
    const uint64_t bits = std::bit_cast<uint64_t>(a);
    const int ex = static_cast<int>((bits >> 52) & 0x7ff) - 1023;
    const double ulp = std::bit_cast<double>(static_cast<uint64_t>(ex - 7 + 1023) << 52);
    const bool pow2 = (bits & ((uint64_t{1} << 52) - 1)) == 0;
    away = ulp / 2;
    toward = (pow2 && ex > -126) ? ulp / 4 : ulp / 2;
  }
  if (a == 0) {
    *lo = -0x1p-134;
    *hi = 0x1p-134;
  } else if (v > 0) {
    *lo = v - toward;
    *hi = v + away;
  } else {
    *lo = v - away;
    *hi = v + toward;
  }
}

namespace {

// Classifies a value for the non-finite position check.
int finite_class(double v) {
  if (std::isnan(v)) return 1;
  if (v == kInf) return 2;
  if (v == -kInf) return 3;
  return 0;
}

const char* class_name(int c) {
  static const char* const names[] = {"finite", "NaN", "+inf", "-inf"};
  return names[c];
}

double ratio(double excess, double bound) {
  if (excess <= 0) return 0;
  return bound > 0 ? excess / bound : kInf;
}

}  // namespace

namespace {

// The rounding interval of bf16 values (bf16_rounding_interval) for finite v, without branches:
// the half-spacings away from and toward zero from 2^floor(log2 |v|), the exponent bits of |v|.
inline void bf16_interval_finite(double v, double* lo, double* hi) {
  const double a = std::fabs(v);
  const double p2 = std::bit_cast<double>(std::bit_cast<uint64_t>(a) & 0x7ff0000000000000);
  const bool normal = a >= 0x1p-126;
  // At a power of two above 2^-126 the spacing below is half the one above.
  const bool narrower_below = (a == p2) & (a >= 0x1p-125);
  const double away = normal ? p2 * 0x1p-8 : 0x1p-134;
  const double toward = normal ? (narrower_below ? p2 * 0x1p-9 : p2 * 0x1p-8) : 0x1p-134;
  const bool pos = v > 0;
  const bool zero = a == 0;
  *lo = zero ? -0x1p-134 : v - (pos ? toward : away);
  *hi = zero ? 0x1p-134 : v + (pos ? away : toward);
}

// The finite-element figures of one row of d_v outputs, all finite on both sides: per element
// the excess over the sides' rounding intervals and its ratio to the bound (bound + plus) in t[],
// the error in err[]. One loop without branches or reductions, which the compiler vectorizes (the
// division is computed for every element, also where the ratio is 0 or +inf: tolerance.cc is
// compiled with -fno-trapping-math, properties/CMakeLists.txt).
template <bool kBf16A, bool kBf16B, bool kPlus>
void row_figures(const double* ao, const double* bo, const double* bd, const double* plus,
                 int32_t n, double* t, double* err) {
  for (int32_t i = 0; i < n; ++i) {
    const double va = ao[i], vb = bo[i];
    double alo = va, ahi = va, blo = vb, bhi = vb;
    if constexpr (kBf16A) bf16_interval_finite(va, &alo, &ahi);
    if constexpr (kBf16B) bf16_interval_finite(vb, &blo, &bhi);
    const double x = blo - ahi, y = alo - bhi;
    const double m = x < y ? y : x;  // std::max({x, y, 0.0})
    const double excess = m < 0.0 ? 0.0 : m;
    double bound = bd[i];
    if constexpr (kPlus) bound += plus[i];
    const double q = excess / bound;  // ratio(excess, bound), both sides computed
    const double r = bound > 0 ? q : kInf;
    t[i] = excess <= 0 ? 0.0 : r;
    err[i] = std::fabs(va - vb);
  }
}

using RowFiguresFn = void (*)(const double*, const double*, const double*, const double*, int32_t,
                              double*, double*);

RowFiguresFn row_figures_for(bool bf16_a, bool bf16_b, bool plus) {
  static constexpr RowFiguresFn kFns[8] = {
      row_figures<false, false, false>, row_figures<false, false, true>,
      row_figures<false, true, false>,  row_figures<false, true, true>,
      row_figures<true, false, false>,  row_figures<true, false, true>,
      row_figures<true, true, false>,   row_figures<true, true, true>};
  return kFns[(bf16_a ? 4 : 0) + (bf16_b ? 2 : 0) + (plus ? 1 : 0)];
}

bool all_finite(const double* v, int32_t n) {
  bool ok = true;
  for (int32_t i = 0; i < n; ++i) ok &= std::isfinite(v[i]);
  return ok;
}

}  // namespace

BoundCheck check_bounds(const Side& a, const Side& b, const Bounds& bound, int32_t batch,
                        int32_t heads, int32_t d_v) {
  return check_bounds(a, b, bound, nullptr, batch, heads, d_v);
}

BoundCheck check_bounds(const Side& a, const Side& b, const Bounds& bound, const Bounds* plus,
                        int32_t batch, int32_t heads, int32_t d_v) {
  BoundCheck r;
  r.bf16_outputs = a.out_bf16;
  // Every figure as a loop over the elements in the order (b, h, d) then the row's lse would
  // give it: the worst element is the first with the largest ratio, the mean sums the errors in
  // that order. A row finite on both sides goes through row_figures (vectorized) and then a
  // loop that adds its errors in order; a row with a non-finite value element by element, with
  // the message for the first class mismatch.
  double sum_abs = 0, max_abs = 0, out_max_ref = 0, lse_max_abs = 0;
  double out_tightness = 0, lse_tightness = 0, worst = 0;
  int64_t n_abs = 0;
  bool any = false, passed = true;
  const auto out_bound = [&](size_t i) {
    return plus != nullptr ? bound.out[i] + plus->out[i] : bound.out[i];
  };
  const auto lse_bound = [&](size_t i) {
    return plus != nullptr ? bound.lse[i] + plus->lse[i] : bound.lse[i];
  };
  const auto finite_pair = [&](double va, double vb, int bb, int hh, int dd) {
    if (std::isfinite(va) && std::isfinite(vb)) return true;
    const int ca = finite_class(va), cb = finite_class(vb);
    if (ca != cb) {
      if (r.nonfinite_match) {
        const ValueFormat fa = !a.out_bf16 ? ValueFormat::kFp64
                               : dd >= 0   ? ValueFormat::kBf16
                                           : ValueFormat::kFp32;
        std::ostringstream os;
        os << (dd >= 0 ? "out[b=" : "lse[b=") << bb << ",h=" << hh;
        if (dd >= 0) os << ",d=" << dd;
        os << "]: " << class_name(ca) << " (" << format_value(va, fa) << ") where the reference is "
           << class_name(cb) << " (" << format_value(vb, ValueFormat::kFp64) << ")";
        r.nonfinite_detail = os.str();
      }
      r.nonfinite_match = false;
      passed = false;
    }
    return false;
  };
  const auto record = [&](double t, double va, double vb, double err, double excess, double bnd,
                          int bb, int hh, int dd) {
    worst = std::max(worst, t);
    any = true;
    r.b = bb;
    r.h = hh;
    r.d = dd;
    r.value = va;
    r.reference = vb;
    r.error = err;
    r.excess = excess;
    r.bound = bnd;
  };
  const bool a_bf16 = a.out_bf16, b_bf16 = b.out_bf16;
  // A row of a side as doubles: its out vector's, or its raw bf16 values widened into the row
  // buffer. The row now compared: ao, bo.
  std::vector<double> a_row(static_cast<size_t>(d_v)), b_row(static_cast<size_t>(d_v));
  const double* ao = nullptr;
  const double* bo = nullptr;
  const auto out_row = [&](const Side& s, size_t rh, std::vector<double>& buf) -> const double* {
    if (s.out != nullptr) return s.out->data() + rh * d_v;
    const auto r = static_cast<int64_t>(rh) / heads, h = static_cast<int64_t>(rh) % heads;
    const uint16_t* raw = s.out_raw + OutputBuffers::kGuard + r / s.s_q * s.out_batch_stride +
                          r % s.s_q * s.out_token_stride + h * s.out_head_stride;
    for (int32_t d = 0; d < d_v; ++d) buf[static_cast<size_t>(d)] = mla::bf16_to_float(raw[d]);
    return buf.data();
  };
  const auto lse_of = [&](const Side& s, size_t rh) -> double {
    if (s.lse != nullptr) return (*s.lse)[rh];
    const auto r = static_cast<int64_t>(rh) / heads, h = static_cast<int64_t>(rh) % heads;
    return s.lse_raw[OutputBuffers::kGuard + r / s.s_q * s.lse_batch_stride +
                     r % s.s_q * s.lse_token_stride + h];
  };
  // The figures of one finite out element of the row (as row_figures computes them).
  struct Element {
    double va, vb, excess, err, bound, t;
  };
  size_t row = 0;  // the row's first element in the bounds
  const auto figures_at = [&](int32_t dd) {
    const size_t at = row + static_cast<size_t>(dd);
    Element e{ao[dd], bo[dd], 0, 0, out_bound(at), 0};
    double alo = e.va, ahi = e.va, blo = e.vb, bhi = e.vb;
    if (a_bf16) bf16_rounding_interval(e.va, &alo, &ahi);
    if (b_bf16) bf16_rounding_interval(e.vb, &blo, &bhi);
    e.excess = std::max({blo - ahi, alo - bhi, 0.0});
    e.err = std::fabs(e.va - e.vb);
    e.t = ratio(e.excess, e.bound);
    return e;
  };
  // One out element the slow way: a row with a non-finite value.
  const auto element = [&](int32_t bb, int32_t hh, int32_t dd) {
    if (!finite_pair(ao[dd], bo[dd], bb, hh, dd)) return;
    const Element e = figures_at(dd);
    out_tightness = std::max(out_tightness, e.t);
    sum_abs += e.err;
    ++n_abs;
    max_abs = std::max(max_abs, e.err);
    out_max_ref = std::max(out_max_ref, std::fabs(e.vb));
    if (e.t > worst || !any) record(e.t, e.va, e.vb, e.err, e.excess, e.bound, bb, hh, dd);
    if (e.t > 1) passed = false;
  };
  const RowFiguresFn figures = row_figures_for(a_bf16, b_bf16, plus != nullptr);
  std::vector<double> t(static_cast<size_t>(d_v)), err(static_cast<size_t>(d_v));
  for (int32_t bb = 0; bb < batch; ++bb) {
    for (int32_t hh = 0; hh < heads; ++hh) {
      const size_t rh = static_cast<size_t>(bb) * heads + hh;
      row = rh * d_v;
      ao = out_row(a, rh, a_row);
      bo = out_row(b, rh, b_row);
      if (d_v > 0 && all_finite(ao, d_v) && all_finite(bo, d_v)) {
        figures(ao, bo, bound.out.data() + row, plus != nullptr ? plus->out.data() + row : nullptr,
                d_v, t.data(), err.data());
        // The maxima (no NaN: the row is finite, the ratios are >= 0 or +inf) in any order with
        // Eigen's vectorized reductions; the sum in the loop's order (the mean's bits).
        const Eigen::Map<const Eigen::ArrayXd> te(t.data(), d_v), ee(err.data(), d_v);
        const double max_t = std::max(0.0, te.maxCoeff());
        max_abs = std::max(max_abs, ee.maxCoeff());
        out_max_ref =
            std::max(out_max_ref, Eigen::Map<const Eigen::ArrayXd>(bo, d_v).abs().maxCoeff());
        for (int32_t dd = 0; dd < d_v; ++dd) sum_abs += err[static_cast<size_t>(dd)];
        n_abs += d_v;
        out_tightness = std::max(out_tightness, max_t);
        if (max_t > worst || !any) {
          // The element an element-by-element loop records last: the first with the row's
          // largest ratio (also when nothing was recorded before: the ratios are >= 0).
          int32_t at = 0;
          while (at + 1 < d_v && !(t[static_cast<size_t>(at)] == max_t)) ++at;
          const Element e = figures_at(at);
          record(e.t, e.va, e.vb, e.err, e.excess, e.bound, bb, hh, at);
        }
        if (max_t > 1) passed = false;
      } else {
        for (int32_t dd = 0; dd < d_v; ++dd) element(bb, hh, dd);
      }
      const double va = lse_of(a, rh), vb = lse_of(b, rh);
      if (!finite_pair(va, vb, bb, hh, -1)) continue;
      const double err1 = std::fabs(va - vb);  // the excess too: lse values are exact
      const double bnd = lse_bound(rh);
      const double t1 = ratio(err1, bnd);
      lse_tightness = std::max(lse_tightness, t1);
      lse_max_abs = std::max(lse_max_abs, err1);
      if (t1 > worst || !any) record(t1, va, vb, err1, err1, bnd, bb, hh, -1);
      if (t1 > 1) passed = false;
    }
  }
  r.passed = passed;
  r.tightness = worst;
  r.max_abs = max_abs;
  r.out_max_ref = out_max_ref;
  r.lse_max_abs = lse_max_abs;
  r.out_tightness = out_tightness;
  r.lse_tightness = lse_tightness;
  r.mean_abs = n_abs > 0 ? sum_abs / static_cast<double>(n_abs) : 0;
  r.max_rel = r.out_max_ref > 0 ? r.max_abs / r.out_max_ref : 0;
  return r;
}

Side raw_side(const RunResult& r, const MaterializedCase& m) {
  Side s;
  s.out_bf16 = true;
  s.out_raw = r.out_raw.data();
  s.lse_raw = r.lse_raw.data();
  s.s_q = m.s_q;
  s.out_head_stride = m.out_head_stride;
  s.out_token_stride = m.out_token_stride;
  s.out_batch_stride = m.out_batch_stride;
  s.lse_token_stride = m.lse_token_stride;
  s.lse_batch_stride = m.lse_batch_stride;
  return s;
}

std::string BoundCheck::describe() const {
  // Every number with all its digits: the value in the backend's format with its bits, the
  // float64 reference and the error with 17 digits, the distance in ulps of the backend's
  // format (two LSEs that differ in the last bit no longer read "8.66268 vs 8.66268").
  std::ostringstream os;
  if (!nonfinite_match) os << "non-finite position mismatch: " << nonfinite_detail << "; ";
  if (b < 0) {
    os << "no finite element compared";
    return os.str();
  }
  const ValueFormat f = !bf16_outputs ? ValueFormat::kFp64
                        : d >= 0      ? ValueFormat::kBf16
                                      : ValueFormat::kFp32;
  const auto g17 = [](double v) { return fmt::format("{:.17g}", v); };
  os << (d >= 0 ? "out[b=" : "lse[b=") << b << ",h=" << h;
  if (d >= 0) os << ",d=" << d;
  os << "] value " << format_value(value, f) << " reference " << g17(reference) << " |error| "
     << g17(error) << " = " << ulps_text(value, reference, f);
  if (excess != error) os << " (beyond rounding " << g17(excess) << ")";
  os << " bound " << g17(bound) << " error/bound " << fmt::format("{:.9g}", tightness);
  return os.str();
}

}  // namespace mlafuzz
