// The float64 oracles against hand-computed answers (docs/SPEC.md section 3 and every edge
// convention), against each other on random cases of both layouts, and as backends.
#include "oracle/oracle.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/core/build_paths.h"
#include "tests/oracle/hand_case.h"

namespace mlafuzz {
namespace {

using testing::HandCase;
using testing::HandGeometry;
using testing::RandomSpec;

constexpr double kInf = std::numeric_limits<double>::infinity();

HandGeometry model1() { return HandGeometry{}; }
HandGeometry v32() {
  HandGeometry g;
  g.layout = mla::Layout::kV32;
  g.nope = 512;
  g.tile = 128;
  return g;
}

// Both oracles, checked to agree bit for bit on the special values (NaN, +-inf, exact zeros)
// and to 1e-14 relative elsewhere, so every hand-computed test covers both.
OracleResult run_both(const MaterializedCase& m) {
  const OracleResult e = run_oracle_eigen(m, 1);
  const OracleResult l = run_oracle_loop(m);
  EXPECT_EQ(e.out.size(), l.out.size());
  EXPECT_EQ(e.lse.size(), l.lse.size());
  auto same = [](double a, double b, const char* what, size_t i) {
    if (std::isnan(a) || std::isnan(b) || std::isinf(a) || std::isinf(b) || a == 0 || b == 0) {
      EXPECT_TRUE((std::isnan(a) && std::isnan(b)) || a == b)
          << what << "[" << i << "] eigen " << a << " loop " << b;
    } else {
      EXPECT_NEAR(a, b, 1e-14 * std::abs(b)) << what << "[" << i << "]";
    }
  };
  for (size_t i = 0; i < e.out.size() && i < l.out.size(); ++i) same(e.out[i], l.out[i], "out", i);
  for (size_t i = 0; i < e.lse.size() && i < l.lse.size(); ++i) same(e.lse[i], l.lse[i], "lse", i);
  return e;
}

// Key of slot s as the writer stored it: 3 nonzero nope dims in different tiles plus rope.
std::vector<double> token_values(const HandCase& hc, int s) {
  std::vector<double> k(hc.d_qk(), 0.0);
  k[0] = 1 + s;
  k[70] = -0.5 * (s + 1);
  k[200] = 0.25;
  k[hc.d_qk() - 1] = 3 - s;  // last rope dim
  k[hc.d_qk() - 64] = 0.125 * s;
  return k;
}

// ---- One token: weight exactly 1, so out = V bit for bit and lse = x ----

void one_token(const HandGeometry& hg) {
  HandCase hc(hg, 1, 3, 4);
  std::vector<double> k(hc.d_qk()), q(hc.d_qk());
  for (int d = 0; d < hc.d_qk(); ++d) {
    k[d] = (d % 7) - 3;  // small integers: every product and sum below is exact
    q[d] = (d % 5) - 2;
  }
  hc.set_token(5, k, std::vector<int>(hc.tiles(), 0));
  for (int h = 0; h < 3; ++h) hc.set_q(0, h, q);
  hc.set_sparse_q(0, 2, {{1, 1.0}});
  hc.set_indices(0, {-1, 5, -1, -1});
  const OracleResult r = run_both(hc.m());
  const int dv = hc.m().d_v();
  double x = 0;
  for (int d = 0; d < hc.d_qk(); ++d) x += q[d] * k[d];
  for (int h = 0; h < 3; ++h) {
    for (int d = 0; d < dv; ++d) ASSERT_EQ(r.out[h * dv + d], k[d]) << "h " << h << " d " << d;
  }
  EXPECT_EQ(r.lse[0], x);
  EXPECT_EQ(r.lse[1], x);
  EXPECT_EQ(r.lse[2], k[1]);
}

TEST(OracleHand, OneTokenOutIsVExactlyModel1) { one_token(model1()); }
TEST(OracleHand, OneTokenOutIsNopeExactlyV32) { one_token(v32()); }

// ---- Two tokens with known weights ----

struct TwoTokens {
  HandCase hc{model1(), 1, 2, 3};
  std::vector<double> va, vb;
  double xa, xb;
  TwoTokens() {
    va = token_values(hc, 1);
    vb = token_values(hc, 6);
    hc.set_token(1, va, std::vector<int>(hc.tiles(), 0));
    hc.set_token(6, vb, std::vector<int>(hc.tiles(), 0));
    hc.set_sparse_q(0, 0, {{0, 1.0}});   // x = K[0]: 2 and 7
    hc.set_sparse_q(0, 1, {{0, -0.5}});  // x = -K[0]/2: -1 and -3.5
    hc.set_sm_scale(0.5f);
    xa = 0.5 * va[0];
    xb = 0.5 * vb[0];
  }
  // Expected out and lse of head 0 for entry weights ca, cb (entry multiplicities) and sink.
  void expect_head0(const OracleResult& r, double ca, double cb, double sink,
                    bool sink_in_lse) const {
    const double ea = ca * std::exp(xa), eb = cb * std::exp(xb), es = std::exp(sink);
    for (int d = 0; d < hc.d_qk(); ++d) {
      const double want = (ea * va[d] + eb * vb[d]) / (ea + eb + es);
      EXPECT_NEAR(r.out[d], want, 1e-15 * (std::abs(va[d]) + std::abs(vb[d]))) << "d " << d;
    }
    const double lse = std::log(ea + eb + (sink_in_lse ? es : 0.0));
    EXPECT_NEAR(r.lse[0], lse, 1e-15 * std::abs(lse));
  }
};

TEST(OracleHand, TwoTokensKnownWeights) {
  TwoTokens t;
  t.hc.set_indices(0, {1, -1, 6});
  const OracleResult r = run_both(t.hc.m());
  t.expect_head0(r, 1, 1, -kInf, false);
  // Head 1: x = 0.5 * -0.5 * K[0] = -0.5 and -1.75.
  const double ea = std::exp(-0.25 * t.va[0]), eb = std::exp(-0.25 * t.vb[0]);
  const int dv = t.hc.d_qk();
  for (int d = 0; d < dv; ++d) {
    EXPECT_NEAR(r.out[dv + d], (ea * t.va[d] + eb * t.vb[d]) / (ea + eb), 1e-15 * 8);
  }
  EXPECT_NEAR(r.lse[1], std::log(ea + eb), 1e-15);
}

TEST(OracleHand, DuplicatesCountTwice) {
  TwoTokens t;
  t.hc.set_indices(0, {1, 6, 1});
  t.expect_head0(run_both(t.hc.m()), 2, 1, -kInf, false);
}

TEST(OracleHand, TopkLengthMasksTheTail) {
  TwoTokens t;
  t.hc.set_indices(0, {6, 1, 1});
  t.hc.m().topk_length = {2};
  t.expect_head0(run_both(t.hc.m()), 1, 1, -kInf, false);
  t.hc.m().topk_length = {1};
  t.expect_head0(run_both(t.hc.m()), 0, 1, -kInf, false);
}

TEST(OracleHand, FiniteSinkInDenominatorNotInLse) {
  TwoTokens t;
  t.hc.set_indices(0, {1, -1, 6});
  t.hc.m().sink = {1.5f, 0.0f};
  t.expect_head0(run_both(t.hc.m()), 1, 1, 1.5, false);
  t.hc.m().conv.sink_in_lse = true;  // SGLang Triton folds it into the LSE
  t.expect_head0(run_both(t.hc.m()), 1, 1, 1.5, true);
}

TEST(OracleHand, SinkPlusInfGivesZeroOutput) {
  TwoTokens t;
  t.hc.set_indices(0, {1, -1, 6});
  t.hc.m().sink = {HUGE_VALF, HUGE_VALF};
  OracleResult r = run_both(t.hc.m());
  for (double o : r.out) ASSERT_EQ(o, 0.0);
  EXPECT_NEAR(r.lse[0], std::log(std::exp(t.xa) + std::exp(t.xb)), 1e-15 * 8);  // excluded
  t.hc.m().conv.sink_in_lse = true;
  r = run_both(t.hc.m());
  for (double o : r.out) ASSERT_EQ(o, 0.0);
  EXPECT_EQ(r.lse[0], kInf);
  EXPECT_EQ(r.lse[1], kInf);
}

TEST(OracleHand, SinkMinusInfHasNoEffect) {
  TwoTokens t;
  t.hc.set_indices(0, {1, -1, 6});
  const OracleResult none = run_both(t.hc.m());
  t.hc.m().sink = {-HUGE_VALF, -HUGE_VALF};
  for (bool fold : {false, true}) {
    t.hc.m().conv.sink_in_lse = fold;
    const OracleResult r = run_both(t.hc.m());
    EXPECT_EQ(r.out, none.out);
    EXPECT_EQ(r.lse, none.lse);
  }
}

TEST(OracleHand, HugeSinkDoesNotOverflow) {
  TwoTokens t;
  t.hc.set_indices(0, {1, -1, 6});
  t.hc.m().sink = {1e4f, 800.0f};  // exp(1e4) and exp(800) overflow float64
  t.hc.m().conv.sink_in_lse = true;
  const OracleResult r = run_both(t.hc.m());
  for (double o : r.out) ASSERT_EQ(o, 0.0);  // true values ~e^-9990: 0 in float64
  EXPECT_NEAR(r.lse[0], 1e4, 1e-12 * 1e4);
  EXPECT_NEAR(r.lse[1], 800.0, 1e-12 * 800);
}

// ---- Empty rows ----

TEST(OracleHand, AllMaskedRowIsZeroWithConventionLse) {
  TwoTokens t;
  t.hc.set_indices(0, {-1, -1, -1});
  for (bool with_sink : {false, true}) {
    t.hc.m().sink = with_sink ? std::vector<float>{2.0f, HUGE_VALF} : std::vector<float>{};
    for (bool fold : {false, true}) {
      t.hc.m().conv.sink_in_lse = fold;
      t.hc.m().conv.empty_lse = mla::EmptyRowLse::kPosInf;
      OracleResult r = run_both(t.hc.m());
      for (double o : r.out) ASSERT_EQ(o, 0.0);
      EXPECT_EQ(r.lse, (std::vector<double>{kInf, kInf}));
      t.hc.m().conv.empty_lse = mla::EmptyRowLse::kNegInf;
      r = run_both(t.hc.m());
      for (double o : r.out) ASSERT_EQ(o, 0.0);
      EXPECT_EQ(r.lse, (std::vector<double>{-kInf, -kInf}));
    }
  }
}

TEST(OracleHand, TopkLengthZeroIsAnEmptyRow) {
  HandCase hc(model1(), 2, 1, 2);
  hc.set_sparse_token(0, {{0, 1.0}});
  hc.set_sparse_q(0, 0, {{0, 1.0}});
  hc.set_sparse_q(1, 0, {{0, 1.0}});
  hc.set_indices(0, {0, 0});
  hc.set_indices(1, {0, 0});
  hc.m().topk_length = {0, 2};
  const OracleResult r = run_both(hc.m());
  EXPECT_EQ(r.lse[0], kInf);
  EXPECT_NEAR(r.lse[1], 1.0 + std::log(2.0), 1e-15);
  EXPECT_EQ(r.out[0], 0.0);
  EXPECT_EQ(r.out[hc.d_qk()], 1.0);
}

// ---- Invalid-index conventions ----

TEST(OracleHand, AnyNegativeConventionMasksEveryNegative) {
  TwoTokens t;
  t.hc.m().conv.invalid_index = mla::InvalidIndexRule::kAnyNegative;
  t.hc.set_indices(0, {1, -7, 6});
  t.expect_head0(run_both(t.hc.m()), 1, 1, -kInf, false);
}

TEST(OracleHand, OtherNegativesAreRejectedUnderMinusOneOnly) {
  TwoTokens t;
  t.hc.set_indices(0, {1, -7, 6});  // FlashMLA: -7 is a valid-looking index, i.e. UB
  EXPECT_THROW(run_oracle_eigen(t.hc.m()), std::invalid_argument);
  EXPECT_THROW(run_oracle_loop(t.hc.m()), std::invalid_argument);
  for (auto make :
       {+[] { return make_oracle_backend(); }, +[] { return make_oracle_loop_backend(); }}) {
    const RunResult r = make()->run(t.hc.m());
    EXPECT_EQ(r.status, RunStatus::kError);
    EXPECT_NE(r.message.find("-7"), std::string::npos) << r.message;
  }
}

TEST(OracleHand, OutOfRangeIndexIsAnErrorNotACrash) {
  TwoTokens t;
  t.hc.set_indices(0, {1, 8, 6});  // 2 pages of 4 slots: 8 is one past the end
  for (auto make :
       {+[] { return make_oracle_backend(); }, +[] { return make_oracle_loop_backend(); }}) {
    const RunResult r = make()->run(t.hc.m());
    EXPECT_EQ(r.status, RunStatus::kError);
    EXPECT_TRUE(r.out.empty());
  }
  t.hc.m().topk_length = {1};  // masked by topk_length: never read, so fine
  EXPECT_TRUE(make_oracle_backend()->run(t.hc.m()).ok());
  EXPECT_TRUE(make_oracle_loop_backend()->run(t.hc.m()).ok());
}

TEST(OracleHand, NegativeTopkLengthIsRejected) {
  TwoTokens t;
  t.hc.set_indices(0, {1, -1, 6});
  t.hc.m().topk_length = {-1};
  EXPECT_THROW(run_oracle_eigen(t.hc.m()), std::invalid_argument);
  EXPECT_THROW(run_oracle_loop(t.hc.m()), std::invalid_argument);
}

// ---- Large logits ----

TEST(OracleHand, HugeLogitsDoNotOverflow) {
  for (double sign : {1.0, -1.0}) {
    HandCase hc(model1(), 1, 1, 2);
    // 10240 = 320 * 2^5 (e4m3 320 at scale 2^5); K[1] = 1 = 2^-5 * 2^5 in the same tile.
    hc.set_sparse_token(2, {{0, 10240.0}}, 5);
    hc.set_sparse_token(3, {{0, 10240.0}, {1, 1.0}}, 5);
    hc.set_sparse_q(0, 0, {{0, sign}, {1, sign}});
    hc.set_indices(0, {2, 3});
    const OracleResult r = run_both(hc.m());
    // x = +-10240 and +-10241: exp of either overflows (or underflows to 0 -> 0/0) unshifted.
    const double wa = 1.0 / (1.0 + std::exp(sign)), wb = 1.0 - wa;
    EXPECT_NEAR(r.out[0], 10240.0, 1e-15 * 10240);
    EXPECT_NEAR(r.out[1], wb, 1e-15);
    const double lse =
        sign > 0 ? 10241.0 + std::log1p(std::exp(-1.0)) : -10240.0 + std::log1p(std::exp(-1.0));
    EXPECT_NEAR(r.lse[0], lse, 1e-15 * 10241);
    (void)wa;
  }
}

// ---- NaN: honest about selected inputs, blind to everything it must not read ----

TEST(OracleHand, NanInASelectedKeyPropagates) {
  TwoTokens t;
  t.hc.set_indices(0, {1, -1, 6});
  t.hc.m().cache.mut()[mla::token_address(t.hc.m().geom, 6).nope + 300] = 0x7f;
  const OracleResult r = run_both(t.hc.m());
  for (double o : r.out) ASSERT_TRUE(std::isnan(o));
  for (double l : r.lse) ASSERT_TRUE(std::isnan(l));
}

TEST(OracleHand, NanOutsideTheSelectedTokensIsNeverRead) {
  for (const HandGeometry& hg0 : {model1(), v32()}) {
    HandGeometry hg = hg0;
    hg.stride_pad = 24;
    HandCase hc(hg, 1, 2, 4);
    for (int s = 0; s < 8; ++s)
      hc.set_token(s, token_values(hc, s), std::vector<int>(hc.tiles(), -1));
    hc.set_sparse_q(0, 0, {{0, 1.0}, {70, 2.0}});
    hc.set_sparse_q(0, 1, {{hc.d_qk() - 1, 1.0}});
    hc.set_indices(0, {5, -1, 2, 3});
    hc.m().topk_length = {3};  // slot 3 selected but masked
    const OracleResult clean = run_both(hc.m());
    // Poison every byte that belongs to no selected token (FlashMLA fills unused slots with NaN)
    // and the MODEL1 pad scale byte of the selected ones.
    MaterializedCase& m = hc.m();
    std::vector<bool> used(m.cache.size(), false);
    for (int s : {5, 2}) {
      const mla::TokenAddress a = mla::token_address(m.geom, s);
      for (int d = 0; d < m.geom.nope_dim; ++d) used[a.nope + d] = true;
      for (int r = 0; r < 2 * m.geom.rope_dim; ++r) used[a.rope + r] = true;
      const int scale_bytes = hg.layout == mla::Layout::kModel1 ? hc.tiles() : 4 * hc.tiles();
      for (int i = 0; i < scale_bytes; ++i) used[a.scale + i] = true;
    }
    int64_t poisoned = 0;
    CacheBytes::Vector& cache = m.cache.mut();
    for (size_t i = 0; i < cache.size(); ++i) {
      if (!used[i]) {
        cache[i] = 0xff;  // e4m3 NaN, ue8m0 NaN, bf16/fp32 NaN
        ++poisoned;
      }
    }
    EXPECT_GT(poisoned, 6 * 584);
    const OracleResult r = run_both(m);
    EXPECT_EQ(r.out, clean.out);
    EXPECT_EQ(r.lse, clean.lse);
  }
}

// ---- Layout read-back: gather_row returns exactly what the writer stored ----

TEST(OracleLayout, GatherRowReadsBackEveryTokenOfBothLayouts) {
  for (const HandGeometry& hg0 : {model1(), v32()}) {
    HandGeometry hg = hg0;
    hg.page_size = 61;  // not a power of two (FlashMLA tests 61 and 69)
    hg.num_pages = 3;
    hg.stride_pad = 100;  // padded stride, not a multiple of the token size
    const int slots = 61 * 3;
    HandCase hc(hg, 1, 1, slots);
    std::vector<std::vector<double>> want(slots);
    std::vector<int32_t> idx(slots);
    for (int s = 0; s < slots; ++s) {
      std::vector<double> k(hc.d_qk());
      std::vector<int> exps(hc.tiles());
      for (int t = 0; t < hc.tiles(); ++t) exps[t] = (s + 3 * t) % 11 - 6;
      for (int d = 0; d < hc.d_qk(); ++d) {
        const int code = (s * 31 + d * 17) % 126;  // finite positive e4m3 codes
        const double v = mla::e4m3_to_float(static_cast<uint8_t>(code)) * ((d + s) % 2 ? -1 : 1);
        k[d] = d < hg.nope ? std::ldexp(v, exps[d / hg.tile]) : v;
      }
      hc.set_token(s, k, exps);
      want[s] = k;
      idx[s] = (s * 7) % slots;  // a permutation
    }
    hc.set_indices(0, idx);
    const OracleRow row = gather_row(hc.m(), 0);
    ASSERT_EQ(row.K.rows(), slots);
    ASSERT_EQ(row.K.cols(), hc.d_qk());
    for (int i = 0; i < slots; ++i) {
      EXPECT_EQ(row.k[i], i);
      for (int d = 0; d < hc.d_qk(); ++d) {
        ASSERT_EQ(row.K(i, d), want[idx[i]][d]) << "token " << idx[i] << " dim " << d;
      }
    }
  }
}

TEST(OracleLayout, QMatrixSkipsHeadPadding) {
  HandCase hc(model1(), 2, 3, 1);
  MaterializedCase& m = hc.m();
  m.q_head_stride = m.d_qk() + 5;
  m.set_contiguous_strides();
  m.q.assign(2 * 3 * m.q_head_stride, 0x7fc0);  // bf16 NaN everywhere, pads included
  for (int b = 0; b < 2; ++b) {
    for (int h = 0; h < 3; ++h) {
      for (int d = 0; d < m.d_qk(); ++d) {
        m.q[(b * 3 + h) * m.q_head_stride + d] = mla::float_to_bf16(float(b * 1000 + h * 100 + d));
      }
    }
  }
  const Eigen::MatrixXd Q = q_matrix(m, 1);
  ASSERT_EQ(Q.rows(), 3);
  ASSERT_EQ(Q.cols(), m.d_qk());
  for (int h = 0; h < 3; ++h) {
    for (int d = 0; d < m.d_qk(); ++d) {
      ASSERT_EQ(Q(h, d), mla::round_to_bf16(float(1000 + h * 100 + d)));
    }
  }
}

// ---- Eigen vs loop on random cases ----

// Largest |V| among the row's valid tokens: an output is a weighted mean of them, so float64
// rounding errors are relative to this, not to the (possibly cancelled) output itself.
double row_v_scale(const MaterializedCase& m, int b) {
  const OracleRow r = gather_row(m, b);
  return r.K.size() ? r.K.leftCols(m.d_v()).cwiseAbs().maxCoeff() : 0.0;
}

void expect_agree(const MaterializedCase& m, const std::string& what) {
  const OracleResult e = run_oracle_eigen(m, 1);
  const OracleResult l = run_oracle_loop(m);
  const int64_t H = m.heads, dv = m.d_v();
  ASSERT_EQ(e.out.size(), static_cast<size_t>(m.query_rows() * H * dv));
  double worst_out = 0, worst_lse = 0;
  for (int b = 0; b < m.query_rows(); ++b) {  // query rows (b * s_q + s)
    const double vs = row_v_scale(m, b);
    for (int64_t i = b * H * dv; i < (b + 1) * H * dv; ++i) {
      ASSERT_FALSE(std::isnan(e.out[i])) << what;
      const double err = std::abs(e.out[i] - l.out[i]);
      ASSERT_LE(err, 1e-12 * vs) << what << " out[" << i << "] " << e.out[i] << " vs " << l.out[i];
      if (vs > 0) worst_out = std::max(worst_out, err / vs);
    }
    for (int64_t i = b * H; i < (b + 1) * H; ++i) {
      if (std::isinf(e.lse[i]) || std::isinf(l.lse[i])) {
        ASSERT_EQ(e.lse[i], l.lse[i]) << what << " lse[" << i << "]";
        continue;
      }
      const double err = std::abs(e.lse[i] - l.lse[i]);
      ASSERT_LE(err, 1e-12 * std::max(1.0, std::abs(l.lse[i]))) << what << " lse[" << i << "]";
      worst_lse = std::max(worst_lse, err / std::max(1.0, std::abs(l.lse[i])));
    }
  }
  ::testing::Test::RecordProperty("worst_out_" + what, std::to_string(worst_out));
  ::testing::Test::RecordProperty("worst_lse_" + what, std::to_string(worst_lse));
}

TEST(OracleAgreement, EigenMatchesLoopOnRandomCases) {
  int cases = 0;
  for (int layout = 0; layout < 2; ++layout) {
    for (int variant = 0; variant < 18; ++variant) {
      RandomSpec s;
      if (layout == 1) s.geom = v32();
      const int shape = variant % 6;
      if (shape == 1) {  // small dims: 2 tiles of 64, short rope
        s.geom.nope = layout ? 256 : 128;
        s.geom.rope = 32;
      }
      s.geom.page_size = std::vector<int>{1, 2, 61, 64, 7, 16}[shape];
      s.geom.num_pages = std::vector<int>{40, 17, 3, 2, 9, 5}[shape];
      s.geom.stride_pad = variant % 3 == 0 ? 0 : 8 * variant + 1;
      s.batch = std::vector<int>{1, 3, 5, 2, 7, 4}[variant % 6];
      s.heads = std::vector<int>{1, 4, 16, 64, 3}[variant % 5];
      s.topk = std::vector<int>{1, 7, 64, 128, 33, 200}[(variant + layout) % 6];
      s.topk_length = variant % 4 == 1;
      s.sink = variant % 3 == 2;
      s.duplicate_fraction = variant % 2 ? 0.3 : 0.0;
      s.invalid_fraction = variant == 5 ? 1.0 : 0.15;
      s.conv.invalid_index = variant % 5 == 3 ? mla::InvalidIndexRule::kAnyNegative
                                              : mla::InvalidIndexRule::kMinusOneOnly;
      s.conv.empty_lse = variant % 2 ? mla::EmptyRowLse::kNegInf : mla::EmptyRowLse::kPosInf;
      s.conv.sink_in_lse = variant % 6 == 5;
      if (variant == 7) s.sm_scale = 3.0f;  // peaked softmax, logits in the hundreds
      const MaterializedCase m = testing::random_case(s, 1000 + 100 * layout + variant);
      std::string what = "L";  // appended piecewise: GCC 12 warns (-Wrestrict) on "L" + ...
      what += std::to_string(layout);
      what += "v";
      what += std::to_string(variant);
      expect_agree(m, what);
      ++cases;
    }
  }
  EXPECT_EQ(cases, 36);
}

// The same agreement on recipes materialized by the harness (writer scales, page order,
// padded strides, head padding, special values, both layouts, every convention).
TEST(OracleAgreement, EigenMatchesLoopOnMaterializedRecipes) {
  for (int i = 0; i < 24; ++i) {
    Case c;
    c.geom.layout = i % 2 ? mla::Layout::kV32 : mla::Layout::kModel1;
    if (c.geom.layout == mla::Layout::kV32) {
      c.geom.nope_dim = 512;
      c.geom.scale_tile = 128;
    }
    c.geom.page_size = std::vector<int>{61, 64, 2, 256, 7, 1}[i % 6];
    c.geom.num_pages = std::vector<int>{4, 3, 40, 2, 13, 97}[i % 6];
    c.geom.page_stride = i % 3 ? 0 : mla::min_page_stride(c.geom) + 64 * i + 8;
    c.page_order.resize(c.geom.num_pages);
    // A permutation: 7 is coprime with every page count used here.
    for (int p = 0; p < c.geom.num_pages; ++p) c.page_order[p] = (p * 7 + i) % c.geom.num_pages;
    c.batch = 1 + i % 5;
    c.heads = std::vector<int>{64, 3, 16, 1}[i % 4];
    c.topk =
        std::vector<int>{128, 512, 33, 1, 64, 90}[i % 6] % (c.geom.page_size * c.geom.num_pages);
    c.topk = std::max(c.topk, 1);
    c.index_spec.rule = static_cast<IndexRule>(i % 3);
    c.index_spec.invalid_fraction = i % 4 == 1 ? 0.2 : 0.0;
    c.index_spec.duplicate_fraction = i % 5 == 2 ? 0.25 : 0.0;
    c.conventions.empty_lse = i % 2 ? mla::EmptyRowLse::kNegInf : mla::EmptyRowLse::kPosInf;
    c.conventions.sink_in_lse = i % 4 == 3;
    if (i % 3 == 1) {
      c.topk_length = std::vector<int32_t>(c.batch);
      for (int b = 0; b < c.batch; ++b) (*c.topk_length)[b] = (b * 37 + i) % (c.topk + 1);
    }
    if (i % 3 == 2) {
      c.sink = std::vector<double>(c.heads);
      for (int h = 0; h < c.heads; ++h) (*c.sink)[h] = h % 5 == 4 ? INFINITY : 0.5 * h - 3;
    }
    c.q_head_pad = i % 4 == 0 ? 8 : 0;
    c.pad_fill = Fill::kNaN;  // padding must never be read
    c.q_values.dist = static_cast<ValueDist>(i % 3);
    c.kv_values.magnitude = i % 5 == 0 ? 30.0 : 1.0;
    c.kv_values.special_fraction = i % 6 == 4 ? 0.05 : 0.0;
    c.rope_values.dist = ValueDist::kUniform;
    c.data_seed = 500 + i;
    const MaterializedCase m = materialize(c);
    std::string what = "recipe";
    what += std::to_string(i);
    expect_agree(m, what);
  }
}

// And on the checked-in corpus (the loop oracle is slow: the largest cases are left out).
TEST(OracleAgreement, EigenMatchesLoopOnTheCorpus) {
  const std::filesystem::path dir =
      std::filesystem::path(mlafuzz::build_paths::kSourceDir) / "corpus" / "cases";
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << dir << " not found";
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    const Case c = load_case(entry.path().string());
    if (int64_t{c.batch} * c.heads * c.topk > 4 * 64 * 512) continue;
    SCOPED_TRACE(entry.path().filename().string());
    expect_agree(materialize(c), entry.path().stem().string());
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

TEST(OracleAgreement, ThreadCountDoesNotChangeBits) {
  // Odd head counts and topk put rows and columns at every alignment.
  for (int heads : {8, 5}) {
    RandomSpec s;
    s.batch = 13;
    s.heads = heads;
    s.topk = 40 + heads;
    s.sink = true;
    s.topk_length = true;
    const MaterializedCase m = testing::random_case(s, 77);
    const OracleResult one = run_oracle_eigen(m, 1);
    for (int threads : {0, 2, 3, 32, 1}) {
      const OracleResult r = run_oracle_eigen(m, threads);
      EXPECT_EQ(r.out, one.out) << "heads " << heads << " threads " << threads;
      EXPECT_EQ(r.lse, one.lse) << "heads " << heads << " threads " << threads;
    }
  }
}

// A top-k list long enough that its scratch (> 64 MB) is released after the call; the next,
// small case must still be right (fresh scratch).
TEST(OracleAgreement, LongTopkListThenSmallCase) {
  RandomSpec big;
  big.batch = 1;
  big.heads = 2;
  big.topk = 17000;  // 17000 * 512 doubles of gathered keys
  expect_agree(testing::random_case(big, 11), "long");
  RandomSpec small;
  expect_agree(testing::random_case(small, 12), "small-after-long");
}

TEST(OracleAgreement, RowLogitsMatchLse) {
  RandomSpec s;
  s.batch = 2;
  s.heads = 5;
  const MaterializedCase m = testing::random_case(s, 5);
  const OracleResult r = run_oracle_eigen(m);
  for (int b = 0; b < 2; ++b) {
    const OracleRow row = gather_row(m, b);
    const Eigen::MatrixXd x = row_logits(m, b, row);
    ASSERT_EQ(x.rows(), 5);
    ASSERT_EQ(x.cols(), static_cast<Eigen::Index>(row.k.size()));
    for (int h = 0; h < 5; ++h) {
      const double mx = x.row(h).maxCoeff();
      const double lse = mx + std::log((x.row(h).array() - mx).exp().sum());
      EXPECT_NEAR(r.lse[b * 5 + h], lse, 1e-13 * std::max(1.0, std::abs(lse)));
    }
  }
}

// ---- As backends ----

TEST(OracleBackend, NamesPrecisionAndResults) {
  RandomSpec s;
  s.sink = true;
  const MaterializedCase m = testing::random_case(s, 9);
  auto eig = make_oracle_backend();
  auto loop = make_oracle_loop_backend();
  EXPECT_EQ(eig->traits().name, "oracle");
  EXPECT_EQ(loop->traits().name, "oracle-loop");
  EXPECT_EQ(eig->traits().precision, Precision::kFloat64);
  EXPECT_EQ(loop->traits().precision, Precision::kFloat64);
  EXPECT_FALSE(eig->traits().on_device);
  EXPECT_TRUE(eig->traits().availability.available);
  EXPECT_FALSE(eig->unsupported(m).has_value());
  const RunResult r = eig->run(m);
  ASSERT_TRUE(r.ok()) << r.message;
  const OracleResult o = run_oracle_eigen(m);
  EXPECT_EQ(r.out, o.out);
  EXPECT_EQ(r.lse, o.lse);
  EXPECT_TRUE(r.out_raw.empty());
  EXPECT_TRUE(r.lse_raw.empty());
  EXPECT_GE(r.seconds, 0.0);
  const RunResult rl = loop->run(m);
  ASSERT_TRUE(rl.ok()) << rl.message;
  EXPECT_EQ(rl.out.size(), o.out.size());
}

TEST(OracleBackend, TooSmallBuffersAreErrors) {
  RandomSpec s;
  MaterializedCase m = testing::random_case(s, 3);
  m.cache.mut().pop_back();  // (resize(size() - 1) draws a false -Wstringop-overflow from gcc 12)
  for (auto make :
       {+[] { return make_oracle_backend(); }, +[] { return make_oracle_loop_backend(); }}) {
    const RunResult r = make()->run(m);
    EXPECT_EQ(r.status, RunStatus::kError);
    EXPECT_NE(r.message.find("cache"), std::string::npos) << r.message;
  }
  m = testing::random_case(s, 3);
  m.q.resize(m.q.size() - 1);
  EXPECT_EQ(make_oracle_backend()->run(m).status, RunStatus::kError);
  EXPECT_EQ(make_oracle_loop_backend()->run(m).status, RunStatus::kError);
}

}  // namespace
}  // namespace mlafuzz
