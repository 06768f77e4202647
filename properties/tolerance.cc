// The tolerance model (derivation in tolerance.h): the terms of one head in head_prepare and
// HeadFinish (joint softmax) or merged_head_bound (LSE-merged), read next to the derivation.
#include "properties/tolerance.h"

#include <fmt/format.h>

#include <Eigen/Core>
#ifdef __FMA__
#include <immintrin.h>
#endif
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <span>
#include <sstream>
#include <stdexcept>

#include "core/value_format.h"
#include "mla/fp_formats.h"
#include "mla/split_kv.h"
#include "mla/tiling.h"

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
      pl.u_k = 0x1p-24;   // e4m3 * scale rounded once in fp32
      break;
    case Precision::kMmaBf16:
      pl.u = 0x1p-24;
      pl.u_acc = 0x1p-23;  // tensor-core accumulation may truncate instead of rounding
      pl.bf16_p = true;
      pl.bf16_out = true;
      pl.u_k = kU16 + 0x1p-24 + kU16 * 0x1p-24;  // rounded in fp32, then to bf16 for the MMA
      pl.token_tile = mla::kMmaTokenTile;
      pl.eta = 0x1p-126;
      pl.split_kv = true;  // cuda-mma-split*, cpu-mma-split* (and split-KV bf16_mma plugins)
      break;
  }
  return pl;
}

