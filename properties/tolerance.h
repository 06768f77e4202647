// THE tolerance model of mlafuzz: per-element error bounds for out and lse, derived from each
// backend's precision pipeline (SPEC.md sections 4 and 5). Every tolerance the properties apply
// comes from here; nothing else in the project compares numbers against a constant.
//
// Notation for one batch row b and head h: valid tokens k (n of them) in a top-k list of length
// T folded in nt = ceil(T / tile) online-softmax tiles; q and K_k exact (bf16 q, e4m3 * 2^e K,
// bf16 rope); s = the fp32 sm_scale; x_k = s <q, K_k> (the oracle's logits); M the max of the
// valid logits and a finite sink; w_k = exp(x_k - M) / (sum_j exp(x_j - M) + exp(sink - M)) and
// w_s the sink's share (the oracle's softmax weights, sink in the denominator); O_d = sum w_k V_kd
// the oracle's output; u the pipeline's unit roundoff, gamma(m) = m u / (1 - m u).
//
// 1. Logits. Any summation order of d_qk products, with or without FMA, plus the scale multiply
//    (MMA: after the product; SIMT: q*s rounded to fp32 first) and a possible multiply by log2(e)
//    for exp2: |dx_k| <= gamma(d_qk + 2; u_acc) * A_k + 2u |x_k| + s (d_qk + 2) eta,
//    A_k = s sum_d |q_d K_kd|. u_acc = 2u for MMA: tensor cores may truncate when they
//    accumulate. eta = 2^-126 absolute per operation allows flush-to-zero of subnormals.
// 2. Softmax weights. Each computed weight is exp(x_k + eps_k - m) with |eps_k| <= e_k,
//    e_k = |dx_k| + 2u(|x_k - x_max| + R) + (nt + 2) c_exp u: the logit error, the rounding of
//    the exp argument (twice: a possible log2(e) multiply), the drift of the nt online-softmax
//    rescales (their arguments sum to at most R = x_max - x_min) and c_exp ulps per exp call.
//    The sink is a token with V = 0 and e_s without the logit term. Exactly (not to first order):
//      O~ - O = [sum_k w_k (exp(eps_k) - 1)(V_k - O) - w_s (exp(eps_s) - 1) O] / Z,
//      Z = sum_j w_j exp(eps_j) >= exp(-e_max),
//    so |dO_d| <= exp(e_max) [sum_k w_k expm1(e_k) |V_kd - O_d| + w_s expm1(e_s) |O_d|].
// 3. Accumulation: the numerator sum_k p_k V_kd over T tokens and nt rescales (u_acc), the row
//    sum l, the sink add and the division (u; the MMA kernel's reciprocal and product count
//    two): gamma(T + nt + 2; u_acc) sum_k w_k |V_kd| + gamma(T + nt + 5; u) |O_d|, times
//    exp(e_max) for the weight perturbation.
// 4. MMA only: p rounded to bf16 for P*V (l keeps fp32 p): u16 sum_k w_k |V_kd|, u16 = 2^-8.
// 5. Underflow: eta (T + nt + 4) absolute; tokens with x_k - x_max < -80 whose p may be
//    subnormal or flushed: 2^-126 sum_k |V_kd| over those tokens; a finite sink more than 80
//    above every logit may overflow exp in fp32 (the kernel's max excludes the sink), flushing
//    out to 0: |O_d| + sum_k w_k |V_kd| more.
// Sum of 2-4 times (1 + 2^-20) (second-order terms), plus 5, is delta_pre: the bound on the
// output before the store. The bf16 store is modelled exactly instead of with u16 |O_d|: the
// kernel stores k = RNE(O^), so O^ lies in k's rounding interval [k - ulp_below/2, k + ulp/2],
// and the test is dist(O, interval(k)) <= delta_pre. error/bound = dist / delta_pre is 0 when
// k = RNE(O) and exceeds 1 exactly when no O^ within delta_pre of O rounds to k. (An additive
// u16 |O_d| term would put every correct kernel near tightness 1 at values just above a power
// of two; this form keeps the margin visible.)
// LSE (fp32, no store rounding): lse~ - lse = log(sum_k w'_k exp(eps_k)) with w' the weights
// without the sink (with it when Conventions::sink_in_lse), so
//   |dlse| <= max(log(sum w'_k exp(e_k)), -log(sum w'_k exp(-e_k))) - log1p(-gamma(T + nt + 2; u))
//             + c_exp u (|lse| + |x_max| + 1) + 2u |lse| + T eta.
// Exact cases: a row without valid tokens must give out exactly 0 and lse exactly the
// convention's infinity; a +inf sink out exactly 0 (and lse +inf when sink_in_lse). Positions
// of +inf, -inf and NaN must match the oracle's everywhere.
// The float64 oracle's own error is the same model with u = 2^-53 and no tiles; it is added to
// every bound (oracle-loop against the oracle: twice that).
// The production decode (SPEC.md section 8) computes every (batch row, query token) as its own
// row over T(b, s), the valid entries of the main and the extra list. A joint-softmax kernel
// (FlashMLA) folds the main list's tiles, then the extra list's, through one online softmax: the
// model above with T = topk + extra_topk entries and nt = ceil(topk / tile) + ceil(extra_topk /
// tile) tiles (one more set of tiles). An LSE-merged kernel (SGLang's Triton path,
// MLAFUZZ_EXTRA_LSE_MERGED) computes each list alone, stores each partial output O_i in bf16
// with its fp32 LSE l_i, then merges out = sum_i a_i O~_i, a_i = exp(l_i - M) / (sum_j exp(l_j -
// M) + exp(sink - M)), and rounds to bf16 again (Pipeline::lse_merged, from
// Backend::extra_pipeline()). Its bound is the model above applied to each list alone, without
// the sink (delta_i, dlse_i against the list's exact O_i and l_i; T and nt that list's), plus the
// first bf16 rounding of the computed partial, u16 (|O_i| + delta_i), plus step 2 with the two
// partials and the sink as the "tokens" (e_i = dlse_i + 2u (|l_i - M| + R) + 3 c_exp u: the
// merge's exp and fp32 rounding): exp(e_max) [sum_i a_i expm1(e_i) |O_i - O| + a_s expm1(e_s)
// |O|], plus exp(2 e_max) sum_i a_i (delta_i (1 + u16) + u16 |O_i|) (a computed weight is at most
// a_i exp(e_i) / exp(-e_max)), plus the merge's products and sums, gamma(6) (sum_i a_i |O_i| +
// |O|); the second rounding is modelled by the store interval as for every bf16 output. A list
// without a valid token has weight exactly 0. The merged LSE is bounded as in the model with the
// partials as tokens: max(log sum w'_i exp(e_i), -log sum w'_i exp(-e_i)) plus the merge's log.
// Split-KV (issue 17; kernels/common/split_kv.h; the MMA pipeline, Pipeline::split_kv): the
// row's nt tiles are cut into ns <= min(nt, mla::kMaxSplits) splits, each folded by its own
// online softmax into an fp32 partial (m_i, l_i, O_i), merged as M = max m_i, a_i = exp(m_i - M),
// L = sum a_i l_i, O = sum a_i O_i, then the unsplit epilogue. Against the unsplit pipeline a
// token's weight gains one factor a_i: one more exp argument, m_i - M, with |m_i - M| <= R, so
// the rescale arguments a token goes through sum to at most 2R (within its split <= R, the merge
// <= R): step 2 uses 2u(|x_k - x_max| + 2R); the exp calls on its path are its own, at most
// (tiles of its split - 1) rescales and a_i: at most nt + 1, within the (nt + 2) already
// counted. Steps 3 and 5 count 2 ns more roundings (the product a_i * O_i and the sum over the
// splits, and the same for l): gamma(T + nt + 2 + 2ns; u_acc) and gamma(T + nt + 5 + 2ns; u),
// the LSE's gamma(T + nt + 2 + 2ns; u), eta (T + nt + 4 + 2ns). A split without a valid token
// has weight exactly 0 and is skipped (exact), so empty splits add nothing; a merge weight that
// underflows (m_i - M < -87) loses only tokens with x_k - x_max < -80, which step 5 already
// allows for. The bound takes ns = min(nt, kMaxSplits), the most any split count can give: one
// bound covers 1 split, the automatic rule and one split per tile alike (the split-agree
// property compares them), and any bf16_mma plugin that splits (FlashMLA does). The unsplit
// kernel's bound grows by these terms too, well under 1% of it (the bf16-p term 2^-8 sum w|V|
// dominates).
// kCustom (plugins): abs_tol + rel_tol |ref| per element, as the plugin declares.
//
// Evaluation: one set of sums for every pipeline (BoundTerms). Step 2's per-token weights are
// not summed per pipeline. With A_k and x_k as above, lambda = 2 / (d_qk + 2) and
//   f_k = A_k + lambda (|x_k| + |x_k - x_max|),
// every pipeline's e_k <= alpha f_k + delta, alpha = gamma(d_qk + 2; u_acc) (alpha lambda >=
// 2 u_acc >= 2u covers the 2u |x_k| and 2u |x_k - x_max| terms), delta = s (d_qk + 2) eta +
// 2u r R + (nt + 2) c_exp u (r = 2 with split-KV, else 1). expm1 is convex with expm1(0) = 0,
// so expm1(e) <= e phi(E) for 0 <= e <= E, phi(E) = expm1(E) / E (increasing); with E = alpha
// max_k f_k + delta >= e_max (or alpha max A + 2u max(|x| + |x - x_max|) + delta, the smaller):
//   sum_k w_k expm1(e_k) |V_kd - O_d| <= phi(E) (alpha G1_d + delta G0_d),
//   G1_d = sum_k w_k f_k |V_kd - O_d|,  G0_d = sum_k w_k |V_kd - O_d|,
// and exp(E) replaces exp(e_max). The LSE, with the weights w' (summing to 1 with the sink's
// when it is folded in) and e_k <= alpha A_k + 2u X_k + delta (X_k = |x_k| + |x_k - x_max|):
// log sum_k w'_k exp(e_k) <= log1p(min(phi(E) S1, S1 + phi2(E) S2 / 2)) (expm1(e) <= e +
// phi2(E) e^2 / 2, phi2(E) = 2 (expm1(E) - E) / E^2) and -log sum_k w'_k exp(-e_k) <= S1
// (Jensen), S1 >= sum_k w'_k e_k and S2 >= sum_k w'_k e_k^2 formed from the sums of w'_k times
// A, X, 1, A^2, A X and X^2. G1, G0, W_d = sum_k w_k |V_kd|, the underflow sums and the LSE's
// sums depend on no pipeline and on no list length: one pass over V per query row for every
// head, reading the keys and logits the oracle formed (run_oracle_eigen's row visitor), and any
// joint pipeline's bound, also for a variant with the same valid tokens in other lists (inserted
// -1 entries, entries moved to the extra list), is a few operations per element. Against the
// per-token sums the bounds are larger by phi(E) / phi(e_k) <= 1 + (E - e_k) / 2 per token, by
// up to 2 u_acc - 2u more per unit of X_k in e_k (MMA: u_acc = 2u), and by exp(E) / exp(e_max):
// ~1e-4 relative where e is small, up to ~10% in heads whose logit errors reach 0.1
// (tests/properties/model_test.cc pins both against the per-token form). A is formed as an upper
// bound (a float product of |q| and |K| rounded up, times 1 + gamma(2 d_qk + 16; 2^-24)), and
// the pass's sums in float where a row's values allow, each raised to a bound on the exact sum
// (tolerance.cc, float_pass); float64 sums in any order are within the second-order slack.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/core/backend.h"
#include "harness/core/materialize.h"
#include "oracle/oracle.h"

