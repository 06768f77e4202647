// Tests of the host models cpu-simt, cpu-mma and cpu-mma-small: differential against the float64
// oracle under a pipeline-derived bound, exact (bitwise) invariants, and bit-exactness on exact
// inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/materialize.h"
#include "harness/backends/registry.h"
#include "kernels/host/host_models.h"
#include "kernels/host/host_pipeline.h"
#include "mla/fp_formats.h"
#include "oracle/oracle.h"
#include "properties/tolerance.h"
#include "tests/kernels/host/host_test_support.h"

namespace mlafuzz {
namespace {

using testing::random_recipe;

constexpr uint64_t kSeed = 0x5eed0f0057ull;
constexpr double kU32 = 0x1p-24;  // fp32 unit roundoff

// The host model's pipeline in the project's tolerance model (properties/tolerance.h), held to
// u_acc = u: the host models round their fp32 accumulation, where the campaign's MMA pipeline
// allows 2u for tensor cores (which may truncate). Neither the oracle's own error bound (which
// the tolerance property adds) is allowed: this test is stricter than the property.
// The backend's own pipeline (pipeline_of: cpu-mma-small's 32-token tiles too).
Pipeline host_pipeline(const Backend& be) {
  Pipeline p = pipeline_of(be);
  p.u_acc = p.u;
  return p;
}

struct Tightness {
  double out = 0, lse = 0;
};

// Checks r against the oracle under the bound: every element within its bound (a bf16 output's
// rounding interval within delta_pre of the oracle), +inf/-inf/NaN positions identical, rows
// without a valid token exact. Raises *t to the tightness (excess / bound).
void check_against_oracle(const MaterializedCase& m, const RunResult& r, const OracleResult& ref,
                          const Bounds& bd, const std::string& what, Tightness* t) {
  EXPECT_EQ(r.guard_violations, 0) << what;
  const BoundCheck check = check_bounds(Side{&r.out, &r.lse, true}, Side{&ref.out, &ref.lse}, bd,
                                        m.batch, m.heads, m.d_v());
  ASSERT_TRUE(check.passed) << what << ": " << check.describe();
  t->out = std::max(t->out, check.out_tightness);
  t->lse = std::max(t->lse, check.lse_tightness);
}

// Whether the bound tells r from r with every finite output one bf16 ulp higher (a bound wider
// than the bf16 spacing everywhere would let a kernel off by one ulp pass).
bool one_ulp_off_caught(const MaterializedCase& m, const RunResult& r, const OracleResult& ref,
                        const Bounds& bd) {
  std::vector<double> up = r.out;
  for (double& v : up) {
    double lo, hi;
    bf16_rounding_interval(v, &lo, &hi);
    if (std::isfinite(hi)) v += 2 * (hi - v);  // the next bf16 value
  }
  return !check_bounds(Side{&up, &r.lse, true}, Side{&ref.out, &ref.lse}, bd, m.batch, m.heads,
                       m.d_v())
              .passed;
}

// ---- Differential tests against the float64 oracle ----

class HostModelVsOracle : public ::testing::TestWithParam<std::string> {};

TEST_P(HostModelVsOracle, RandomRecipesWithinPipelineBound) {
  const std::string name = GetParam();
  const bool mma = name.rfind("cpu-mma", 0) == 0;  // cpu-mma and the split pipeline
  auto backend = make_backend(name);
  const Pipeline pl = host_pipeline(*backend);
  constexpr int kCases = 300;
  std::printf("[seed] %s: recipes from CounterRng(0x%llx, kGenerator)\n", name.c_str(),
              static_cast<unsigned long long>(kSeed));
  CounterRng rng(kSeed, Stream::kGenerator);
  Tightness worst;
  int uncaught = 0;  // cases where one ulp off everywhere passes
  int64_t elements = 0;
  for (int i = 0; i < kCases; ++i) {
    const Case c = random_recipe(rng);
    const MaterializedCase m = materialize(c);
    const RunResult r = backend->run(m);
    const std::string what = name + " case " + std::to_string(i) + " (seed 0x" +
                             std::to_string(kSeed) + ", data_seed " + std::to_string(c.data_seed) +
                             ")";
    ASSERT_TRUE(r.ok()) << what << ": " << r.message;
    const OracleResult ref = run_oracle_eigen(m, 1);
    const Bounds bd = compute_bounds(m, ref, pl);  // one computation for both checks
    check_against_oracle(m, r, ref, bd, what, &worst);
    if (::testing::Test::HasFatalFailure()) return;
    if (!one_ulp_off_caught(m, r, ref, bd)) ++uncaught;
    elements += static_cast<int64_t>(ref.out.size());
  }
  std::printf(
      "[tightness] %s: %d cases, %lld out elements, max error/bound (beyond the bf16 rounding "
      "interval) out %.3g lse %.3g; one bf16 ulp off everywhere passed in %d cases\n",
      name.c_str(), kCases, static_cast<long long>(elements), worst.out, worst.lse, uncaught);
  // A bound that is never approached proves little. The bound is the error before the bf16
  // store (the store is modelled exactly by the rounding interval). MMA, with its bf16 p, must
  // use a visible part of it (measured 0.75); SIMT, fp32 throughout, uses little of it (0.006),
  // so there the bound must be narrower than the bf16 spacing: one ulp off is caught in every
  // case.
  if (mma) {
    EXPECT_GT(worst.out, 0.05);
  } else {
    EXPECT_EQ(uncaught, 0);
  }
}

// Names of the parametrized backends in test names.
std::string backend_test_name(const std::string& b) {
  if (b == "cpu-simt") return "Simt";
  if (b == "cpu-mma") return "Mma";
  if (b == "cpu-mma-small") return "MmaSmall";  // 32-token tiles (the sm_120 configuration)
  return "MmaSplitMax";                         // cpu-mma-split-max: one split per tile
}

INSTANTIATE_TEST_SUITE_P(Backends, HostModelVsOracle,
                         ::testing::Values("cpu-simt", "cpu-mma", "cpu-mma-small",
                                           "cpu-mma-split-max"),
                         [](const auto& info) { return backend_test_name(info.param); });

// ---- Exact invariants (bitwise) ----

class HostModelInvariants : public ::testing::TestWithParam<std::string> {};

TEST_P(HostModelInvariants, PoisonedUnreadBytesChangeNoBit) {
  auto backend = make_backend(GetParam());
  CounterRng rng(kSeed + 1, Stream::kGenerator);
  for (int i = 0; i < 60; ++i) {
    const MaterializedCase m = materialize(random_recipe(rng));
    const RunResult clean = backend->run(m);
    ASSERT_TRUE(clean.ok()) << clean.message;
    for (int poison : {0xff, 0x7f, -1}) {
      MaterializedCase p = m;
      testing::poison_unread(p, poison, static_cast<uint64_t>(i));
      const RunResult r = backend->run(p);
      ASSERT_TRUE(r.ok()) << r.message;
      ASSERT_TRUE(testing::same_bits(clean, r))
          << GetParam() << " case " << i << " poison " << poison << " (seed " << kSeed + 1 << ")";
      ASSERT_EQ(r.guard_violations, 0);
    }
  }
}

TEST_P(HostModelInvariants, DeterministicAndGuardsIntact) {
  auto backend = make_backend(GetParam());
  CounterRng rng(kSeed + 2, Stream::kGenerator);
  for (int i = 0; i < 40; ++i) {
    const MaterializedCase m = materialize(random_recipe(rng));
    const RunResult a = backend->run(m), b = backend->run(m);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a.guard_violations, 0) << "case " << i;
    ASSERT_TRUE(testing::same_bits(a, b)) << "case " << i;
    // Every logical output element was written (no canary left inside [0, d_v)).
    for (int32_t b2 = 0; b2 < m.batch; ++b2) {
      for (int32_t h = 0; h < m.heads; ++h) {
        for (uint16_t bits : testing::head_out_bits(m, a, b2, h)) {
          ASSERT_NE(bits, OutputBuffers::kCanaryBits) << "case " << i;
        }
      }
    }
  }
}

TEST_P(HostModelInvariants, BatchRowAloneEqualsRowInBatch) {
  auto backend = make_backend(GetParam());
  CounterRng rng(kSeed + 3, Stream::kGenerator);
  int checked = 0;
  for (int i = 0; i < 40; ++i) {
    const MaterializedCase m = materialize(random_recipe(rng));
    if (m.batch < 2) continue;
    const RunResult full = backend->run(m);
    ASSERT_TRUE(full.ok());
    for (int32_t b = 0; b < m.batch; ++b) {
      const MaterializedCase one = testing::slice_batch(m, b, 1);
      const RunResult r = backend->run(one);
      ASSERT_TRUE(r.ok()) << r.message;
      for (int32_t h = 0; h < m.heads; ++h) {
        ASSERT_EQ(testing::head_out_bits(one, r, 0, h), testing::head_out_bits(m, full, b, h))
            << "case " << i << " row " << b << " head " << h;
        ASSERT_EQ(testing::head_lse_bits(one, r, 0, h), testing::head_lse_bits(m, full, b, h));
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

TEST_P(HostModelInvariants, HeadAloneEqualsHeadInItsBlock) {
  auto backend = make_backend(GetParam());
  CounterRng rng(kSeed + 4, Stream::kGenerator);
  int checked = 0;
  for (int i = 0; i < 40; ++i) {
    Case c = random_recipe(rng);
    c.heads = 64;  // two blocks of 32 for cpu-mma
    if (c.sink) c.sink->resize(64, 0.5);
    const MaterializedCase m = materialize(c);
    const RunResult full = backend->run(m);
    ASSERT_TRUE(full.ok());
    for (int32_t h : {0, 5, 31, 32, 63}) {
      const MaterializedCase one = testing::slice_heads(m, h, 1);
      const RunResult r = backend->run(one);
      ASSERT_TRUE(r.ok()) << r.message;
      for (int32_t b = 0; b < m.batch; ++b) {
        ASSERT_EQ(testing::head_out_bits(one, r, b, 0), testing::head_out_bits(m, full, b, h))
            << "case " << i << " row " << b << " head " << h;
        ASSERT_EQ(testing::head_lse_bits(one, r, b, 0), testing::head_lse_bits(m, full, b, h));
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 200);
}

// One backend object reuses its scratch across cases: a case must not see the previous one's
// leftovers (e.g. decoded columns of a wider rope) whatever the order of shapes.
TEST_P(HostModelInvariants, ScratchReuseAcrossShapesChangesNoBit) {
  auto reused = make_backend(GetParam());
  CounterRng rng(kSeed + 8, Stream::kGenerator);
  for (int i = 0; i < 30; ++i) {
    Case c = random_recipe(rng);
    c.topk = 100;  // the same scratch size for every case
    if (c.topk_length) {
      for (auto& l : *c.topk_length) l = std::min(l, c.topk);
    }
    c.geom.rope_dim = i % 3 == 0 ? 64 : (i % 3 == 1 ? 48 : 16);  // same widths, other columns
    c.geom.page_stride = 0;                                      // the new minimum
    MaterializedCase m = materialize(c);
    // The widest case decodes NaN everywhere: a narrower one after it must not see any of it.
    if (i % 3 == 0) {
      CacheBytes::Vector& cache = m.cache.mut();
      std::fill(cache.begin(), cache.end(), uint8_t{0xff});
    }
    const RunResult a = reused->run(m), b = make_backend(GetParam())->run(m);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_TRUE(testing::same_bits(a, b)) << "case " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, HostModelInvariants,
                         ::testing::Values("cpu-simt", "cpu-mma", "cpu-mma-small",
                                           "cpu-mma-split-max"),
                         [](const auto& info) { return backend_test_name(info.param); });

TEST(CpuMma, BlockH64GivesTheSameBitsAsBlockH32) {
  auto h32 = make_cpu_mma_backend(32), h64 = make_cpu_mma_backend(64);
  EXPECT_EQ(h32->traits().name, "cpu-mma");
  EXPECT_EQ(h64->traits().name, "cpu-mma-h64");
  CounterRng rng(kSeed + 5, Stream::kGenerator);
  for (int i = 0; i < 20; ++i) {
    const MaterializedCase m = materialize(random_recipe(rng));
    const RunResult a = h32->run(m), b = h64->run(m);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_TRUE(testing::same_bits(a, b)) << "case " << i;
  }
}

// ---- Exact arithmetic: the pipelines must equal the oracle rounded to bf16 ----

// Small-integer q and K (scale 1), sm_scale 2^10: logits are exact integers times 1024, every
// token below the max gets p = exp(<= -1024) = 0 in fp32 and float64 alike, the tied tokens
// p = 1, so l = t (the tie count) and O = sum of their V, all exact. When t is a power of two
// O / t is exact too, and both pipelines must store exactly bf16(oracle).
TEST(HostModelsExact, SmallIntegerCasesEqualOracleRoundedToBf16) {
  CounterRng rng(kSeed + 6, Stream::kGenerator);
  auto simt = make_backend("cpu-simt"), mma = make_backend("cpu-mma");
  int64_t heads_checked = 0;
  for (int i = 0; i < 60; ++i) {
    Case c = random_recipe(rng);
    c.sink.reset();
    c.sm_scale = i % 3 == 0 ? 1.0 / 64 : 1024.0;  // 1/64 with zero q: all tokens tie
    c.q_values = {i % 3 == 0 ? ValueDist::kZeros : ValueDist::kSmallInt, 1.0, 0.0};
    c.kv_values = {ValueDist::kSmallInt, 1.0, 0.0};
    c.rope_values = {ValueDist::kSmallInt, 1.0, 0.0};
    c.scales = {ScaleMode::kFixed, 127, 127};
    const MaterializedCase m = materialize(c);
    const OracleResult ref = run_oracle_eigen(m, 1);
    const RunResult rs = simt->run(m), rm = mma->run(m);
    ASSERT_TRUE(rs.ok() && rm.ok());
    for (int32_t b = 0; b < m.batch; ++b) {
      const OracleRow row = gather_row(m, b);
      const Eigen::MatrixXd X = row_logits(m, b, row);
      for (int32_t h = 0; h < m.heads; ++h) {
        int64_t ties = 0;
        if (X.cols() > 0) ties = (X.row(h).array() == X.row(h).maxCoeff()).count();
        if (ties & (ties - 1)) continue;  // not a power of two (0: empty row, exact as well)
        const size_t bh = static_cast<size_t>(b) * m.heads + h;
        for (int32_t d = 0; d < m.d_v(); ++d) {
          const double o = ref.out[bh * m.d_v() + d];
          const double want = mla::round_to_bf16(static_cast<float>(o));
          ASSERT_EQ(rs.out[bh * m.d_v() + d], want)
              << "simt case " << i << " b " << b << " h " << h << " d " << d;
          ASSERT_EQ(rm.out[bh * m.d_v() + d], want)
              << "mma case " << i << " b " << b << " h " << h << " d " << d;
        }
        // lse = x_max + ln(t): fp32 log and add, within 2 ulps.
        const double tol = 4 * kU32 * (std::abs(ref.lse[bh]) + 1);
        if (std::isfinite(ref.lse[bh])) {
          EXPECT_NEAR(rs.lse[bh], ref.lse[bh], tol);
          EXPECT_NEAR(rm.lse[bh], ref.lse[bh], tol);
        } else {
          EXPECT_EQ(rs.lse[bh], ref.lse[bh]);
          EXPECT_EQ(rm.lse[bh], ref.lse[bh]);
        }
        ++heads_checked;
      }
    }
  }
  std::printf("[exact] %lld (row, head) pairs compared bit for bit\n",
              static_cast<long long>(heads_checked));
  EXPECT_GT(heads_checked, 1000);
}

// ---- Pieces of the pipeline ----

TEST(HostPipeline, DecodedTokensEqualSharedDequantK) {
  CounterRng rng(kSeed + 7, Stream::kGenerator);
  for (int i = 0; i < 30; ++i) {
    Case c = random_recipe(rng);
    c.scales = {ScaleMode::kRandom, 1, 254};  // extreme scales: fp32 subnormals and overflow
    c.kv_values.special_fraction = 0.1;
    MaterializedCase m = materialize(c);
    for (size_t j = 0; j < m.cache.size(); j += 97) m.cache.mut()[j] = static_cast<uint8_t>(j);
    const host::PaddedColumns cols = host::padded_columns(m.geom);
    std::vector<float> tok(static_cast<size_t>(cols.dkp));
    for (int64_t s = 0; s < mla::num_slots(m.geom); s += 7) {
      const mla::TokenAddress a = mla::token_address(m.geom, s);
      host::decode_token<mla::Mutant::kNone, false>(
          m.geom, m.cache.data(), static_cast<int64_t>(m.cache.size()), a, cols, tok.data());
      for (int32_t d = 0; d < m.d_qk(); ++d) {
        const float want = mla::dequant_k(m.geom, m.cache.data(), a, d);
        ASSERT_EQ(mla::float_to_bits(tok[cols.col(d)]), mla::float_to_bits(want))
            << "slot " << s << " dim " << d;
      }
      for (int32_t col = cols.nope; col < cols.padded_nope; ++col) ASSERT_EQ(tok[col], 0.0f);
    }
  }
}

TEST(HostPipeline, BadBuffersBecomeErrorsNotCrashes) {
  Case c;
  c.geom.page_size = 4;
  c.geom.num_pages = 2;
  c.batch = 2;
  c.heads = 2;
  c.topk = 8;
  const MaterializedCase good = materialize(c);
  for (const std::string name : {"cpu-simt", "cpu-mma"}) {
    auto backend = make_backend(name);
    ASSERT_TRUE(backend->run(good).ok());
    MaterializedCase m = good;
    m.indices[3] = 8;  // one past the last slot
    RunResult r = backend->run(m);
    EXPECT_EQ(r.status, RunStatus::kError);
    EXPECT_NE(r.message.find("indices[0][3]"), std::string::npos) << r.message;
    m = good;
    m.indices[0] = -2;  // only -1 is invalid under the default convention
    EXPECT_EQ(backend->run(m).status, RunStatus::kError);
    m.conv.invalid_index = mla::InvalidIndexRule::kAnyNegative;
    EXPECT_TRUE(backend->run(m).ok());
    m = good;
    m.cache.mut().pop_back();  // (resize(size() - 1) draws a false -Wstringop-overflow from gcc 12)
    EXPECT_EQ(backend->run(m).status, RunStatus::kError);
    m = good;
    m.q.resize(m.q.size() - 1);
    EXPECT_EQ(backend->run(m).status, RunStatus::kError);
    m = good;
    m.sink.assign(1, 0.0f);  // fewer than heads
    EXPECT_EQ(backend->run(m).status, RunStatus::kError);
  }
}

TEST(HostModels, SinkInfinitiesAndEmptyRows) {
  Case c;
  c.geom.page_size = 64;
  c.geom.num_pages = 2;
  c.batch = 2;
  c.heads = 3;
  c.topk = 70;
  c.topk_length = std::vector<int32_t>{70, 0};  // row 1 is empty
  c.sink = std::vector<double>{HUGE_VAL, -HUGE_VAL, 0.0};
  const MaterializedCase m = materialize(c);
  for (const std::string name : {"cpu-simt", "cpu-mma", "cpu-mma-split-max"}) {
    const RunResult r = make_backend(name)->run(m);
    ASSERT_TRUE(r.ok());
    const int32_t dv = m.d_v();
    for (int32_t d = 0; d < dv; ++d) {
      EXPECT_EQ(r.out[0 * dv + d], 0.0) << "+inf sink gives out 0";
      for (int32_t h = 0; h < 3; ++h) EXPECT_EQ(r.out[(3 + h) * dv + d], 0.0) << "empty row";
    }
    for (int32_t h = 0; h < 3; ++h) EXPECT_EQ(r.lse[3 + h], HUGE_VAL) << "FlashMLA empty LSE";
    // -inf sink: exactly the same bits as no sink at all.
    MaterializedCase no_sink = m;
    no_sink.sink.clear();
    const RunResult r2 = make_backend(name)->run(no_sink);
    EXPECT_EQ(testing::head_out_bits(m, r, 0, 1), testing::head_out_bits(m, r2, 0, 1));
    EXPECT_EQ(testing::head_lse_bits(m, r, 0, 1), testing::head_lse_bits(m, r2, 0, 1));
  }
}

// ---- cpu-mma-small: the sm_120-sized configuration's 32-token tiles ----

// A MODEL1 case of B = 2, H = 16 and `topk` random valid entries over 8 pages of 64 tokens.
Case small_tile_case(int topk, uint64_t seed) {
  Case c;
  c.name = "small-tile";
  c.geom.layout = mla::Layout::kModel1;
  c.geom.page_size = 64;
  c.geom.num_pages = 16;
  c.batch = 2;
  c.heads = 16;
  c.topk = topk;
  c.data_seed = seed;
  return c;
}

TEST(CpuMmaSmall, NamesItsTileAndTheToleranceModelCountsIt) {
  auto small = make_backend("cpu-mma-small"), dflt = make_backend("cpu-mma");
  EXPECT_EQ(small->traits().name, "cpu-mma-small");
  EXPECT_EQ(small->traits().token_tile, mla::kMmaSmallTokenTile);
  EXPECT_EQ(dflt->traits().token_tile, 0);  // the precision's default
  EXPECT_EQ(pipeline_of(*small).token_tile, mla::kMmaSmallTokenTile);
  EXPECT_EQ(pipeline_of(*dflt).token_tile, mla::kMmaTokenTile);
  // More tiles, more rescales: on a 512-entry list the 32-token bound is wider somewhere and
  // nowhere narrower than the 64-token one.
  const MaterializedCase m = materialize(small_tile_case(512, 7));
  const OracleResult ref = run_oracle_eigen(m, 1);
  const Bounds b32 = compute_bounds(m, ref, pipeline_of(*small));
  const Bounds b64 = compute_bounds(m, ref, pipeline_of(*dflt));
  ASSERT_EQ(b32.out.size(), b64.out.size());
  int wider = 0;
  for (size_t i = 0; i < b32.out.size(); ++i) {
    ASSERT_GE(b32.out[i], b64.out[i]) << "element " << i;
    wider += b32.out[i] > b64.out[i];
  }
  EXPECT_GT(wider, 0);
}

// A list of at most 32 entries is one tile in both configurations (the 64-token tile's chunks
// 4-7 add +0): the same bits. Longer lists fold other tiles (other rescales, other row-sum
// order): some output bit differs, so the tile parameter is live.
TEST(CpuMmaSmall, SameBitsAsCpuMmaOnOneTileOtherBitsOnLongerLists) {
  auto small = make_backend("cpu-mma-small"), dflt = make_backend("cpu-mma");
  for (int topk : {1, 7, 31, 32}) {
    const MaterializedCase m = materialize(small_tile_case(topk, 100 + topk));
    const RunResult a = small->run(m), b = dflt->run(m);
    ASSERT_TRUE(a.ok() && b.ok()) << a.message << b.message;
    EXPECT_TRUE(testing::same_bits(a, b)) << "topk " << topk;
  }
  int differ = 0;
  for (int topk : {64, 200, 512}) {
    const MaterializedCase m = materialize(small_tile_case(topk, 200 + topk));
    const RunResult a = small->run(m), b = dflt->run(m);
    ASSERT_TRUE(a.ok() && b.ok()) << a.message << b.message;
    differ += !testing::same_bits(a, b);
  }
  EXPECT_GT(differ, 0) << "cpu-mma-small gave cpu-mma's bits on every multi-tile list";
}

}  // namespace
}  // namespace mlafuzz