namespace {

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
  // [n_valid, d_v] row-major, vt_ld doubles per token: V = K.leftCols(d_v), token by token (the
  // rows padded so that a row's stride is not a power of two: the rows of a column block do not
  // share a cache set).
  const double* VT = nullptr;
  Eigen::Index vt_ld = 0;
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
  // [d_v] sum_k w_k |V_kd| and sum_k under_k |V_kd|: rows of the products over every head of
  // a row (compute_bounds_set), or this head's own sums (share_head with sums).
  const double* wvd = nullptr;
  const double* uvd = nullptr;
  std::vector<double> wvd_own, uvd_own;
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

// The weights of share_head, without the sums over V.
void share_weights(const RowTerms& rt, int h, const HeadSubset& hs, HeadShared& sh) {
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
}

// The weights and this head's sums over V (one head alone: an LSE-merged kernel's partials).
void share_head(const RowTerms& rt, int h, const HeadSubset& hs, HeadShared& sh) {
  share_weights(rt, h, hs, sh);
  const Eigen::Index n = hs.n;
  sh.wvd_own.assign(static_cast<size_t>(rt.dv), 0.0);
  sh.uvd_own.assign(static_cast<size_t>(rt.dv), 0.0);
  for (int32_t d = 0; d < rt.dv; ++d) {
    const Eigen::Map<const Eigen::ArrayXd> v(rt.K.col(d).data() + hs.k0, n);
    sh.wvd_own[static_cast<size_t>(d)] = (sh.w.array() * v.abs()).sum();
    sh.uvd_own[static_cast<size_t>(d)] = sh.any_under ? (sh.under.array() * v.abs()).sum() : 0.0;
  }
  sh.wvd = sh.wvd_own.data();
  sh.uvd = sh.uvd_own.data();
  sh.ready = true;
}

// expm1(e) for e >= 0 given ex = exp(e) (Eigen's vectorized exp): the Taylor polynomial of degree
// 8 below 2^-5 (truncation below 2^-40 e), ex - 1 above (no cancellation beyond a factor 32): a
// few ulps from std::expm1, in vector registers.
Eigen::ArrayXd expm1_of(const Eigen::ArrayXd& e, const Eigen::ArrayXd& ex) {
  const Eigen::ArrayXd poly =
      e * (1.0 + e * (1.0 / 2 +
                      e * (1.0 / 6 +
                           e * (1.0 / 24 + e * (1.0 / 120 +
                                                e * (1.0 / 720 + e * (1.0 / 5040 + e / 40320)))))));
  return (e < 0x1p-5).select(poly, ex - 1.0);
}

// One pipeline's terms of a head between its scalar work (head_prepare) and the pass over V
// (head_finish), which every pipeline of the head shares.
struct HeadTail {
  Eigen::VectorXd c;  // w_k expm1(e_k)
  double grow = 0, sink_term = 0, g_num = 0, g_den = 0, abs_base = 0;
  double uk = 0, etak = 0;  // dequantization rounding of V (RowTerms)
  bool bf16_p = false, sink_overflow = false;
  double* ob = nullptr;
  // A pipeline whose logit errors are another's (`base`, in the same head_finish call) plus
  // delta >= 0 (the same pipeline over a longer list: more tiles, more exp ulps): its weights
  // w_k expm1(e_k + delta) = exp(delta) c_k + expm1(delta) w_k, so its sum over V is
  // exp(delta) (the base's) + expm1(delta) sum_k w_k |V_kd - O_d|, without a pass of its own.
  const HeadTail* base = nullptr;
  double delta = 0;
  // Set before head_prepare when the base's tail is in the same head_finish call: c is not
  // formed (the derived sum reads the base's and w's).
  bool derived = false;
  // head_prepare's results that depend on the logit errors alone (set when it reaches the tail):
  // a derived tail's are the base's plus delta (every logit error, the sink's too, moves by
  // delta, and so does the LSE weight error, a log of sums of w'_k exp(+-e_k)), the same values
  // up to their last rounding (the base's bits when delta is 0: the same tile count), without
  // forming them again.
  double e_max = 0, e_s = 0, lse_weight_error = 0;
};

// The rounding counts of one pipeline over a list of T entries in nt tiles (tolerance.h, steps
// 1-3 and 5). Split-KV: at most ns splits, each adding a product and a sum to O and l; one more
// rescale argument per token (|m_i - M| <= R), so rescale arguments sum to 2R (derivation in the
// header).
struct ListCounts {
  int ns = 0;
  double r_mult = 1, g_dot = 0, g_num = 0, g_den = 0, g_lse = 0, exp_ulps = 0;
};

ListCounts list_counts(const Pipeline& p, int dqk, int T, int nt) {
  ListCounts c;
  c.g_dot = gamma(dqk + 2, p.u_acc);
  c.ns = p.split_kv ? std::min(nt, mla::kMaxSplits) : 0;
  c.r_mult = p.split_kv ? 2.0 : 1.0;
  c.g_num = gamma(T + nt + 2 + 2 * c.ns, p.u_acc);
  // The division: one rounding, or two (MMA: 1/d, *).
  c.g_den = gamma(T + nt + 5 + 2 * c.ns, p.u);
  c.g_lse = gamma(T + nt + 2 + 2 * c.ns, p.u);
  c.exp_ulps = (nt + 2) * p.c_exp * p.u;
  return c;
}

// The logit errors e_k of head h's tokens in hs (model steps 1 and 2), in the order of the
// terms of the derivation, for logits of largest x_max and range R.
Eigen::ArrayXd logit_errors(const RowTerms& rt, int h, const HeadSubset& hs, const ListCounts& c,
                            double x_max, double R) {
  const Pipeline& p = rt.p;
  const double u = p.u, s = rt.s;
  const Eigen::ArrayXd x = rt.X.row(h).segment(hs.k0, hs.n).transpose().array();
  const Eigen::ArrayXd a = rt.A.row(h).segment(hs.k0, hs.n).transpose().array();
  Eigen::ArrayXd e = c.g_dot * a + 2 * u * x.abs() + s * (rt.dqk + 2) * p.eta;
  if (rt.uk > 0) e = e + (rt.uk * a + s * rt.etak * rt.qn1[h]);
  e = e + 2 * u * ((x - x_max).abs() + c.r_mult * R) + c.exp_ulps;
  return e;
}

// The LSE weights w'_k of head h (the sink's too when it is folded into the lse) into sh, once
// per head: no pipeline changes them.
void share_lse_weights(const RowTerms& rt, int h, const HeadSubset& hs, bool lse_sink, double x_max,
                       HeadShared& sh) {
  if (sh.lse_ready) return;
  const double sink = hs.sink;
  const double Ml = lse_sink ? std::max(x_max, sink) : x_max;
  double zl = lse_sink ? std::exp(sink - Ml) : 0.0;
  const Eigen::VectorXd& ex = exp_of(rt, h, hs, Ml, sh);
  for (Eigen::Index k = 0; k < hs.n; ++k) zl += ex(k);
  sh.sink_wl = lse_sink ? std::exp(sink - Ml) / zl : 0.0;
  sh.wl.resize(hs.n);
  for (Eigen::Index k = 0; k < hs.n; ++k) sh.wl(k) = ex(k) / zl;
  sh.lse_ready = true;
}

// max(log sum_k w'_k exp(e_k), -log sum_k w'_k exp(-e_k)) (the sink a token with error e_s when
// lse_sink), with exp(e_k) into ex_e. Sequential sums of ~1 whose rounding is of the order of a
// float64 pipeline's bound: kept in this order (std::exp, token by token) so that the LSE bounds
// do not move with it.
double lse_weight_error(const HeadShared& sh, const Eigen::ArrayXd& e, double e_s, bool lse_sink,
                        Eigen::ArrayXd& ex_e) {
  double up = lse_sink ? sh.sink_wl * std::exp(e_s) : 0.0;
  double down = lse_sink ? sh.sink_wl * std::exp(-e_s) : 0.0;
  ex_e.resize(e.size());
  for (Eigen::Index k = 0; k < e.size(); ++k) {
    const double wk = sh.wl(k);
    ex_e(k) = std::exp(e(k));
    up += wk * ex_e(k);
    down += wk * std::exp(-e(k));
  }
  return std::max(std::log(up), -std::log(down));
}

// The bound of head h of a row for one pipeline up to the pass over V: *lb, and either ob
// (hopeless rows: +inf; a +inf sink: out exactly 0, left 0) with *needs_tail false, or *tail
// for head_finish. Returns e_max (+inf when hopeless). sh: the head's HeadShared for hs
// (computed here when not ready yet).
double head_prepare(const RowTerms& rt, int h, const HeadSubset& hs, HeadShared& sh, double* ob,
                    double* lb, HeadTail* tail, bool* needs_tail) {
  *needs_tail = false;
  const Pipeline& p = rt.p;
  const double u = p.u;
  const ListCounts c = list_counts(p, rt.dqk, hs.T, hs.nt);
  const auto x_row = rt.X.row(h).segment(hs.k0, hs.n);
  const double sink = hs.sink;
  const double x_max = x_row.maxCoeff();
  const bool sink_pos_inf = sink == kInf;
  const bool sink_finite = std::isfinite(sink);
  const bool lse_bounded = !(hs.sink_in_lse && sink_pos_inf) && std::isfinite(hs.lse_ref);
  // The logit errors e, their largest and the LSE weight error; a derived tail's from its
  // base's (HeadTail::e_max; the base was prepared before it and reached its tail: not hopeless,
  // no +inf sink), unless delta takes them past the hopeless limit.
  Eigen::ArrayXd e, ex_e;  // e_k, exp(e_k)
  double e_s = 0, lw = 0, e_max = 0;
  const HeadTail* base = tail->derived ? tail->base : nullptr;
  const double delta = tail->delta;
  if (base != nullptr && base->e_max + delta <= kHopelessLogitError) {
    e_s = sink_finite ? base->e_s + delta : 0.0;
    lw = base->lse_weight_error + delta;
    e_max = base->e_max + delta;
  } else {
    const double R = x_max - x_row.minCoeff();
    e = logit_errors(rt, h, hs, c, x_max, R);
    e_s = sink_finite ? 2 * u * (std::fabs(sink - x_max) + c.r_mult * R) + c.exp_ulps : 0.0;
    // Logit errors so large that exp(e) overflows float64 (|x| ~ 1e7 with large scales): the
    // model bounds nothing for this row, so every element's bound is +inf. Handled here, not
    // below, because 0 * exp(e) would otherwise make the bound NaN (found by the mutants run).
    if (e.maxCoeff() > kHopelessLogitError || e_s > kHopelessLogitError) {
      if (lse_bounded) *lb = kInf;
      if (!sink_pos_inf) std::fill(ob, ob + rt.dv, kInf);
      return kInf;
    }
    const bool lse_sink = hs.sink_in_lse && sink_finite;
    share_lse_weights(rt, h, hs, lse_sink, x_max, sh);
    lw = lse_weight_error(sh, e, e_s, lse_sink, ex_e);
    e_max = std::max(e_s, e.maxCoeff());
  }
  if (lse_bounded) {
    *lb = lw - std::log1p(-c.g_lse) + p.c_exp * u * (std::fabs(hs.lse_ref) + std::fabs(x_max) + 1) +
          2 * u * std::fabs(hs.lse_ref) + hs.T * p.eta;
  }
  if (sink_pos_inf) return e_max;  // out exactly 0: exp(+inf - m) = inf in the denominator

  // Output weights w (sink in the denominator), shared by the pipelines.
  if (!sh.ready) share_head(rt, h, hs, sh);
  if (!tail->derived) {
    tail->c.resize(hs.n);
    tail->c.array() = sh.w.array() * expm1_of(e, ex_e);
  }
  tail->e_max = e_max;
  tail->e_s = e_s;
  tail->lse_weight_error = lw;
  tail->grow = std::exp(e_max);
  tail->sink_term = sh.w_s * std::expm1(e_s);
  tail->g_num = c.g_num;
  tail->g_den = c.g_den;
  tail->abs_base = p.eta * (hs.T + hs.nt + 4 + 2 * c.ns);
  tail->uk = rt.uk;
  tail->etak = rt.etak;
  tail->bf16_p = p.bf16_p;
  tail->sink_overflow = sink_finite && sink - x_max > kSinkOverflowArg;
  tail->ob = ob;
  *needs_tail = true;
  return e_max;
}

// sum_k c_i[k] |V_kd - o_d| for the weights c_i of N tails at once and the elements d in [d0, d1)
// (out[i][d]), in one pass over the rows of V (vt: row-major, ld doubles per token): eight
// elements at a time in two vectors of four doubles (GCC/Clang vector extensions: AVX registers
// on x86-64-v3, pairs of SSE ones otherwise), each sum taken token by token in order, each
// product added with one rounding (a fused multiply-add) where the build has FMA, with two
// otherwise: the same bits for every call of one build, within a rounding of each other between
// builds.
typedef double Lanes4 __attribute__((vector_size(32)));
typedef uint64_t Bits4 __attribute__((vector_size(32)));

inline Lanes4 load4(const double* p) {
  Lanes4 r;
  std::memcpy(&r, p, sizeof r);
  return r;
}

inline void store4(double* p, Lanes4 x) { std::memcpy(p, &x, sizeof x); }

// acc + c * t.
inline Lanes4 fma4(Lanes4 c, Lanes4 t, Lanes4 acc) {
#ifdef __FMA__
  return reinterpret_cast<Lanes4>(_mm256_fmadd_pd(
      reinterpret_cast<__m256d>(c), reinterpret_cast<__m256d>(t), reinterpret_cast<__m256d>(acc)));
#else
  return acc + c * t;
#endif
}

inline double fma1(double c, double t, double acc) {
#ifdef __FMA__
  return std::fma(c, t, acc);
#else
  return acc + c * t;
#endif
}

inline Lanes4 abs4(Lanes4 x) {
  const Bits4 mask = {~(uint64_t{1} << 63), ~(uint64_t{1} << 63), ~(uint64_t{1} << 63),
                      ~(uint64_t{1} << 63)};
  return reinterpret_cast<Lanes4>(reinterpret_cast<Bits4>(x) & mask);
}

template <int N>
void weighted_l1(const double* vt, Eigen::Index ld, const double* o, Eigen::Index n, int32_t d0,
                 int32_t d1, const double* const* c, double* const* out) {
  int32_t d = d0;
  for (; d + 8 <= d1; d += 8) {
    Lanes4 a0[N], a1[N];
    for (int i = 0; i < N; ++i) a0[i] = a1[i] = Lanes4{0, 0, 0, 0};
    const Lanes4 o0 = load4(o + d), o1 = load4(o + d + 4);
    for (Eigen::Index k = 0; k < n; ++k) {
      const double* v = vt + k * ld + d;
      const Lanes4 t0 = abs4(load4(v) - o0), t1 = abs4(load4(v + 4) - o1);
      for (int i = 0; i < N; ++i) {
        const double ck = c[i][k];
        const Lanes4 c4 = {ck, ck, ck, ck};
        a0[i] = fma4(c4, t0, a0[i]);
        a1[i] = fma4(c4, t1, a1[i]);
      }
    }
    for (int i = 0; i < N; ++i) {
      store4(out[i] + d, a0[i]);
      store4(out[i] + d + 4, a1[i]);
    }
  }
  for (; d < d1; ++d) {
    double a[N] = {};
    for (Eigen::Index k = 0; k < n; ++k) {
      const double t = std::fabs(vt[k * ld + d] - o[d]);
      for (int i = 0; i < N; ++i) a[i] = fma1(c[i][k], t, a[i]);
    }
    for (int i = 0; i < N; ++i) out[i][d] = a[i];
  }
}

#if defined(__FMA__) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define MLAFUZZ_WEIGHTED_L1_V4 1
// Elements [d, d + 8 V) of weighted_l1_v4: V vectors of eight doubles per weight vector, so that
// N V sums are in flight at once (the fused multiply-adds of one sum wait for each other).
template <int N, int V>
__attribute__((target("arch=x86-64-v4"))) inline void weighted_l1_step_v4(
    const double* vt, Eigen::Index ld, const double* o, Eigen::Index n, int32_t d,
    const double* const* c, double* const* out) {
  const __m512d sign = _mm512_set1_pd(-0.0);
  __m512d a[N][V], ov[V];
  for (int i = 0; i < N; ++i) {
    for (int j = 0; j < V; ++j) a[i][j] = _mm512_setzero_pd();
  }
  for (int j = 0; j < V; ++j) ov[j] = _mm512_loadu_pd(o + d + 8 * j);
  for (Eigen::Index k = 0; k < n; ++k) {
    const double* v = vt + k * ld + d;
    __m512d t[V];
    for (int j = 0; j < V; ++j) {
      t[j] = _mm512_andnot_pd(sign, _mm512_sub_pd(_mm512_loadu_pd(v + 8 * j), ov[j]));
    }
    for (int i = 0; i < N; ++i) {
      const __m512d ck = _mm512_set1_pd(c[i][k]);
      for (int j = 0; j < V; ++j) a[i][j] = _mm512_fmadd_pd(ck, t[j], a[i][j]);
    }
  }
  for (int i = 0; i < N; ++i) {
    for (int j = 0; j < V; ++j) _mm512_storeu_pd(out[i] + d + 8 * j, a[i][j]);
  }
}

// weighted_l1 with AVX-512 (chosen at run time): 32 elements at a time in four vectors of eight
// doubles for one or two weight vectors (16 in two for more), then eight, then one at a time;
// per element the same fused multiply-adds in token order as weighted_l1 with FMA, so the same
// bits.
template <int N>
__attribute__((target("arch=x86-64-v4"))) void weighted_l1_v4(const double* vt, Eigen::Index ld,
                                                              const double* o, Eigen::Index n,
                                                              int32_t d0, int32_t d1,
                                                              const double* const* c,
                                                              double* const* out) {
  constexpr int kWide = N <= 2 ? 4 : 2;
  int32_t d = d0;
  for (; d + 8 * kWide <= d1; d += 8 * kWide)
    weighted_l1_step_v4<N, kWide>(vt, ld, o, n, d, c, out);
  for (; d + 8 <= d1; d += 8) weighted_l1_step_v4<N, 1>(vt, ld, o, n, d, c, out);
  for (; d < d1; ++d) {
    double a[N] = {};
    for (Eigen::Index k = 0; k < n; ++k) {
      const double t = std::fabs(vt[k * ld + d] - o[d]);
      for (int i = 0; i < N; ++i) a[i] = std::fma(c[i][k], t, a[i]);
    }
    for (int i = 0; i < N; ++i) out[i][d] = a[i];
  }
}

bool has_v4() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("x86-64-v4");
}
#endif