namespace mlafuzz {

// Error-model parameters of one precision pipeline.
struct Pipeline {
  Precision precision = Precision::kFloat64;
  double u = 0x1p-53;       // unit roundoff of the arithmetic
  double u_acc = 0x1p-53;   // of the dot products and the P*V accumulation
  bool bf16_p = false;      // p rounded to bf16 for P*V (MMA)
  bool bf16_out = false;    // out stored as bf16 with round-to-nearest-even
  int token_tile = 0;       // tokens per online-softmax tile; 0: one tile for the whole list
  double eta = 0;           // absolute allowance per operation for subnormals / flush-to-zero
  double c_exp = 4;         // exp/log error in ulps (libm expf <= 1, CUDA expf <= 2, exp2 + mul)
  bool lse_merged = false;  // the extra cache computed alone and LSE-merged (two bf16 roundings)
  bool split_kv = false;    // the tiles may be cut into splits merged by a combine (MMA)
};

// The pipeline of a precision (kCustom has none: use the backend's abs/rel tolerances).
Pipeline pipeline_for(Precision p);

// The pipeline of a backend: its precision's, with its extra-cache pipeline (joint or
// LSE-merged) and its token tile where it has its own (Backend::token_tile(): 32 for
// cpu-mma-small and cuda-mma-small).
Pipeline pipeline_of(const Backend& be);

// Per-element bounds (absolute) of one case for one pipeline.
struct Bounds {
  std::vector<double> out;  // [B, H, d_v] delta_pre (before the bf16 store, if any)
  std::vector<double> lse;  // [B, H]
};

// What every joint pipeline's bound of a case shares (the model's sums above): per query row and
// head the logits' max and spread, max_k f_k, L1, L0 and the sink's weights; per element G1, G0,
// W and the underflow sum. About three times the output's size.
class BoundTerms {
 public:
  struct Head {
    double x_max = 0, R = 0;  // the largest valid logit, and the logits' spread
    double f_max = 0;         // max_k f_k
    double a_max = 0;         // max_k A_k
    double xd_max = 0;        // max_k X_k, X_k = |x_k| + |x_k - x_max|
    // The LSE's sums over its weights w'_k: A, X, 1, A^2, A X, X^2.
    double L[6] = {0, 0, 0, 0, 0, 0};
    double w_s = 0;          // the sink's share of the output weights
    double wl_s = 0;         // its share of the LSE weights (Conventions::sink_in_lse)
    double sink = 0;         // the head's sink (-inf: none)
    bool empty = true;       // no valid entry: out exactly 0, lse exactly the convention's
    bool any_under = false;  // a token with x_k - x_max < -80 (underflow sums in `under`)
  };
  int32_t rows = 0, heads = 0, d_v = 0, d_qk = 0;
  double s = 0;                            // |sm_scale|
  bool sink_in_lse = false;                // Conventions::sink_in_lse
  std::vector<Head> head;                  // [rows * heads]
  std::vector<double> g1, g0, w;           // [rows, heads, d_v]
  std::vector<std::vector<double>> under;  // [rows] of [heads, d_v]; empty unless any_under
};

// Computes BoundTerms while the oracle runs: pass it as run_oracle_eigen's visitor, then take().
// Thread-safe across rows (the oracle's threads each visit their own rows). recycled: terms of
// an earlier case whose buffers are reused.
class BoundTermsBuilder final : public OracleRowVisitor {
 public:
  explicit BoundTermsBuilder(const MaterializedCase& m, BoundTerms recycled = {});
  void visit(const OracleRowView& row) override;
  BoundTerms take() { return std::move(t_); }
  // Wall seconds spent in visit() (summed over threads): the bounds' share of the oracle's run.
  double seconds() const;

