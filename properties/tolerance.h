// THE tolerance model of mlafuzz: per-element error bounds for out and lse, derived from each
// backend's precision pipeline (docs/SPEC.md sections 4 and 5). Every tolerance the properties
// apply comes from here; nothing else in the project compares numbers against a constant.
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
//    Dequantization: K_kd is e4m3 * scale, exact in float64 (the oracle) and, for a power of
//    two 2^p with p in [-124, 119], exact in fp32 and bf16 too (the codes are multiples of 2^-9
//    below 448). A V32 scale that is not (vLLM's fp32 amax / 448) makes the kernel's K~ a rounded
//    product: fp32 rounding gives |K~ - K| <= u |K| + eta (subnormal or flushed results), and a
//    bf16-dequantized K (MMA) rounds that fp32 value again: |K~ - K| <= (u16 + u + u16 u) |K| +
//    2 eta. With u_k that relative term (Pipeline::u_k) and eta_k = 2 eta, a row with such a
//    scale among its valid tokens adds u_k A_k + s eta_k sum_{d < nope} |q_d| to |dx_k| (A_k
//    counts the exact rope dims too: a slight overestimate), and, V being K's nope part (V32),
//    grow (u_k sum_k w_k |V_kd| + eta_k) to the output (sum_k w_k <= 1). A reader that rounds
//    the scale to 2^floor(log2 s) changes K by up to half: far beyond u_k.
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
// The production decode (docs/SPEC.md section 8) computes every (batch row, query token) as its own
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
// Split-KV (mla/split_kv.h; the MMA pipeline, Pipeline::split_kv): the
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
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/materialize.h"
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
  // Relative rounding of a dequantized K element e4m3 * scale where the product is not exact
  // (V32 scales that are not powers of two): one fp32 rounding (SIMT), an fp32 then a bf16 one
  // (MMA); 0 for the float64 oracles, whose products are exact.
  double u_k = 0;
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

// Bounds for case m against the oracle's result `ref` (run_oracle_eigen(m)). tile_topk > 0
// replaces m.topk in the tile and accumulation counts (a metamorphic variant with inserted
// entries has a longer list but the same valid tokens). extra_topk >= 0 replaces the extra
// list's length in those counts (its own, or 0 without an extra cache): a variant that moved
// entries into a longer extra list (move-to-extra) has the same valid tokens, so a joint
// pipeline bounds it as m with its list lengths. An LSE-merged pipeline bounds each list alone,
// so it cannot take extra_topk (std::invalid_argument).
Bounds compute_bounds(const MaterializedCase& m, const OracleResult& ref, const Pipeline& p,
                      int tile_topk = 0, int extra_topk = -1);

// The bounds of one case for several pipelines (each with its tile_topk, as compute_bounds),
// in the order asked, with the work no pipeline changes (the rows' decoded keys and logits, as
// visit_oracle_rows gives them, the oracle's softmax weights, sum_k w_k |V_kd| as one product
// W |V| per query row, and the pass over V that reads them) done once: the same values bit for bit
// as one compute_bounds call each, except a pipeline asked again with a longer list, whose sums
// over |V - O| are derived from the shorter one's (exp(delta) S + expm1(delta) sum_k w_k |V_kd -
// O_d|, the same value up to rounding). The sums are dense products and passes over the row's V in
// token order, not the token-by-token loops the formulas above read as: the output bounds equal
// those loops' within a relative 1e-12 (Tolerance.BoundsEqualTheTokenByTokenForm), the LSE
// bounds bit for bit. A campaign bounds every case for the float64 oracle and each backend's
// pipeline, again for insert-invalid's longer lists and move-to-extra's longer extra lists.
struct BoundsRequest {
  Pipeline pipeline;
  int tile_topk = 0;
  int extra_topk = -1;  // as compute_bounds
};
std::vector<Bounds> compute_bounds_set(const MaterializedCase& m, const OracleResult& ref,
                                       const std::vector<BoundsRequest>& requests);

// compute_bounds_set as a row visitor of the Eigen oracle: run_oracle_eigen(m, threads,
// &visitor), then take(), gives the same bounds bit for bit as compute_bounds_set(m, result,
// requests), formed from the keys the oracle decoded and the logits it formed instead of doing
// that work again (compute_bounds_set itself reads them through visit_oracle_rows). Rows visited
// from several oracle threads take turns. m must outlive the visitor.
class BoundsSetVisitor final : public OracleRowVisitor {
 public:
  BoundsSetVisitor(const MaterializedCase& m, std::vector<BoundsRequest> requests);
  ~BoundsSetVisitor();
  void visit(const OracleRowView& row) override;
  std::vector<Bounds> take();  // once, after the oracle's call

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Hands b's buffers back for the next bounds of this process to reuse (a case's bounds are
// megabytes: rows x heads x d_v doubles per pipeline, which a fresh allocation would map and
// fault in page by page again). Optional: bounds not handed back are freed as usual.
void recycle_bounds(Bounds&& b);

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
// pipelines involved), or under bound + *plus (summed per element as add_bounds does) where
// plus is not null. Shapes: batch, heads, d_v. Row by row: a row finite on both sides in
// vectorized loops (its bounds read only where some element exceeds the sides' rounding
// intervals), a row with a non-finite value element by element; every figure, the worst
// element (the first with the largest ratio) and the message are those of a loop over the
// elements in (b, h, d) order, then the row's lse.
BoundCheck check_bounds(const Side& a, const Side& b, const Bounds& bound, int32_t batch,
                        int32_t heads, int32_t d_v);
BoundCheck check_bounds(const Side& a, const Side& b, const Bounds& bound, const Bounds* plus,
                        int32_t batch, int32_t heads, int32_t d_v);

// The rounding interval of a bf16 value v (exact bf16, widened): every real that RNE-rounds to v.
// For +-inf and NaN returns [v, v].
void bf16_rounding_interval(double v, double* lo, double* hi);

}  // namespace mlafuzz