template <int N>
void weighted_l1_n(const double* vt, Eigen::Index ld, const double* o, Eigen::Index n, int32_t d0,
                   int32_t d1, const double* const* c, double* const* out) {
#ifdef MLAFUZZ_WEIGHTED_L1_V4
  static const bool v4 = has_v4();
  if (v4) {
    weighted_l1_v4<N>(vt, ld, o, n, d0, d1, c, out);
    return;
  }
#endif
  weighted_l1<N>(vt, ld, o, n, d0, d1, c, out);
}

void weighted_l1_any(const double* vt, Eigen::Index ld, const double* o, Eigen::Index n, int32_t d0,
                     int32_t d1, const double* const* c, double* const* out, size_t count) {
  for (size_t i = 0; i < count; i += 4) {
    switch (std::min<size_t>(count - i, 4)) {
      case 1:
        weighted_l1_n<1>(vt, ld, o, n, d0, d1, c + i, out + i);
        break;
      case 2:
        weighted_l1_n<2>(vt, ld, o, n, d0, d1, c + i, out + i);
        break;
      case 3:
        weighted_l1_n<3>(vt, ld, o, n, d0, d1, c + i, out + i);
        break;
      default:
        weighted_l1_n<4>(vt, ld, o, n, d0, d1, c + i, out + i);
        break;
    }
  }
}

// The pass over V of one head for every pipeline in tails (each after its head_prepare): per
// element, sum_k c_k |V_kd - O_d| (the weight-error term of step 2, exact in |V - O|; one pass
// over V_d for all pipelines), with the shared sum_k w_k |V_kd| and, when a token may
// underflow, sum_k under_k |V_kd|. V = K.leftCols(dv), column-major: column d is contiguous over
// the tokens. The same expressions per pipeline as one pipeline alone: the same bits.
struct HeadFinish {
  const HeadSubset* hs = nullptr;
  const HeadShared* sh = nullptr;
  std::vector<HeadTail*> tails;  // every pipeline's of the head
  // The passes over V: every tail whose base is not among tails, and the weights w when some
  // tail is derived from its base (at[i]: tail i's sum in wt, -1 for a derived one, whose base
  // is tails[base_at[i]]).
  std::vector<HeadTail*> own;
  std::vector<int> at, base_at;
  int w_at = -1;
  HeadTail w_tail;
  std::vector<double> scale, shift;  // exp(delta), expm1(delta)
  Eigen::MatrixXd sums;              // [d_v, own]: sum_k c_k |V_kd - O_d| of each pass
  std::vector<const double*> c;
  std::vector<double*> sum_at;
  std::vector<double> derived_l1;  // a derived tail's sums of the block (run)

  // Sets up the passes of tails (each after its head_prepare) for head hs.
  void plan(const HeadSubset& subset, const HeadShared& shared, HeadTail* const* t, size_t count) {
    hs = &subset;
    sh = &shared;
    tails.assign(t, t + count);
    own.clear();
    at.assign(count, -1);
    base_at.assign(count, -1);
    for (size_t i = 0; i < count; ++i) {
      if (tails[i]->derived) {  // its base is an earlier one of tails (prepare_head)
        base_at[i] =
            static_cast<int>(std::find(tails.begin(), tails.end(), tails[i]->base) - tails.begin());
        continue;
      }
      at[i] = static_cast<int>(own.size());
      own.push_back(tails[i]);
    }
    w_at = -1;
    if (own.size() < count) {
      w_tail.c = shared.w;
      w_at = static_cast<int>(own.size());
      own.push_back(&w_tail);
    }
    scale.resize(count);
    shift.resize(count);
    for (size_t i = 0; i < count; ++i) {
      scale[i] = std::exp(tails[i]->delta);
      shift[i] = std::expm1(tails[i]->delta);
    }
    c.clear();
    for (const HeadTail* t2 : own) c.push_back(t2->c.data());
  }

  // The output bounds of elements [d0, d1): per element, sum_k c_k |V_kd - O_d| (the
  // weight-error term of step 2, exact in |V - O|; one pass over V_d for all pipelines), with
  // the shared sum_k w_k |V_kd| and, when a token may underflow, sum_k under_k |V_kd|. V =
  // K.leftCols(dv), column-major: column d is contiguous over the tokens.
  void run(const RowTerms& rt, int32_t d0, int32_t d1) {
    if (tails.empty()) return;
    const Eigen::Index n = hs->n;
    const auto nd = static_cast<Eigen::Index>(d1 - d0);
    if (sums.rows() != rt.dv || sums.cols() != static_cast<Eigen::Index>(own.size())) {
      sums.resize(rt.dv, static_cast<Eigen::Index>(own.size()));
    }
    sum_at.clear();
    for (Eigen::Index i = 0; i < sums.cols(); ++i) sum_at.push_back(sums.col(i).data());
    weighted_l1_any(rt.VT + hs->k0 * rt.vt_ld, rt.vt_ld, hs->O, n, d0, d1, c.data(), sum_at.data(),
                    own.size());
    const double* o = hs->O + d0;
    const double* wvd = sh->wvd + d0;
    const double* uvd = sh->uvd + d0;
    derived_l1.resize(static_cast<size_t>(nd));
    for (size_t i = 0; i < tails.size(); ++i) {
      const HeadTail& tl = *tails[i];
      const double* l1 = derived_l1.data();
      if (at[i] >= 0) {
        l1 = sums.col(at[i]).data() + d0;
      } else {
        const double* sb = sums.col(at[base_at[i]]).data() + d0;
        const double* sw = sums.col(w_at).data() + d0;
        for (Eigen::Index d = 0; d < nd; ++d) derived_l1[d] = scale[i] * sb[d] + shift[i] * sw[d];
      }
      // The element's terms, one expression after the other as they read (the build does not
      // contract products and sums, so these are the bits of the same sums formed array by
      // array); one pass over the block instead of one per term.
      const bool bf16_p = tl.bf16_p, uk = tl.uk > 0, sink_overflow = tl.sink_overflow;
      const double grow = tl.grow, grow_u16 = tl.grow * kU16;
      double* ob = tl.ob + d0;
      for (Eigen::Index d = 0; d < nd; ++d) {
        const double od = std::fabs(o[d]);
        double first = grow * (l1[d] + tl.sink_term * od);
        first = first + grow * (tl.g_num * wvd[d] + tl.g_den * od);
        if (bf16_p) first = first + grow_u16 * wvd[d];
        // V's dequantization rounding (V32: every V dim is quantized): sum_k w_k |dV_kd|.
        if (uk) first = first + grow * (tl.uk * wvd[d] + tl.etak);
        double abs_terms = tl.abs_base + uvd[d];
        if (sink_overflow) abs_terms = abs_terms + (od + wvd[d]);
        ob[d] = first * kSecondOrder + abs_terms;
      }
    }
  }
};