 private:
  const MaterializedCase& m_;
  BoundTerms t_;
  std::vector<double> row_seconds_;
};

// The terms of case m after its oracle run `ref` (the keys decoded and the logits formed again).
BoundTerms bound_terms(const MaterializedCase& m, const OracleResult& ref);

// The bound of joint pipeline p (not lse_merged, unless the case has no extra cache) from the
// terms of a case and its oracle result, for index lists of topk and extra_topk entries (the
// case's own, or those of a variant with the same valid tokens per query row: T and the tiles
// counted come from these lengths).
Bounds joint_bounds(const BoundTerms& t, const OracleResult& ref, const Pipeline& p, int32_t topk,
                    int32_t extra_topk);
// Several in one pass over the terms (each the same as alone). reuse (may be null): Bounds
// whose buffers are taken, from the back, for the results (a campaign's cases reuse their
// memory instead of the kernel's fresh pages).
struct JointRequest {
  Pipeline pipeline;
  int32_t topk = 0, extra_topk = 0;
};
std::vector<Bounds> joint_bounds(const BoundTerms& t, const OracleResult& ref,
                                 const std::vector<JointRequest>& requests,
                                 std::vector<Bounds>* reuse);

// Bounds for case m against the oracle's result `ref` (run_oracle_eigen(m)). tile_topk > 0
// replaces m.topk in the tile and accumulation counts (a metamorphic variant with inserted
// entries has a longer list but the same valid tokens).
Bounds compute_bounds(const MaterializedCase& m, const OracleResult& ref, const Pipeline& p,
                      int tile_topk = 0);

// The bounds of one case for several pipelines (each with its tile_topk, as compute_bounds),
// in the order asked: the same values bit for bit as one compute_bounds call each, with the
// terms (BoundTerms) computed once for the joint pipelines. LSE-merged pipelines of a case with
// an extra cache bound each list alone and their merge (a pass over V per list).
struct BoundsRequest {
  Pipeline pipeline;
  int tile_topk = 0;
};
std::vector<Bounds> compute_bounds_set(const MaterializedCase& m, const OracleResult& ref,
                                       const std::vector<BoundsRequest>& requests);

// Custom bounds: abs + rel |ref| per element.
Bounds custom_bounds(const OracleResult& ref, double abs_tol, double rel_tol);

// a + b element-wise (bounds of two pipelines compared with each other).
Bounds add_bounds(const Bounds& a, const Bounds& b);

// Values compared by a check: plain numbers (points), or bf16-stored outputs whose rounding
// interval is used (see the model above).
struct Side {
  const std::vector<double>* out = nullptr;  // [B, H, d_v]
  const std::vector<double>* lse = nullptr;  // [B, H]
  bool out_bf16 = false;
  // Or a bf16 backend's raw outputs (RunResult::out_raw, lse_raw: guard bands and strides),
  // read where out is null: query row r = b * s_q + t, head h at out_raw[OutputBuffers::kGuard
  // + b * out_batch_stride + t * out_token_stride + h * out_head_stride + d] (lse likewise).
  const uint16_t* out_raw = nullptr;
  const float* lse_raw = nullptr;
  int32_t s_q = 1;
  int64_t out_head_stride = 0, out_token_stride = 0, out_batch_stride = 0;
  int64_t lse_token_stride = 0, lse_batch_stride = 0;
};
// The raw side of run r of case m (a bf16 backend's: r.out_raw set).
Side raw_side(const RunResult& r, const MaterializedCase& m);

// Result of comparing two sides element-wise under a bound.
struct BoundCheck {
  bool passed = true;
  bool nonfinite_match = true;
  std::string nonfinite_detail;  // first mismatching position, e.g. "out[0,3,17]: NaN vs 0.25"
  double tightness = 0;          // max over elements of excess / bound (inf: bound 0, excess > 0)
  // Worst element (d = -1: lse).
  int b = -1, h = -1, d = -1;
  bool bf16_outputs = false;  // side a wrote bf16 out and fp32 lse (else float64 values)
  double value = 0, reference = 0, error = 0, excess = 0, bound = 0;
  // Element statistics (finite positions): the original test's figures.
  double max_abs = 0, mean_abs = 0, max_rel = 0, lse_max_abs = 0, out_max_ref = 0;
  double out_tightness = 0, lse_tightness = 0;
  std::string describe() const;  // "out[b=0,h=3,d=17] value ... ref ... |err| ... bound ... ratio"
};

// Compares side a (under test) with side b (reference) under `bound` (already summed over the
// pipelines involved). Shapes: batch, heads, d_v.
BoundCheck check_bounds(const Side& a, const Side& b, const Bounds& bound, int32_t batch,
                        int32_t heads, int32_t d_v);
// The same under bound + *plus element-wise (add_bounds, without the sum's array; plus may be
// null: bound alone).
BoundCheck check_bounds(const Side& a, const Side& b, const Bounds& bound, const Bounds* plus,
                        int32_t batch, int32_t heads, int32_t d_v);

// The rounding interval of a bf16 value v (exact bf16, widened): every real that RNE-rounds to v.
// For +-inf and NaN returns [v, v].
void bf16_rounding_interval(double v, double* lo, double* hi);

}  // namespace mlafuzz
