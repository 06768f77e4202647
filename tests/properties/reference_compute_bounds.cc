// The bound formulas of the tolerance model evaluated token by token, per head and pipeline,
// with per-vector reductions: the reference compute_bounds_set's dense form is pinned against
// (tests/properties/model_test.cc, Tolerance.BoundsEqualTheTokenByTokenForm).
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "mla/fp_formats.h"
#include "mla/split_kv.h"
#include "mla/tiling.h"
#include "tests/properties/reference_bounds.h"

namespace mlafuzz::reference {
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

// One head of one query row over a contiguous subset of the row's valid entries (all of them for
// a joint softmax; one list's for an LSE-merged partial), with the list length T and tile count
// nt its rounding terms count. O and lse_ref are the exact result of that subset (with the sink
// when `sink` is finite or +inf).
struct HeadSubset {
  Eigen::Index k0 = 0, n = 0;  // valid entries [k0, k0 + n) of the row
  int T = 0, nt = 1;
  double sink = -kInf;
  bool sink_in_lse = false;
  const double* O = nullptr;  // [d_v]
  double lse_ref = 0;
};

struct RowTerms {
  const Pipeline& p;
  double s;
  int dqk, dv;
  const Eigen::MatrixXd& X;  // [H, n_valid] logits
  const Eigen::MatrixXd& A;  // [H, n_valid] s * |q| . |K|
  const Eigen::MatrixXd& K;  // [n_valid, d_qk]
  // Dequantization rounding of the row's K (tolerance.h, step 1, "Dequantization"): relative
  // uk and absolute etak per element of K, 0 where every selected scale is exact; qn1[h] the
  // sum of |q_hd| over the quantized dims.
  double uk = 0, etak = 0;
  const double* qn1 = nullptr;
};

// The model of tolerance.h for one head: writes ob[d_v] (delta_pre) and *lb (0 where the value
// must be exact). Returns the largest logit error e_max (+inf when the model bounds nothing).
// What head_bound needs that no pipeline changes (the oracle's softmax weights with the sink
// in the denominator, and the pass over V that reads them), computed once per head for every
// pipeline compute_bounds_set bounds together. The same expressions as in head_bound: shared or
// not, the bounds are the same bits.
struct HeadShared {
  double x_max = 0, x_min = 0, M = 0, Z = 0, w_s = 0;
  Eigen::VectorXd w, under;
  bool any_under = false;
  std::vector<double> wvd, uvd;  // [d_v] sum_k w_k |V_kd|, sum_k under_k |V_kd|
  bool ready = false;
  // The LSE weights w'_k (and the sink's, when it is folded into the lse) of head_prepare.
  Eigen::VectorXd wl;
  double sink_wl = 0;
  bool lse_ready = false;
  // exp(x_k - ex_shift) of the head's tokens (exp_of): the LSE weights' and the output
  // weights' exponentials, the same values unless a finite sink above every logit shifts only
  // the latter; each was computed twice (for the sum, then the weights).
  Eigen::VectorXd ex;
  double ex_shift = 0;
  bool ex_ready = false;
  void reset() { ready = lse_ready = ex_ready = false; }
};

// exp(x_k - shift) for the tokens of hs in head h, kept in sh for the last shift asked.
const Eigen::VectorXd& exp_of(const RowTerms& rt, int h, const HeadSubset& hs, double shift,
                              HeadShared& sh) {
  if (sh.ex_ready && sh.ex_shift == shift) return sh.ex;
  const auto x_row = rt.X.row(h).segment(hs.k0, hs.n);
  sh.ex.resize(hs.n);
  for (Eigen::Index k = 0; k < hs.n; ++k) sh.ex(k) = std::exp(x_row(k) - shift);
  sh.ex_shift = shift;
  sh.ex_ready = true;
  return sh.ex;
}

void share_head(const RowTerms& rt, int h, const HeadSubset& hs, HeadShared& sh) {
  const Eigen::Index n = hs.n;
  const auto x_row = rt.X.row(h).segment(hs.k0, n);
  const double sink = hs.sink;
  const bool sink_finite = std::isfinite(sink);
  sh.x_max = x_row.maxCoeff();
  sh.x_min = x_row.minCoeff();
  sh.M = sink_finite ? std::max(sh.x_max, sink) : sh.x_max;
  sh.Z = sink_finite ? std::exp(sink - sh.M) : 0.0;
  const Eigen::VectorXd& ex = exp_of(rt, h, hs, sh.M, sh);
  for (Eigen::Index k = 0; k < n; ++k) sh.Z += ex(k);
  sh.w_s = sink_finite ? std::exp(sink - sh.M) / sh.Z : 0.0;
  sh.w.resize(n);
  sh.under.resize(n);
  for (Eigen::Index k = 0; k < n; ++k) {
    sh.w(k) = ex(k) / sh.Z;
    sh.under(k) = x_row(k) - sh.x_max < kUnderflowArg ? 0x1p-126 : 0.0;
  }
  sh.any_under = (sh.under.array() != 0.0).any();
  sh.wvd.assign(static_cast<size_t>(rt.dv), 0.0);
  sh.uvd.assign(static_cast<size_t>(rt.dv), 0.0);
  for (int32_t d = 0; d < rt.dv; ++d) {
    const Eigen::Map<const Eigen::ArrayXd> v(rt.K.col(d).data() + hs.k0, n);
    sh.wvd[static_cast<size_t>(d)] = (sh.w.array() * v.abs()).sum();
    sh.uvd[static_cast<size_t>(d)] = sh.any_under ? (sh.under.array() * v.abs()).sum() : 0.0;
  }
  sh.ready = true;
}

// One pipeline's terms of a head between its scalar work (head_prepare) and the pass over V
// (head_finish), which every pipeline of the head shares.
struct HeadTail {
  Eigen::VectorXd c;  // w_k expm1(e_k)
  double grow = 0, sink_term = 0, g_num = 0, g_den = 0, abs_base = 0;
  double uk = 0, etak = 0;  // dequantization rounding of V (RowTerms)
  bool bf16_p = false, sink_overflow = false;
  double* ob = nullptr;
};

// The bound of head h of a row for one pipeline up to the pass over V: *lb, and either ob
// (hopeless rows: +inf; a +inf sink: out exactly 0, left 0) with *needs_tail false, or *tail
// for head_finish. Returns e_max (+inf when hopeless). sh: the head's HeadShared for hs
// (computed here when not ready yet).
double head_prepare(const RowTerms& rt, int h, const HeadSubset& hs, HeadShared& sh, double* ob,
                    double* lb, HeadTail* tail, bool* needs_tail) {
  *needs_tail = false;
  const Pipeline& p = rt.p;
  const double u = p.u, s = rt.s;
  const int dqk = rt.dqk, dv = rt.dv, T = hs.T, nt = hs.nt;
  const Eigen::Index n = hs.n;
  const double g_dot = gamma(dqk + 2, p.u_acc);
  // Split-KV: at most ns splits, each adding a product and a sum to O and l; one more rescale
  // argument per token (|m_i - M| <= R), so rescale arguments sum to 2R (derivation in the header).
  const int ns = p.split_kv ? std::min(nt, mla::kMaxSplits) : 0;
  const double r_mult = p.split_kv ? 2.0 : 1.0;
  const double g_num = gamma(T + nt + 2 + 2 * ns, p.u_acc);
  // The division: one rounding, or two (MMA: 1/d, *).
  const double g_den = gamma(T + nt + 5 + 2 * ns, u);
  const double g_lse = gamma(T + nt + 2 + 2 * ns, u);
  const double exp_ulps = (nt + 2) * p.c_exp * u;
  const auto x_row = rt.X.row(h).segment(hs.k0, n);
  const auto a_row = rt.A.row(h).segment(hs.k0, n);
  const double sink = hs.sink;
  const double x_max = x_row.maxCoeff(), x_min = x_row.minCoeff();
  const double R = x_max - x_min;
  Eigen::VectorXd e(n), c(n);
  // Logit errors e_k (model steps 1 and 2).
  for (Eigen::Index k = 0; k < n; ++k) {
    const double x = x_row(k);
    double dx = g_dot * a_row(k) + 2 * u * std::fabs(x) + s * (dqk + 2) * p.eta;
    if (rt.uk > 0) dx += rt.uk * a_row(k) + s * rt.etak * rt.qn1[h];
    e(k) = dx + 2 * u * (std::fabs(x - x_max) + r_mult * R) + exp_ulps;
  }
  const bool sink_pos_inf = sink == kInf;
  const bool sink_finite = std::isfinite(sink);
  const double e_s = sink_finite ? 2 * u * (std::fabs(sink - x_max) + r_mult * R) + exp_ulps : 0.0;
  // Logit errors so large that exp(e) overflows float64 (|x| ~ 1e7 with large scales): the
  // model bounds nothing for this row, so every element's bound is +inf. Handled here, not
  // below, because 0 * exp(e) would otherwise make the bound NaN (found by the mutants run).
  if (e.maxCoeff() > kHopelessLogitError || e_s > kHopelessLogitError) {
    if (!(hs.sink_in_lse && sink_pos_inf) && std::isfinite(hs.lse_ref)) *lb = kInf;
    if (!sink_pos_inf) std::fill(ob, ob + dv, kInf);
    return kInf;
  }

  // LSE weights w' (tokens; the sink too when it is folded into the lse).
  const bool lse_sink = hs.sink_in_lse && sink_finite;
  {
    if (!sh.lse_ready) {  // no pipeline changes them: once per head
      const double Ml = lse_sink ? std::max(x_max, sink) : x_max;
      double zl = lse_sink ? std::exp(sink - Ml) : 0.0;
      const Eigen::VectorXd& ex = exp_of(rt, h, hs, Ml, sh);
      for (Eigen::Index k = 0; k < n; ++k) zl += ex(k);
      sh.sink_wl = lse_sink ? std::exp(sink - Ml) / zl : 0.0;
      sh.wl.resize(n);
      for (Eigen::Index k = 0; k < n; ++k) sh.wl(k) = ex(k) / zl;
      sh.lse_ready = true;
    }
    double up = lse_sink ? sh.sink_wl * std::exp(e_s) : 0.0;
    double down = lse_sink ? sh.sink_wl * std::exp(-e_s) : 0.0;
    for (Eigen::Index k = 0; k < n; ++k) {
      const double wk = sh.wl(k);
      up += wk * std::exp(e(k));
      down += wk * std::exp(-e(k));
    }
    const double lw = std::max(std::log(up), -std::log(down));
    if (!(hs.sink_in_lse && sink_pos_inf) && std::isfinite(hs.lse_ref)) {
      *lb = lw - std::log1p(-g_lse) + p.c_exp * u * (std::fabs(hs.lse_ref) + std::fabs(x_max) + 1) +
            2 * u * std::fabs(hs.lse_ref) + T * p.eta;
    }
  }
  double e_max = e_s;
  for (Eigen::Index k = 0; k < n; ++k) e_max = std::max(e_max, e(k));
  if (sink_pos_inf) return e_max;  // out exactly 0: exp(+inf - m) = inf in the denominator

  // Output weights w (sink in the denominator), shared by the pipelines.
  if (!sh.ready) share_head(rt, h, hs, sh);
  const Eigen::VectorXd& w = sh.w;
  const double w_s = sh.w_s;
  for (Eigen::Index k = 0; k < n; ++k) c(k) = w(k) * std::expm1(e(k));
  tail->c.swap(c);
  tail->grow = std::exp(e_max);
  tail->sink_term = w_s * std::expm1(e_s);
  tail->g_num = g_num;
  tail->g_den = g_den;
  tail->abs_base = p.eta * (T + nt + 4 + 2 * ns);
  tail->uk = rt.uk;
  tail->etak = rt.etak;
  tail->bf16_p = p.bf16_p;
  tail->sink_overflow = sink_finite && sink - x_max > kSinkOverflowArg;
  tail->ob = ob;
  *needs_tail = true;
  return e_max;
}

// sum_k c_i[k] |v[k] - o| for the weights c_i of N tails at once, in one pass over v: per vector
// the order of Eigen's (c.array() * t).sum() with 4-double packets (two accumulators over blocks of
// 8, then a last block of 4, (a0 + a2) + (a1 + a3), then the rest one by one), so the bits of the
// per-vector reductions this replaced on an AVX build; fixed whatever the build, so that one
// pipeline's bound and a set's are the same bits. The products are never negative (c >= 0, |v - o|
// >= 0): starting the sums at +0 changes nothing. Four doubles (GCC/Clang vector extensions: AVX
// registers on x86-64-v3, pairs of SSE ones otherwise); lane-wise IEEE operations, so the same bits
// on every build.
typedef double Lanes4 __attribute__((vector_size(32)));
typedef uint64_t Bits4 __attribute__((vector_size(32)));

inline Lanes4 load4(const double* p) {
  Lanes4 r;
  std::memcpy(&r, p, sizeof r);
  return r;
}

inline Lanes4 abs4(Lanes4 x) {
  const Bits4 mask = {~(uint64_t{1} << 63), ~(uint64_t{1} << 63), ~(uint64_t{1} << 63),
                      ~(uint64_t{1} << 63)};
  return reinterpret_cast<Lanes4>(reinterpret_cast<Bits4>(x) & mask);
}

template <int N>
void weighted_l1(const double* v, double o, Eigen::Index n, HeadTail* const* tails, double* out) {
  const double* c[N];
  for (int i = 0; i < N; ++i) c[i] = tails[i]->c.data();
  Lanes4 a0[N] = {}, a1[N] = {};
  const Lanes4 o4 = {o, o, o, o};
  const Eigen::Index n8 = n / 8 * 8, n4 = n / 4 * 4;
  for (Eigen::Index k = 0; k < n8; k += 8) {
    const Lanes4 t0 = abs4(load4(v + k) - o4), t1 = abs4(load4(v + k + 4) - o4);
    for (int i = 0; i < N; ++i) {
      a0[i] += load4(c[i] + k) * t0;
      a1[i] += load4(c[i] + k + 4) * t1;
    }
  }
  if (n8 > 0) {
    for (int i = 0; i < N; ++i) a0[i] += a1[i];
  }
  if (n4 > n8) {
    const Lanes4 t = abs4(load4(v + n8) - o4);
    for (int i = 0; i < N; ++i) a0[i] += load4(c[i] + n8) * t;
  }
  for (int i = 0; i < N; ++i) {
    double r = (a0[i][0] + a0[i][2]) + (a0[i][1] + a0[i][3]);
    for (Eigen::Index k = n4; k < n; ++k) r += c[i][k] * std::fabs(v[k] - o);
    out[i] = r;
  }
}

void weighted_l1_any(const double* v, double o, Eigen::Index n, HeadTail* const* tails,
                     size_t count, double* out) {
  for (size_t i = 0; i < count; i += 4) {
    switch (std::min<size_t>(count - i, 4)) {
      case 1:
        weighted_l1<1>(v, o, n, tails + i, out + i);
        break;
      case 2:
        weighted_l1<2>(v, o, n, tails + i, out + i);
        break;
      case 3:
        weighted_l1<3>(v, o, n, tails + i, out + i);
        break;
      default:
        weighted_l1<4>(v, o, n, tails + i, out + i);
        break;
    }
  }
}

// The pass over V of one head for every pipeline in tails (each after its head_prepare): per
// element, sum_k c_k |V_kd - O_d| (the weight-error term of step 2, exact in |V - O|; one pass
// over V_d for all pipelines), with the shared sum_k w_k |V_kd| and, when a token may
// underflow, sum_k under_k |V_kd|. V = K.leftCols(dv), column-major: column d is contiguous over
// the tokens. The same expressions per pipeline as one pipeline alone: the same bits.
void head_finish(const RowTerms& rt, const HeadSubset& hs, const HeadShared& sh,
                 HeadTail* const* tails, size_t count, std::vector<double>& wt) {
  if (count == 0) return;
  const Eigen::Index n = hs.n;
  const double* O = hs.O;
  wt.resize(count);
  for (int32_t d = 0; d < rt.dv; ++d) {
    const double od = std::fabs(O[d]);
    weighted_l1_any(rt.K.col(d).data() + hs.k0, O[d], n, tails, count, wt.data());
    const double wvd = sh.wvd[static_cast<size_t>(d)];
    const double uvd = sh.uvd[static_cast<size_t>(d)];
    for (size_t i = 0; i < count; ++i) {
      const HeadTail& tl = *tails[i];
      double first = tl.grow * (wt[i] + tl.sink_term * od);
      first += tl.grow * (tl.g_num * wvd + tl.g_den * od);
      if (tl.bf16_p) first += tl.grow * kU16 * wvd;
      // V's dequantization rounding (V32: every V dim is quantized): sum_k w_k |dV_kd|.
      if (tl.uk > 0) first += tl.grow * (tl.uk * wvd + tl.etak);
      double abs_terms = tl.abs_base + uvd;
      if (tl.sink_overflow) abs_terms += od + wvd;
      tl.ob[d] = first * kSecondOrder + abs_terms;
    }
  }
}

// One pipeline's bound of head h: ob[d_v] and *lb; returns e_max.
double head_bound(const RowTerms& rt, int h, const HeadSubset& hs, double* ob, double* lb) {
  HeadShared sh;
  HeadTail tail;
  bool needs_tail = false;
  const double e_max = head_prepare(rt, h, hs, sh, ob, lb, &tail, &needs_tail);
  if (needs_tail) {
    HeadTail* tails[1] = {&tail};
    std::vector<double> wt;
    head_finish(rt, hs, sh, tails, 1, wt);
  }
  return e_max;
}

// The exact softmax of one head over a subset of the row's valid entries, without the sink:
// the partial output O_i and LSE l_i an LSE-merged kernel computes for one list.
void partial_result(const RowTerms& rt, int h, Eigen::Index k0, Eigen::Index n, double* O,
                    double* lse) {
  const auto x_row = rt.X.row(h).segment(k0, n);
  const double x_max = x_row.maxCoeff();
  const Eigen::ArrayXd p = (x_row.array() - x_max).exp().transpose();
  const double z = p.sum();
  for (int d = 0; d < rt.dv; ++d) {
    const Eigen::Map<const Eigen::ArrayXd> v(rt.K.col(d).data() + k0, n);
    O[d] = (p * v).sum() / z;
  }
  *lse = x_max + std::log(z);
}

// The LSE-merged pipeline (tolerance.h, the production decode): each list's partial bound, its
// bf16 rounding, then the merge of the two partials as two "tokens" with LSE errors dlse_i, the
// sink added at the merge.
void merged_head_bound(const RowTerms& rt, int h, const HeadSubset (&lists)[2], double sink,
                       bool sink_in_lse, const double* O, double lse_ref, double* ob, double* lb) {
  const Pipeline& p = rt.p;
  const double u = p.u;
  const int dv = rt.dv;
  struct Part {
    std::vector<double> O, delta;
    double l = -kInf, dl = 0;
  };
  std::vector<Part> parts;
  bool hopeless = false;
  for (const HeadSubset& li : lists) {
    if (li.n == 0) continue;  // no valid token: weight exactly 0 (LSE -inf)
    Part pt;
    pt.O.assign(static_cast<size_t>(dv), 0.0);
    pt.delta.assign(static_cast<size_t>(dv), 0.0);
    partial_result(rt, h, li.k0, li.n, pt.O.data(), &pt.l);
    HeadSubset sub = li;
    sub.sink = -kInf;
    sub.sink_in_lse = false;
    sub.O = pt.O.data();
    sub.lse_ref = pt.l;
    if (!(head_bound(rt, h, sub, pt.delta.data(), &pt.dl) <= kHopelessLogitError)) {
      hopeless = true;
    }
    parts.push_back(std::move(pt));
  }
  const bool sink_pos_inf = sink == kInf;
  const bool sink_finite = std::isfinite(sink);
  const bool lse_exact = (sink_in_lse && sink_pos_inf) || !std::isfinite(lse_ref);
  if (hopeless) {
    if (!lse_exact) *lb = kInf;
    if (!sink_pos_inf) std::fill(ob, ob + dv, kInf);
    return;
  }
  double l_max = -kInf, l_min = kInf;
  for (const Part& pt : parts) {
    l_max = std::max(l_max, pt.l);
    l_min = std::min(l_min, pt.l);
  }
  if (sink_finite) l_min = std::min(l_min, sink);
  const double M = sink_finite ? std::max(l_max, sink) : l_max;
  const double R = std::max(l_max, M) - l_min;
  // The merge's own arithmetic: l_i - M, exp, the weights' sum and division, two products and a
  // sum per element: c_exp ulps per exp, a few roundings.
  const double merge_exp = 3 * p.c_exp * u;
  std::vector<double> e(parts.size());
  double e_max = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
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
    for (const Part& pt : parts) zl += std::exp(pt.l - Ml);
    double up = lse_sink ? std::exp(sink - Ml) / zl * std::exp(e_s) : 0.0;
    double down = lse_sink ? std::exp(sink - Ml) / zl * std::exp(-e_s) : 0.0;
    for (size_t i = 0; i < parts.size(); ++i) {
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
  for (const Part& pt : parts) Z += std::exp(pt.l - M);
  const double a_s = sink_finite ? std::exp(sink - M) / Z : 0.0;
  const double grow = std::exp(e_max);
  const bool sink_overflow = sink_finite && sink - l_max > kSinkOverflowArg;
  for (int d = 0; d < dv; ++d) {
    const double od = std::fabs(O[d]);
    double weights = a_s * std::expm1(e_s) * od, stored = 0, mags = od, abs_terms = 8 * p.eta;
    for (size_t i = 0; i < parts.size(); ++i) {
      const Part& pt = parts[i];
      const double a = std::exp(pt.l - M) / Z;
      const double oi = std::fabs(pt.O[static_cast<size_t>(d)]);
      const double di = pt.delta[static_cast<size_t>(d)];
      weights += a * std::expm1(e[i]) * std::fabs(pt.O[static_cast<size_t>(d)] - O[d]);
      // The partial's error before its store, and its bf16 rounding (of the computed value).
      stored += a * (di * (1 + kU16) + kU16 * oi);
      mags += a * oi;
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

// Whether e4m3 * scale may round for some valid token of query row r (tolerance.h, step 1):
// a V32 tile scale that is not a power of two, or a power of two 2^p whose products leave the
// range where every one is exact in fp32 and bf16 (p in [-124, 119]: codes are multiples of
// 2^-9 below 448, the smallest bf16 subnormal is 2^-133). MODEL1's ue8m0 scales are taken
// as exact, as the generator keeps them.
bool dequant_rounds(const MaterializedCase& m, int r, const OracleRow& row) {
  if (m.geom.layout != mla::Layout::kV32) return false;
  const int b = r / m.s_q, sq = r % m.s_q;
  const int32_t tiles = mla::num_scale_tiles(m.geom);
  for (const int32_t k : row.k) {
    const bool main = k < m.topk;
    const mla::CacheGeometry& g = main ? m.geom : m.extra_geom;
    const uint8_t* cache = main ? m.cache.data() : m.extra_cache.data();
    const int32_t idx = main ? m.index_at(b, sq, k) : m.extra_index_at(b, sq, k - m.topk);
    const mla::TokenAddress a = mla::token_address(g, idx);
    for (int32_t t = 0; t < tiles; ++t) {
      const uint32_t bits = mla::float_to_bits(mla::tile_scale(g, cache, a, t));
      const int p = static_cast<int>((bits >> 23) & 0xff) - 127;
      const bool pow2 = (bits & 0x7fffffu) == 0 && ((bits >> 23) & 0xff) != 0;
      if (!pow2 || p < -124 || p > 119) return true;
    }
  }
  return false;
}

}  // namespace

std::vector<Bounds> reference_compute_bounds_set(const MaterializedCase& m, const OracleResult& ref,
                                                 const std::vector<BoundsRequest>& requests) {
  const int32_t B = m.query_rows(), H = m.heads, dv = m.d_v(), dqk = m.d_qk();
  const double s = std::fabs(m.sm_scale64);
  // The joint softmax of the production decode (docs/SPEC.md section 8) folds the main list's
  // tiles, then the extra list's: T counts both lists' entries, nt both lists' tiles. The
  // LSE-merged pipeline bounds each list alone and then their merge.
  struct Plan {
    const Pipeline* p;
    int T_main, T_extra, nt;
    bool merged;
    int tiles(int n) const {
      return p->token_tile > 0 ? (n + p->token_tile - 1) / p->token_tile : 1;
    }
  };
  std::vector<Plan> plans;
  std::vector<Bounds> out(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const BoundsRequest& rq = requests[i];
    Plan pl{&rq.pipeline, rq.tile_topk > 0 ? rq.tile_topk : m.topk, m.has_extra ? m.extra_topk : 0,
            0, rq.pipeline.lse_merged && m.has_extra};
    pl.nt = pl.tiles(pl.T_main) +
            (pl.T_extra > 0 && rq.pipeline.token_tile > 0 ? pl.tiles(pl.T_extra) : 0);
    plans.push_back(pl);
    out[i].out.assign(static_cast<size_t>(B) * H * dv, 0.0);
    out[i].lse.assign(static_cast<size_t>(B) * H, 0.0);
  }
  if (requests.empty()) return out;
  // Per row: the gathered cache rows, q and the logits once for every pipeline; per head the
  // pipeline-free terms once (HeadShared).
  HeadShared sh;
  std::vector<HeadTail> tails(plans.size());
  std::vector<HeadSubset> subsets(plans.size());
  std::vector<HeadTail*> tail_ptrs(plans.size());
  size_t n_tails = 0;
  std::vector<double> wt_buf;
  Eigen::VectorXd qn1;
  for (int32_t b = 0; b < B; ++b) {
    const OracleRow row = gather_row(m, b);
    const auto n = static_cast<Eigen::Index>(row.k.size());
    if (n == 0) continue;  // empty row: out exactly 0, lse exactly the convention's infinity
    const Eigen::MatrixXd Q = q_matrix(m, b);
    const Eigen::MatrixXd X = row_logits(m, b, row);                              // [H, n]
    const Eigen::MatrixXd A = s * (Q.cwiseAbs() * row.K.cwiseAbs().transpose());  // [H, n]
    const bool rounds = dequant_rounds(m, b, row);
    if (rounds) qn1 = Q.leftCols(m.geom.nope_dim).cwiseAbs().rowwise().sum();
    for (int32_t h = 0; h < H; ++h) {
      const size_t rh = static_cast<size_t>(b) * H + h;
      const double sink = m.sink.empty() ? -kInf : static_cast<double>(m.sink[h]);
      const double* O = ref.out.data() + rh * dv;
      sh.reset();
      n_tails = 0;
      const HeadSubset* joint = nullptr;
      for (size_t i = 0; i < plans.size(); ++i) {
        const Plan& pl = plans[i];
        RowTerms rt{*pl.p, s, dqk, dv, X, A, row.K};
        if (rounds && pl.p->u_k > 0) {
          rt.uk = pl.p->u_k;
          rt.etak = 2 * pl.p->eta;
          rt.qn1 = qn1.data();
        }
        double* ob = out[i].out.data() + rh * dv;
        if (pl.merged) {
          const HeadSubset lists[2] = {
              {0, row.n_main, pl.T_main, pl.tiles(pl.T_main), -kInf, false, nullptr, 0},
              {row.n_main, n - row.n_main, pl.T_extra, pl.tiles(pl.T_extra), -kInf, false, nullptr,
               0}};
          merged_head_bound(rt, h, lists, sink, m.conv.sink_in_lse, O, ref.lse[rh], ob,
                            &out[i].lse[rh]);
        } else {
          subsets[i] = HeadSubset{
              0, n, pl.T_main + pl.T_extra, pl.nt, sink, m.conv.sink_in_lse, O, ref.lse[rh]};
          bool needs_tail = false;
          head_prepare(rt, h, subsets[i], sh, ob, &out[i].lse[rh], &tails[i], &needs_tail);
          if (needs_tail) tail_ptrs[n_tails++] = &tails[i];
          joint = &subsets[i];
        }
      }
      // Every joint pipeline's subset has the same entries, O and sink: one pass over V.
      if (joint != nullptr) {
        const RowTerms rt{*plans[0].p, s, dqk, dv, X, A, row.K};
        head_finish(rt, *joint, sh, tail_ptrs.data(), n_tails, wt_buf);
      }
    }
  }
  return out;
}

}  // namespace mlafuzz::reference