// One pipeline's bound of head h: ob[d_v] and *lb; returns e_max.
double head_bound(const RowTerms& rt, int h, const HeadSubset& hs, double* ob, double* lb) {
  HeadShared sh;
  HeadTail tail;
  bool needs_tail = false;
  const double e_max = head_prepare(rt, h, hs, sh, ob, lb, &tail, &needs_tail);
  if (needs_tail) {
    HeadTail* tails[1] = {&tail};
    HeadFinish finish;
    finish.plan(hs, sh, tails, 1);
    finish.run(rt, 0, rt.dv);
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

// One list's exact partial (O_i, l_i) of an LSE-merged head and its bound (delta_i, dl_i).
struct Part {
  std::vector<double> O, delta;
  double l = -kInf, dl = 0;
};

// The partials of head h's lists that have a valid token (a list without one has weight exactly
// 0, LSE -inf), each bounded by the model alone without the sink. Returns false when some
// partial's model bounds nothing (hopeless).
bool partial_bounds(const RowTerms& rt, int h, const HeadSubset (&lists)[2],
                    std::vector<Part>& parts) {
  const auto dv = static_cast<size_t>(rt.dv);
  bool hopeless = false;
  for (const HeadSubset& li : lists) {
    if (li.n == 0) continue;
    Part pt;
    pt.O.assign(dv, 0.0);
    pt.delta.assign(dv, 0.0);
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
  return !hopeless;
}

// Step 2 of the merge, with the partials and the sink as the "tokens": their shift M, the range
// R of their LSEs, and the errors e_i of their exp arguments (e_s the sink's).
struct MergeErrors {
  double l_max = -kInf, M = 0, e_s = 0, e_max = 0;
  std::vector<double> e;
};

MergeErrors merge_errors(const Pipeline& p, const std::vector<Part>& parts, double sink) {
  const double u = p.u;
  const bool sink_finite = std::isfinite(sink);
  MergeErrors me;
  double l_min = kInf;
  for (const Part& pt : parts) {
    me.l_max = std::max(me.l_max, pt.l);
    l_min = std::min(l_min, pt.l);
  }
  if (sink_finite) l_min = std::min(l_min, sink);
  me.M = sink_finite ? std::max(me.l_max, sink) : me.l_max;
  const double R = std::max(me.l_max, me.M) - l_min;
  // The merge's own arithmetic: l_i - M, exp, the weights' sum and division, two products and a
  // sum per element: c_exp ulps per exp, a few roundings.
  const double merge_exp = 3 * p.c_exp * u;
  me.e.resize(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    me.e[i] = parts[i].dl + 2 * u * (std::fabs(parts[i].l - me.M) + R) + merge_exp;
    me.e_max = std::max(me.e_max, me.e[i]);
  }
  me.e_s = sink_finite ? 2 * u * (std::fabs(sink - me.M) + R) + merge_exp : 0.0;
  me.e_max = std::max(me.e_max, me.e_s);
  return me;
}

// The merged LSE's bound: the model's with the partials as tokens, plus the merge's log.
double merged_lse_bound(const Pipeline& p, const std::vector<Part>& parts, const MergeErrors& me,
                        double sink, bool sink_in_lse, double lse_ref) {
  const double u = p.u;
  const bool lse_sink = sink_in_lse && std::isfinite(sink);
  const double Ml = lse_sink ? me.M : me.l_max;
  double zl = lse_sink ? std::exp(sink - Ml) : 0.0;
  for (const Part& pt : parts) zl += std::exp(pt.l - Ml);
  double up = lse_sink ? std::exp(sink - Ml) / zl * std::exp(me.e_s) : 0.0;
  double down = lse_sink ? std::exp(sink - Ml) / zl * std::exp(-me.e_s) : 0.0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const double wi = std::exp(parts[i].l - Ml) / zl;
    up += wi * std::exp(me.e[i]);
    down += wi * std::exp(-me.e[i]);
  }
  const double lw = std::max(std::log(up), -std::log(down));
  return lw - std::log1p(-gamma(6, u)) + p.c_exp * u * (std::fabs(lse_ref) + std::fabs(Ml) + 1) +
         2 * u * std::fabs(lse_ref) + 8 * p.eta;
}

// The merged output's bound ob[d_v] (finite sink or none) against the exact O.
void merged_out_bound(const Pipeline& p, int dv, const std::vector<Part>& parts,
                      const MergeErrors& me, double sink, const double* O, double* ob) {
  const bool sink_finite = std::isfinite(sink);
  const double M = me.M;
  double Z = sink_finite ? std::exp(sink - M) : 0.0;
  for (const Part& pt : parts) Z += std::exp(pt.l - M);
  const double a_s = sink_finite ? std::exp(sink - M) / Z : 0.0;
  const double grow = std::exp(me.e_max);
  const double g_merge = gamma(6, p.u);
  const bool sink_overflow = sink_finite && sink - me.l_max > kSinkOverflowArg;
  for (int d = 0; d < dv; ++d) {
    const double od = std::fabs(O[d]);
    double weights = a_s * std::expm1(me.e_s) * od, stored = 0, mags = od, abs_terms = 8 * p.eta;
    for (size_t i = 0; i < parts.size(); ++i) {
      const Part& pt = parts[i];
      const double a = std::exp(pt.l - M) / Z;
      const double oi = std::fabs(pt.O[static_cast<size_t>(d)]);
      const double di = pt.delta[static_cast<size_t>(d)];
      weights += a * std::expm1(me.e[i]) * std::fabs(pt.O[static_cast<size_t>(d)] - O[d]);
      // The partial's error before its store, and its bf16 rounding (of the computed value).
      stored += a * (di * (1 + kU16) + kU16 * oi);
      mags += a * oi;
      // A partial whose merge weight may be subnormal or flushed.
      if (pt.l - me.l_max < kUnderflowArg) abs_terms += 0x1p-126 * (oi + di);
    }
    if (sink_overflow) abs_terms += od + mags;
    // The computed weights are a_i exp(eps_i) / Z~ with Z~ >= exp(-e_max): at most a_i
    // exp(2 e_max) on the stored partials' errors.
    ob[d] =
        (grow * weights + grow * grow * stored + grow * g_merge * mags) * kSecondOrder + abs_terms;
  }
}

// The LSE-merged pipeline (tolerance.h, the production decode): each list's partial bound, its
// bf16 rounding, then the merge of the two partials as two "tokens" with LSE errors dlse_i, the
// sink added at the merge.
void merged_head_bound(const RowTerms& rt, int h, const HeadSubset (&lists)[2], double sink,
                       bool sink_in_lse, const double* O, double lse_ref, double* ob, double* lb) {
  std::vector<Part> parts;
  const bool bounded = partial_bounds(rt, h, lists, parts);
  const bool sink_pos_inf = sink == kInf;
  const bool lse_exact = (sink_in_lse && sink_pos_inf) || !std::isfinite(lse_ref);
  const MergeErrors me = bounded ? merge_errors(rt.p, parts, sink) : MergeErrors{};
  if (!bounded || me.e_max > kHopelessLogitError) {
    if (!lse_exact) *lb = kInf;
    if (!sink_pos_inf) std::fill(ob, ob + rt.dv, kInf);
    return;
  }
  if (!lse_exact) *lb = merged_lse_bound(rt.p, parts, me, sink, sink_in_lse, lse_ref);
  if (sink_pos_inf) return;  // out exactly 0
  merged_out_bound(rt.p, rt.dv, parts, me, sink, O, ob);
}

// Whether e4m3 * scale may round for some valid token of query row r (tolerance.h, step 1):
// a V32 tile scale that is not a power of two, or a power of two 2^p whose products leave the
// range where every one is exact in fp32 and bf16 (p in [-124, 119]: codes are multiples of
// 2^-9 below 448, the smallest bf16 subnormal is 2^-133). MODEL1's ue8m0 scales are taken
// as exact, as the generator keeps them.
bool dequant_rounds(const MaterializedCase& m, int r, const int32_t* ks, Eigen::Index n) {
  if (m.geom.layout != mla::Layout::kV32) return false;
  const int b = r / m.s_q, sq = r % m.s_q;
  const int32_t tiles = mla::num_scale_tiles(m.geom);
  for (const int32_t k : std::span(ks, static_cast<size_t>(n))) {
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

// One request of compute_bounds_set. The joint softmax of the production decode (docs/SPEC.md
// section 8) folds the main list's tiles, then the extra list's: T counts both lists' entries, nt
// both lists' tiles. The LSE-merged pipeline bounds each list alone and then their merge.
struct Plan {
  const Pipeline* p;
  int T_main, T_extra, nt;
  bool merged;
  int tiles(int n) const { return p->token_tile > 0 ? (n + p->token_tile - 1) / p->token_tile : 1; }
};

Plan plan_of(const MaterializedCase& m, const BoundsRequest& rq) {
  if (rq.extra_topk >= 0 && rq.pipeline.lse_merged) {
    throw std::invalid_argument(
        "compute_bounds: an LSE-merged pipeline bounds each list alone; it cannot take another "
        "extra list length (extra_topk " +
        std::to_string(rq.extra_topk) + ")");
  }
  const int extra = rq.extra_topk >= 0 ? rq.extra_topk : (m.has_extra ? m.extra_topk : 0);
  Plan pl{&rq.pipeline, rq.tile_topk > 0 ? rq.tile_topk : m.topk, extra, 0,
          rq.pipeline.lse_merged && m.has_extra};
  pl.nt = pl.tiles(pl.T_main) +
          (pl.T_extra > 0 && rq.pipeline.token_tile > 0 ? pl.tiles(pl.T_extra) : 0);
  return pl;
}

bool same_pipeline(const Pipeline& a, const Pipeline& b) {
  return a.precision == b.precision && a.u == b.u && a.u_acc == b.u_acc && a.bf16_p == b.bf16_p &&
         a.bf16_out == b.bf16_out && a.token_tile == b.token_tile && a.eta == b.eta &&
         a.c_exp == b.c_exp && a.lse_merged == b.lse_merged && a.split_kv == b.split_kv &&
         a.u_k == b.u_k;
}

// What every pipeline reads of one query row, taken from the oracle's row (OracleRowView): q, the
// logits X and A = s |q| . |K|, the dequantization terms, and V = K.leftCols(d_v) token by token
// (VT, vt_ld doubles per token: the oracle's row-major keys, or a copy whose rows are padded
// where the keys' row stride is a multiple of 4 KiB, so that the rows of a column block do not
// share a cache set). K column-major (Kc) only for the LSE-merged pipelines' per-head sums.
struct RowInputs {
  int32_t r = 0;
  Eigen::Index n = 0, n_main = 0;
  const double* out = nullptr;  // [H, d_v] the oracle's output of the row
  const double* lse = nullptr;  // [H]
  Eigen::MatrixXd Q, X, A, Kc;
  bool rounds = false;
  Eigen::VectorXd qn1;
  Eigen::MatrixXd VT_copy;
  const double* VT = nullptr;
  Eigen::Index vt_ld = 0;
};

// compute_bounds_set, one oracle row at a time: per row the oracle's keys, q and logits for
// every pipeline (RowInputs); per head the pipeline-free terms once (HeadShared), their sums
// over V for every head of the row at once (two matrix products: W |V| and, where a token may
// underflow, U |V|); per head and pipeline the scalar work (head_prepare, or merged_head_bound);
// then the passes over V of every head, a block of V's columns at a time (the block stays in
// cache while every head reads it).
class BoundsSetBuilder {
 public:
  BoundsSetBuilder(const MaterializedCase& m, std::vector<BoundsRequest> requests);
  BoundsSetBuilder(const BoundsSetBuilder&) = delete;  // plans_ and tails_ point into itself
  BoundsSetBuilder& operator=(const BoundsSetBuilder&) = delete;
  void visit(const OracleRowView& v);
  std::vector<Bounds> take() { return std::move(out_); }

 private:
  void link_longer_lists();
  void load_row(const OracleRowView& v);
  void share_row_weights();
  void prepare_head(int32_t h);
  void run_passes();
  RowTerms row_terms(const Plan& pl) const;
  double sink_of(int32_t h) const {
    return m_.sink.empty() ? -kInf : static_cast<double>(m_.sink[h]);
  }

  using RowMajor = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const MaterializedCase& m_;
  const std::vector<BoundsRequest> requests_;
  const int32_t H_, dv_, dqk_;
  const double s_;
  std::vector<Plan> plans_;
  size_t P_ = 0;
  std::vector<Bounds> out_;
  bool any_joint_ = false, any_merged_ = false;
  RowInputs in_;
  std::vector<HeadShared> shared_;
  Eigen::MatrixXd W_, U_, absK_;
  RowMajor WV_, UV_;
  // Per head of a row: each pipeline's tail (tails_[h * P_ + i]), the joint subset and the
  // head's passes over V.
  std::vector<HeadTail> tails_;
  std::vector<HeadSubset> subsets_;
  std::vector<HeadTail*> tail_ptrs_;
  std::vector<HeadFinish> finish_;
  std::vector<char> has_finish_;
};

// Bound buffers handed back by recycle_bounds, for the next bounds of the process. A case's
// bounds are megabytes (rows x heads x d_v doubles per request, ~7 requests), and a fresh
// allocation of megabytes is mapped by the allocator and faulted in page by page: in a
// 1000-case host-model campaign on a 2-core VM that setup took more time than the oracle (the
// bounds step with it 7.8 ms per case, 5.9-6.6 ms with the pool; bench/RESULTS.md). Buffers
// below kMinBytes are left to malloc's own free lists; at most kMaxBytes stay pooled (the oldest
// are freed first), so an idle process keeps at most that much.
class BufferPool {
 public:
  // A buffer of n doubles whose values are unspecified (its last owner's): the smallest pooled
  // one that holds n, else a new one.
  std::vector<double> take(size_t n) {
    std::vector<double> v;
    if (n * sizeof(double) >= kMinBytes) {
      const std::lock_guard<std::mutex> lock(mu_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->capacity() >= n && (best == free_.end() || it->capacity() < best->capacity())) {
          best = it;
        }
      }
      if (best != free_.end()) {
        bytes_ -= best->capacity() * sizeof(double);
        v = std::move(*best);
        free_.erase(best);
      }
    }
    // A new buffer gets room to the next power of two: generated cases grow over a campaign, and
    // a buffer of exactly the last case's size would fit no larger one.
    if (v.capacity() < n && n * sizeof(double) >= kMinBytes) v.reserve(std::bit_ceil(n));
    v.resize(n);
    return v;
  }
  void give(std::vector<double>&& v) {
    const size_t bytes = v.capacity() * sizeof(double);
    if (bytes < kMinBytes || bytes > kMaxBytes) return;
    std::vector<std::vector<double>> drop;  // freed outside the lock
    const std::lock_guard<std::mutex> lock(mu_);
    while (bytes_ + bytes > kMaxBytes) {
      bytes_ -= free_.front().capacity() * sizeof(double);
      drop.push_back(std::move(free_.front()));
      free_.erase(free_.begin());
    }
    bytes_ += bytes;
    free_.push_back(std::move(v));
  }

 private:
  static constexpr size_t kMinBytes = size_t{64} << 10;
  static constexpr size_t kMaxBytes = size_t{256} << 20;
  std::mutex mu_;
  std::vector<std::vector<double>> free_;  // oldest first
  size_t bytes_ = 0;
};

BufferPool& buffer_pool() {
  // Never destroyed: a case that ends during the process's exit still has a pool to recycle to.
  static BufferPool* pool = new BufferPool;
  return *pool;
}

BoundsSetBuilder::BoundsSetBuilder(const MaterializedCase& m, std::vector<BoundsRequest> requests)
    : m_(m),
      requests_(std::move(requests)),
      H_(m.heads),
      dv_(m.d_v()),
      dqk_(m.d_qk()),
      s_(std::fabs(m.sm_scale64)) {
  const auto rows = static_cast<size_t>(m.query_rows());
  out_.resize(requests_.size());
  for (size_t i = 0; i < requests_.size(); ++i) {
    plans_.push_back(plan_of(m, requests_[i]));
    out_[i].out = buffer_pool().take(rows * H_ * dv_);  // each row zeroed when visited
    out_[i].lse = buffer_pool().take(rows * H_);
  }
  P_ = plans_.size();
  for (const Plan& pl : plans_) {
    any_joint_ |= !pl.merged;
    any_merged_ |= pl.merged;
  }
  shared_.resize(static_cast<size_t>(H_));
  tails_.resize(static_cast<size_t>(H_) * P_);
  subsets_.resize(static_cast<size_t>(H_));
  tail_ptrs_.resize(P_);
  finish_.resize(static_cast<size_t>(H_));
  has_finish_.resize(static_cast<size_t>(H_));
  link_longer_lists();
}

// A joint plan that differs from an earlier one only in its list length (insert-invalid's
// longer list) takes its sums over V from that one's (HeadTail::base).
void BoundsSetBuilder::link_longer_lists() {
  for (size_t i = 0; i < P_; ++i) {
    for (size_t j = 0; j < i && !plans_[i].merged; ++j) {
      if (plans_[j].merged || (H_ > 0 && tails_[j].base != nullptr) ||
          plans_[j].nt > plans_[i].nt || !same_pipeline(*plans_[i].p, *plans_[j].p)) {
        continue;
      }
      const Pipeline& p = *plans_[i].p;
      for (size_t h = 0; h < static_cast<size_t>(H_); ++h) {
        tails_[h * P_ + i].base = &tails_[h * P_ + j];
        tails_[h * P_ + i].delta =
            (plans_[i].nt + 2) * p.c_exp * p.u - (plans_[j].nt + 2) * p.c_exp * p.u;
      }
      break;
    }
  }
}

// |K| column-major ([n, d] in `out`) of the row-major keys k (d doubles per token), eight columns
// at a time so that each cache line of k read stays in L1 while its eight values are copied.
void abs_transposed(const double* k, Eigen::Index n, Eigen::Index d, Eigen::MatrixXd& out) {
  out.resize(n, d);
  double* o = out.data();
  Eigen::Index j0 = 0;
  for (; j0 + 8 <= d; j0 += 8) {
    for (Eigen::Index i = 0; i < n; ++i) {
      const double* src = k + i * d + j0;
      for (Eigen::Index j = 0; j < 8; ++j) o[(j0 + j) * n + i] = std::fabs(src[j]);
    }
  }
  for (; j0 < d; ++j0) {
    for (Eigen::Index i = 0; i < n; ++i) o[j0 * n + i] = std::fabs(k[i * d + j0]);
  }
}

// RowInputs of a non-empty oracle row.
void BoundsSetBuilder::load_row(const OracleRowView& v) {
  const Eigen::Index n = v.n;
  in_.r = v.row;
  in_.n = n;
  in_.n_main = v.n_main;
  in_.out = v.out;
  in_.lse = v.lse;
  const Eigen::Map<const RowMajor> K(v.K, n, dqk_);
  in_.Q = Eigen::Map<const RowMajor>(v.Q, H_, dqk_);
  in_.X = Eigen::Map<const Eigen::MatrixXd>(v.X, H_, n);  // [H, n]
  // |K| column-major (the products' kernels, and so their bits, depend on the storage order).
  // A matrix-vector product (one head or one token) takes the path it takes for the expression
  // |K|^T of a column-major K, which differs from that of a plain matrix.
  abs_transposed(v.K, n, dqk_, absK_);
  if (H_ == 1 || n == 1) {
    in_.A = s_ * (in_.Q.cwiseAbs() * absK_.cwiseAbs().transpose());  // [H, n]
  } else {
    in_.A = s_ * (in_.Q.cwiseAbs() * absK_.transpose());
  }
  in_.rounds = dequant_rounds(m_, v.row, v.k, n);
  if (in_.rounds) in_.qn1 = in_.Q.leftCols(m_.geom.nope_dim).cwiseAbs().rowwise().sum();
  if (any_merged_) in_.Kc = K;
  if (dqk_ % 512 != 0) {
    in_.VT = v.K;
    in_.vt_ld = dqk_;
  } else {
    in_.VT_copy.resize(dv_ + 8, n);
    for (Eigen::Index k = 0; k < n; ++k) {
      std::copy_n(v.K + k * dqk_, dv_, in_.VT_copy.data() + k * (dv_ + 8));
    }
    in_.VT = in_.VT_copy.data();
    in_.vt_ld = dv_ + 8;
  }
}

// The joint softmax weights of every head of the row and their sums over |V| (W |V|, U |V|).
void BoundsSetBuilder::share_row_weights() {
  const Eigen::Index n = in_.n;
  const RowTerms rt{*plans_[0].p, s_, dqk_, dv_, in_.X, in_.A, in_.Kc};
  W_.resize(H_, n);
  U_.resize(H_, n);
  bool any_under = false;
  for (int32_t h = 0; h < H_; ++h) {
    HeadShared& sh = shared_[static_cast<size_t>(h)];
    sh.reset();
    HeadSubset hs;
    hs.n = n;
    hs.sink = sink_of(h);
    share_weights(rt, h, hs, sh);
    W_.row(h) = sh.w.transpose();
    U_.row(h) = sh.under.transpose();
    any_under |= sh.any_under;
  }
  // |V|: the first d_v columns of |K| in place (the same product as of a copy of them).
  const auto absV = absK_.leftCols(dv_);
  WV_.noalias() = W_ * absV;
  if (any_under) {
    UV_.noalias() = U_ * absV;
  } else {
    UV_.setZero(H_, dv_);
  }
  for (int32_t h = 0; h < H_; ++h) {
    HeadShared& sh = shared_[static_cast<size_t>(h)];
    sh.wvd = WV_.row(h).data();
    sh.uvd = UV_.row(h).data();
    sh.ready = true;
  }
}

RowTerms BoundsSetBuilder::row_terms(const Plan& pl) const {
  RowTerms rt{*pl.p, s_, dqk_, dv_, in_.X, in_.A, in_.Kc};
  rt.VT = in_.VT;
  rt.vt_ld = in_.vt_ld;
  if (in_.rounds && pl.p->u_k > 0) {
    rt.uk = pl.p->u_k;
    rt.etak = 2 * pl.p->eta;
    rt.qn1 = in_.qn1.data();
  }
  return rt;
}

// Head h of the row for every pipeline: the merged ones' bounds whole, the joint ones' up to
// the pass over V (their tails, planned in finish_[h]).
void BoundsSetBuilder::prepare_head(int32_t h) {
  const size_t rh = static_cast<size_t>(in_.r) * H_ + h;
  const Eigen::Index n = in_.n, n_main = in_.n_main;
  const double sink = sink_of(h);
  const double* O = in_.out + static_cast<size_t>(h) * dv_;
  const double lse_ref = in_.lse[h];
  HeadShared& sh = shared_[static_cast<size_t>(h)];
  size_t n_tails = 0;
  bool joint = false;
  for (size_t i = 0; i < P_; ++i) {
    const Plan& pl = plans_[i];
    const RowTerms rt = row_terms(pl);
    double* ob = out_[i].out.data() + rh * dv_;
    if (pl.merged) {
      const HeadSubset lists[2] = {
          {0, n_main, pl.T_main, pl.tiles(pl.T_main), -kInf, false, nullptr, 0},
          {n_main, n - n_main, pl.T_extra, pl.tiles(pl.T_extra), -kInf, false, nullptr, 0}};
      merged_head_bound(rt, h, lists, sink, m_.conv.sink_in_lse, O, lse_ref, ob, &out_[i].lse[rh]);
    } else {
      // Every joint pipeline's subset has the same entries, O and sink (its T and nt are the
      // last pipeline's: the pass over V reads neither).
      HeadSubset& hs = subsets_[static_cast<size_t>(h)];
      hs = HeadSubset{0, n, pl.T_main + pl.T_extra, pl.nt, sink, m_.conv.sink_in_lse, O, lse_ref};
      bool needs_tail = false;
      HeadTail* tail = &tails_[static_cast<size_t>(h) * P_ + i];
      tail->derived = tail->base != nullptr &&
                      std::find(tail_ptrs_.begin(), tail_ptrs_.begin() + n_tails, tail->base) !=
                          tail_ptrs_.begin() + n_tails;
      head_prepare(rt, h, hs, sh, ob, &out_[i].lse[rh], tail, &needs_tail);
      if (needs_tail) tail_ptrs_[n_tails++] = tail;
      joint = true;
    }
  }
  has_finish_[static_cast<size_t>(h)] = joint && n_tails > 0;
  if (has_finish_[static_cast<size_t>(h)]) {
    finish_[static_cast<size_t>(h)].plan(subsets_[static_cast<size_t>(h)], sh, tail_ptrs_.data(),
                                         n_tails);
  }
}

// The passes over V of every head of the row, a block of columns (about 256 KiB of V, a
// multiple of 32: weighted_l1_v4's widest step) at a time.
void BoundsSetBuilder::run_passes() {
  const RowTerms rt = row_terms(Plan{plans_[0].p, 0, 0, 0, false});
  const int32_t block =
      static_cast<int32_t>(std::clamp<Eigen::Index>(32768 / in_.n / 32 * 32, 32, 512));
  for (int32_t d0 = 0; d0 < dv_; d0 += block) {
    const int32_t d1 = std::min(dv_, d0 + block);
    for (int32_t h = 0; h < H_; ++h) {
      if (has_finish_[static_cast<size_t>(h)]) finish_[static_cast<size_t>(h)].run(rt, d0, d1);
    }
  }
}

// An empty row keeps its bounds 0: out exactly 0, lse exactly the convention's infinity. The
// oracle visits every row once: the row's bounds start at 0 here, in cache for the writes that
// follow, rather than in one pass over every row's when the buffers are taken.
void BoundsSetBuilder::visit(const OracleRowView& v) {
  const size_t rh = static_cast<size_t>(v.row) * H_;
  for (Bounds& b : out_) {
    std::fill_n(b.out.begin() + static_cast<std::ptrdiff_t>(rh * dv_), H_ * dv_, 0.0);
    std::fill_n(b.lse.begin() + static_cast<std::ptrdiff_t>(rh), H_, 0.0);
  }
  if (plans_.empty() || v.n == 0) return;
  load_row(v);
  if (any_joint_) share_row_weights();
  for (int32_t h = 0; h < H_; ++h) prepare_head(h);
  run_passes();
}

// Adapts the builder to the oracle's visitor interface.
class BuilderVisitor final : public OracleRowVisitor {
 public:
  explicit BuilderVisitor(BoundsSetBuilder& b) : b_(b) {}
  void visit(const OracleRowView& v) override { b_.visit(v); }

 private:
  BoundsSetBuilder& b_;
};

}  // namespace

std::vector<Bounds> compute_bounds_set(const MaterializedCase& m, const OracleResult& ref,
                                       const std::vector<BoundsRequest>& requests) {
  BoundsSetBuilder builder(m, requests);
  if (requests.empty()) return builder.take();
  BuilderVisitor visitor(builder);
  visit_oracle_rows(m, ref, visitor);
  return builder.take();
}

struct BoundsSetVisitor::Impl {
  Impl(const MaterializedCase& m, std::vector<BoundsRequest> requests)
      : builder(m, std::move(requests)) {}
  BoundsSetBuilder builder;
  std::mutex mu;  // rows visited from several oracle threads take turns
};

BoundsSetVisitor::BoundsSetVisitor(const MaterializedCase& m, std::vector<BoundsRequest> requests)
    : impl_(std::make_unique<Impl>(m, std::move(requests))) {}

BoundsSetVisitor::~BoundsSetVisitor() = default;

void BoundsSetVisitor::visit(const OracleRowView& row) {
  const std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->builder.visit(row);
}

std::vector<Bounds> BoundsSetVisitor::take() { return impl_->builder.take(); }

Bounds compute_bounds(const MaterializedCase& m, const OracleResult& ref, const Pipeline& p,
                      int tile_topk, int extra_topk) {
  return std::move(compute_bounds_set(m, ref, {BoundsRequest{p, tile_topk, extra_topk}})[0]);
}

Pipeline pipeline_of(const Backend& be) {
  Pipeline pl = pipeline_for(be.traits().precision);
  pl.lse_merged = be.traits().extra_pipeline == ExtraPipeline::kLseMerged;
  // The backend's own tile where it is not the precision's (cpu-mma-small, cuda-mma-small: 32):
  // its online-softmax tile boundaries, whose count nt enters every rounding term.
  if (be.traits().token_tile > 0 && pl.token_tile > 0) pl.token_tile = be.traits().token_tile;
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

void recycle_bounds(Bounds&& b) {
  buffer_pool().give(std::move(b.out));
  buffer_pool().give(std::move(b.lse));
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
[[gnu::always_inline]] inline void bf16_interval_finite(double v, double* lo, double* hi) {
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

// The finite-element figures of one row of d_v outputs in one loop without branches that the
// compiler vectorizes: per element the excess over the sides' rounding intervals and the error
// (excess[], err[]), and over the row whether every value of both sides is finite, whether any
// excess is positive, the largest error and the largest |b| (maxima over the bits as int64:
// value order for values >= 0). Only a row finite on both sides uses the figures. Then, for a row
// with a positive excess, the ratio of the excess to the bound (bound + plus) in t[] and its
// largest value (row_ratios; the other rows' ratios are all 0 and their bounds are not read).
// The division is computed for every element, also where the ratio is 0 or +inf (tolerance.cc is
// compiled with -fno-trapping-math, properties/CMakeLists.txt).
struct RowFigures {
  bool finite = false, any_excess = false;
  double err_max = 0, ref_max = 0;
};

[[gnu::always_inline]] inline int64_t bits_of(double v) { return std::bit_cast<int64_t>(v); }

template <bool kBf16A, bool kBf16B>
[[gnu::always_inline]] inline RowFigures row_excess_body(const double* ao, const double* bo,
                                                         int32_t n, double* excess, double* err) {
  constexpr int64_t kExponent = 0x7ff0000000000000;
  int64_t off = 0, err_max = 0, ref_max = 0;
  int any = 0;
  for (int32_t i = 0; i < n; ++i) {
    const double va = ao[i], vb = bo[i];
    off |= static_cast<int64_t>((bits_of(va) & kExponent) == kExponent) |
           static_cast<int64_t>((bits_of(vb) & kExponent) == kExponent);
    double alo = va, ahi = va, blo = vb, bhi = vb;
    if constexpr (kBf16A) bf16_interval_finite(va, &alo, &ahi);
    if constexpr (kBf16B) bf16_interval_finite(vb, &blo, &bhi);
    const double x = blo - ahi, y = alo - bhi;
    const double m = x < y ? y : x;  // std::max({x, y, 0.0})
    const double e = m < 0.0 ? 0.0 : m;
    excess[i] = e;
    any |= e > 0;
    const double d = std::fabs(va - vb);
    err[i] = d;
    const int64_t db = bits_of(d), rb = bits_of(std::fabs(vb));
    err_max = err_max < db ? db : err_max;
    ref_max = ref_max < rb ? rb : ref_max;
  }
  return RowFigures{off == 0, any != 0, std::bit_cast<double>(err_max),
                    std::bit_cast<double>(ref_max)};
}

template <bool kBf16A, bool kBf16B>
RowFigures row_excess(const double* ao, const double* bo, int32_t n, double* excess, double* err) {
  return row_excess_body<kBf16A, kBf16B>(ao, bo, n, excess, err);
}

#ifdef MLAFUZZ_WEIGHTED_L1_V4
// row_excess with AVX-512 (chosen at run time): the same operations per element, so the same
// figures.
template <bool kBf16A, bool kBf16B>
__attribute__((target("arch=x86-64-v4"))) RowFigures row_excess_v4(const double* ao,
                                                                   const double* bo, int32_t n,
                                                                   double* excess, double* err) {
  return row_excess_body<kBf16A, kBf16B>(ao, bo, n, excess, err);
}
#endif

// The ratios t[] and their largest value (>= 0: no ratio is NaN).
template <bool kPlus>
double row_ratios(const double* excess, const double* bd, const double* plus, int32_t n,
                  double* t) {
  int64_t t_max = 0;
  for (int32_t i = 0; i < n; ++i) {
    double bound = bd[i];
    if constexpr (kPlus) bound += plus[i];
    const double q = excess[i] / bound;  // ratio(excess, bound)
    const double r = bound > 0 ? q : kInf;
    const double ti = excess[i] <= 0 ? 0.0 : r;
    t[i] = ti;
    const int64_t tb = bits_of(ti);
    t_max = t_max < tb ? tb : t_max;
  }
  return std::bit_cast<double>(t_max);
}

using RowExcessFn = RowFigures (*)(const double*, const double*, int32_t, double*, double*);

RowExcessFn row_excess_for(bool bf16_a, bool bf16_b) {
  const int i = (bf16_a ? 2 : 0) + (bf16_b ? 1 : 0);
#ifdef MLAFUZZ_WEIGHTED_L1_V4
  static constexpr RowExcessFn kFnsV4[4] = {row_excess_v4<false, false>, row_excess_v4<false, true>,
                                            row_excess_v4<true, false>, row_excess_v4<true, true>};
  static const bool v4 = has_v4();
  if (v4) return kFnsV4[i];
#endif
  static constexpr RowExcessFn kFns[4] = {row_excess<false, false>, row_excess<false, true>,
                                          row_excess<true, false>, row_excess<true, true>};
  return kFns[i];
}

// sum + x[0] + x[1] + ... + x[n - 1] added left to right, each addition rounded, for finite
// x[i] >= 0 of largest value max_x. When every partial sum of every order is exact (sum and
// every x[i] multiples of 2^s, and sum + n max_x below 2^(52 + s)), the order does not matter
// and Eigen sums in vectorized order; otherwise one addition after the other. Differences of
// two bf16 values within about 2^30 of each other (a comparison of two bf16 runs) take the
// first way.
double add_in_order(double sum, const double* x, int32_t n, double max_x, bool try_exact) {
  if (try_exact && n > 0) {
    const double top = sum + static_cast<double>(n) * max_x;  // >= every partial sum (rounding
                                                              // aside: the margin is 2x)
    if (top > 0 && top < 0x1p1000) {
      // 2^(52 + s) > top: s = ilogb(top) - 51, scale = 2^-s.
      const int e = std::ilogb(top) - 51;
      if (e > -1000) {
        // x a multiple of 2^s: floor(x 2^-s) 2^s == x (also false where x 2^-s underflows).
        const double scale = std::ldexp(1.0, -e), unit = std::ldexp(1.0, e);
        int off = std::floor(sum * scale) * unit != sum;
        for (int32_t i = 0; i < n; ++i) off |= std::floor(x[i] * scale) * unit != x[i];
        if (off == 0) return sum + Eigen::Map<const Eigen::ArrayXd>(x, n).sum();
      }
    }
  }
  for (int32_t i = 0; i < n; ++i) sum += x[i];
  return sum;
}

// check_bounds over one pair of sides: every figure as a loop over the elements in the order
// (b, h, d) then the row's lse would give it: the worst element is the first with the largest
// ratio, the mean sums the errors in that order. A row finite on both sides goes through
// row_excess and row_ratios (vectorized) and then a loop that adds its errors in order
// (add_in_order: in any order where every partial sum is exact); a row with a non-finite value
// element by element, with the message for the first class mismatch.
class BoundChecker {
 public:
  BoundChecker(const Side& a, const Side& b, const Bounds& bound, const Bounds* plus, int32_t heads,
               int32_t d_v);
  void check_row(int32_t bb, int32_t hh);
  BoundCheck result();

 private:
  // The figures of one finite out element of the row (as row_excess and row_ratios compute
  // them).
  struct Element {
    double va, vb, excess, err, bound, t;
  };
  double out_bound(size_t i) const {
    return plus_ != nullptr ? bound_.out[i] + plus_->out[i] : bound_.out[i];
  }
  double lse_bound(size_t i) const {
    return plus_ != nullptr ? bound_.lse[i] + plus_->lse[i] : bound_.lse[i];
  }
  bool finite_pair(double va, double vb, int bb, int hh, int dd);
  void record(double t, double va, double vb, double err, double excess, double bnd, int bb, int hh,
              int dd);
  const double* out_row(const Side& s, size_t rh, std::vector<double>& buf) const;
  double lse_of(const Side& s, size_t rh) const;
  Element figures_at(int32_t dd) const;
  void element(int32_t bb, int32_t hh, int32_t dd);
  void finite_row(int32_t bb, int32_t hh, const RowFigures& f);
  void lse_element(int32_t bb, int32_t hh, size_t rh);

  const Side& a_;
  const Side& b_;
  const Bounds& bound_;
  const Bounds* plus_;
  const int32_t heads_, d_v_;
  const bool a_bf16_, b_bf16_;
  const RowExcessFn excesses_;
  BoundCheck r_;
  double sum_abs_ = 0, max_abs_ = 0, out_max_ref_ = 0, lse_max_abs_ = 0;
  double out_tightness_ = 0, lse_tightness_ = 0, worst_ = 0;
  int64_t n_abs_ = 0;
  bool any_ = false, passed_ = true;
  // A row of a side as doubles: its out vector's, or its raw bf16 values widened into the row
  // buffer. The row now compared: ao_, bo_, its first element in the bounds row_.
  std::vector<double> a_row_, b_row_, t_, err_, excess_;
  const double* ao_ = nullptr;
  const double* bo_ = nullptr;
  size_t row_ = 0;
};

BoundChecker::BoundChecker(const Side& a, const Side& b, const Bounds& bound, const Bounds* plus,
                           int32_t heads, int32_t d_v)
    : a_(a),
      b_(b),
      bound_(bound),
      plus_(plus),
      heads_(heads),
      d_v_(d_v),
      a_bf16_(a.out_bf16),
      b_bf16_(b.out_bf16),
      excesses_(row_excess_for(a.out_bf16, b.out_bf16)) {
  r_.bf16_outputs = a.out_bf16;
  const auto dv = static_cast<size_t>(d_v);
  a_row_.resize(dv);
  b_row_.resize(dv);
  t_.resize(dv);
  err_.resize(dv);
  excess_.resize(dv);
}

bool BoundChecker::finite_pair(double va, double vb, int bb, int hh, int dd) {
  if (std::isfinite(va) && std::isfinite(vb)) return true;
  const int ca = finite_class(va), cb = finite_class(vb);
  if (ca != cb) {
    if (r_.nonfinite_match) {
      const ValueFormat fa = !a_.out_bf16 ? ValueFormat::kFp64
                             : dd >= 0    ? ValueFormat::kBf16
                                          : ValueFormat::kFp32;
      std::ostringstream os;
      os << (dd >= 0 ? "out[b=" : "lse[b=") << bb << ",h=" << hh;
      if (dd >= 0) os << ",d=" << dd;
      os << "]: " << class_name(ca) << " (" << format_value(va, fa) << ") where the reference is "
         << class_name(cb) << " (" << format_value(vb, ValueFormat::kFp64) << ")";
      r_.nonfinite_detail = os.str();
    }
    r_.nonfinite_match = false;
    passed_ = false;
  }
  return false;
}

void BoundChecker::record(double t, double va, double vb, double err, double excess, double bnd,
                          int bb, int hh, int dd) {
  worst_ = std::max(worst_, t);
  any_ = true;
  r_.b = bb;
  r_.h = hh;
  r_.d = dd;
  r_.value = va;
  r_.reference = vb;
  r_.error = err;
  r_.excess = excess;
  r_.bound = bnd;
}

const double* BoundChecker::out_row(const Side& s, size_t rh, std::vector<double>& buf) const {
  if (s.out != nullptr) return s.out->data() + rh * d_v_;
  const auto r = static_cast<int64_t>(rh) / heads_, h = static_cast<int64_t>(rh) % heads_;
  const uint16_t* raw = s.out_raw + OutputBuffers::kGuard + r / s.s_q * s.out_batch_stride +
                        r % s.s_q * s.out_token_stride + h * s.out_head_stride;
  for (int32_t d = 0; d < d_v_; ++d) buf[static_cast<size_t>(d)] = mla::bf16_to_float(raw[d]);
  return buf.data();
}

double BoundChecker::lse_of(const Side& s, size_t rh) const {
  if (s.lse != nullptr) return (*s.lse)[rh];
  const auto r = static_cast<int64_t>(rh) / heads_, h = static_cast<int64_t>(rh) % heads_;
  return s.lse_raw[OutputBuffers::kGuard + r / s.s_q * s.lse_batch_stride +
                   r % s.s_q * s.lse_token_stride + h];
}

BoundChecker::Element BoundChecker::figures_at(int32_t dd) const {
  const size_t at = row_ + static_cast<size_t>(dd);
  Element e{ao_[dd], bo_[dd], 0, 0, out_bound(at), 0};
  double alo = e.va, ahi = e.va, blo = e.vb, bhi = e.vb;
  if (a_bf16_) bf16_rounding_interval(e.va, &alo, &ahi);
  if (b_bf16_) bf16_rounding_interval(e.vb, &blo, &bhi);
  e.excess = std::max({blo - ahi, alo - bhi, 0.0});
  e.err = std::fabs(e.va - e.vb);
  e.t = ratio(e.excess, e.bound);
  return e;
}

// One out element the slow way: a row with a non-finite value.
void BoundChecker::element(int32_t bb, int32_t hh, int32_t dd) {
  if (!finite_pair(ao_[dd], bo_[dd], bb, hh, dd)) return;
  const Element e = figures_at(dd);
  out_tightness_ = std::max(out_tightness_, e.t);
  sum_abs_ += e.err;
  ++n_abs_;
  max_abs_ = std::max(max_abs_, e.err);
  out_max_ref_ = std::max(out_max_ref_, std::fabs(e.vb));
  if (e.t > worst_ || !any_) record(e.t, e.va, e.vb, e.err, e.excess, e.bound, bb, hh, dd);
  if (e.t > 1) passed_ = false;
}

// A row finite on both sides (its figures f and excess_, err_ from row_excess), in vectorized
// loops.
void BoundChecker::finite_row(int32_t bb, int32_t hh, const RowFigures& f) {
  double max_t = 0;
  if (f.any_excess) {
    const double* pl = plus_ != nullptr ? plus_->out.data() + row_ : nullptr;
    if (pl != nullptr) {
      max_t = row_ratios<true>(excess_.data(), bound_.out.data() + row_, pl, d_v_, t_.data());
    } else {
      max_t = row_ratios<false>(excess_.data(), bound_.out.data() + row_, pl, d_v_, t_.data());
    }
  }
  // The maxima (no NaN: the row is finite, the ratios are >= 0 or +inf) in any order; the sum as
  // the loop's order gives it (the mean's bits).
  const double row_max = f.err_max;
  max_abs_ = std::max(max_abs_, row_max);
  out_max_ref_ = std::max(out_max_ref_, f.ref_max);
  sum_abs_ = add_in_order(sum_abs_, err_.data(), d_v_, row_max, a_bf16_ && b_bf16_);
  n_abs_ += d_v_;
  out_tightness_ = std::max(out_tightness_, max_t);
  if (max_t > worst_ || !any_) {
    // The element an element-by-element loop records last: the first with the row's largest
    // ratio (also when nothing was recorded before: the ratios are >= 0). (All ratios 0: the
    // first element; t_ not computed.)
    int32_t at = 0;
    while (max_t > 0 && at + 1 < d_v_ && !(t_[static_cast<size_t>(at)] == max_t)) ++at;
    const Element e = figures_at(at);
    record(e.t, e.va, e.vb, e.err, e.excess, e.bound, bb, hh, at);
  }
  if (max_t > 1) passed_ = false;
}

void BoundChecker::lse_element(int32_t bb, int32_t hh, size_t rh) {
  const double va = lse_of(a_, rh), vb = lse_of(b_, rh);
  if (!finite_pair(va, vb, bb, hh, -1)) return;
  const double err1 = std::fabs(va - vb);  // the excess too: lse values are exact
  const double bnd = lse_bound(rh);
  const double t1 = ratio(err1, bnd);
  lse_tightness_ = std::max(lse_tightness_, t1);
  lse_max_abs_ = std::max(lse_max_abs_, err1);
  if (t1 > worst_ || !any_) record(t1, va, vb, err1, err1, bnd, bb, hh, -1);
  if (t1 > 1) passed_ = false;
}

void BoundChecker::check_row(int32_t bb, int32_t hh) {
  const size_t rh = static_cast<size_t>(bb) * heads_ + hh;
  row_ = rh * d_v_;
  ao_ = out_row(a_, rh, a_row_);
  bo_ = out_row(b_, rh, b_row_);
  const RowFigures f = excesses_(ao_, bo_, d_v_, excess_.data(), err_.data());
  if (d_v_ > 0 && f.finite) {
    finite_row(bb, hh, f);
  } else {
    for (int32_t dd = 0; dd < d_v_; ++dd) element(bb, hh, dd);
  }
  lse_element(bb, hh, rh);
}

BoundCheck BoundChecker::result() {
  r_.passed = passed_;
  r_.tightness = worst_;
  r_.max_abs = max_abs_;
  r_.out_max_ref = out_max_ref_;
  r_.lse_max_abs = lse_max_abs_;
  r_.out_tightness = out_tightness_;
  r_.lse_tightness = lse_tightness_;
  r_.mean_abs = n_abs_ > 0 ? sum_abs_ / static_cast<double>(n_abs_) : 0;
  r_.max_rel = r_.out_max_ref > 0 ? r_.max_abs / r_.out_max_ref : 0;
  return r_;
}

}  // namespace

BoundCheck check_bounds(const Side& a, const Side& b, const Bounds& bound, int32_t batch,
                        int32_t heads, int32_t d_v) {
  return check_bounds(a, b, bound, nullptr, batch, heads, d_v);
}

BoundCheck check_bounds(const Side& a, const Side& b, const Bounds& bound, const Bounds* plus,
                        int32_t batch, int32_t heads, int32_t d_v) {
  BoundChecker checker(a, b, bound, plus, heads, d_v);
  for (int32_t bb = 0; bb < batch; ++bb) {
    for (int32_t hh = 0; hh < heads; ++hh) checker.check_row(bb, hh);
  }
  return checker.result();
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
  // format (two LSEs that differ in the last bit never read "8.66268 vs 8.66268").
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
