// Split-KV in the host model (mla/split_kv.h): the split rule, one split
// equal to the unsplit model bit for bit, empty splits, rows with every split empty and infinite
// sinks through the combine, the split-agree property, and the bound with the most splits.
#include "mla/split_kv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/materialize.h"
#include "core/rng.h"
#include "harness/backends/registry.h"
#include "kernels/host/host_models.h"
#include "oracle/oracle.h"
#include "properties/evaluate.h"
#include "properties/tolerance.h"
#include "tests/kernels/host/host_test_support.h"

namespace mlafuzz {
namespace {

constexpr uint64_t kSeed = 0x5eed0f5117ull;

TEST(SplitRule, CountsFollowTheRowAndTheDeviceOnly) {
  // One tile or none: one split, whatever the setting.
  for (int s : {mla::kSplitAuto, mla::kSplitMax, 1, 7}) {
    EXPECT_EQ(mla::split_count(0, s, 132), 1);
    EXPECT_EQ(mla::split_count(1, s, 132), 1);
  }
  // Automatic: sm_count / 16 splits at most (8 on 132 SMs), never more than the tiles.
  EXPECT_EQ(mla::split_count(2, mla::kSplitAuto, 132), 2);
  EXPECT_EQ(mla::split_count(8, mla::kSplitAuto, 132), 8);
  EXPECT_EQ(mla::split_count(100, mla::kSplitAuto, 132), 8);
  EXPECT_EQ(mla::split_count(100, mla::kSplitAuto, 0), 1);  // unknown device: unsplit
  EXPECT_EQ(mla::split_count(100, mla::kSplitMax, 132), mla::kMaxSplits);
  EXPECT_EQ(mla::split_count(5, mla::kSplitMax, 132), 5);
  EXPECT_EQ(mla::split_count(5, 3, 132), 3);
  EXPECT_EQ(mla::split_count(2, 3, 132), 2);
  EXPECT_EQ(mla::split_count(9, mla::kSplitOff, 132), 1);
  // The launch grid's split extent (from topk) bounds every row's count (from its topk_length):
  // the count never falls when the tile count grows.
  for (int s : {mla::kSplitAuto, mla::kSplitMax, 1, 3}) {
    for (int n = 1; n < 80; ++n)
      EXPECT_LE(mla::split_count(n - 1, s, 132), mla::split_count(n, s, 132));
  }
  // The ranges tile [0, n) in order, every split at least one tile.
  for (int n = 1; n < 70; ++n) {
    const int ns = mla::split_count(n, mla::kSplitMax, 132);
    EXPECT_EQ(mla::split_tile_begin(n, ns, 0), 0);
    EXPECT_EQ(mla::split_tile_begin(n, ns, ns), n);
    for (int i = 0; i < ns; ++i) {
      EXPECT_LT(mla::split_tile_begin(n, ns, i), mla::split_tile_begin(n, ns, i + 1)) << n;
    }
  }
  // Tiles a list folds: up to topk_length.
  EXPECT_EQ(mla::list_tiles<mla::Mutant::kNone>(300, -1, 64), 5);
  EXPECT_EQ(mla::list_tiles<mla::Mutant::kNone>(300, 65, 64), 2);
  EXPECT_EQ(mla::list_tiles<mla::Mutant::kNone>(300, 0, 64), 0);
}

TEST(SplitKv, OneSplitEqualsTheUnsplitModelBitForBit) {
  auto unsplit = make_backend("cpu-mma"), one = make_backend("cpu-mma-split1");
  auto many = make_backend("cpu-mma-split-max");
  EXPECT_FALSE(unsplit->traits().splits_kv);
  EXPECT_TRUE(one->traits().splits_kv);
  CounterRng rng(kSeed, Stream::kGenerator);
  int differed = 0;
  for (int i = 0; i < 40; ++i) {
    MaterializedCase m = materialize(testing::random_recipe(rng));
    const RunResult a = unsplit->run(m), b = one->run(m);
    ASSERT_TRUE(a.ok() && b.ok()) << a.message << b.message;
    ASSERT_TRUE(testing::same_bits(a, b)) << "case " << i << " (seed 0x5eed0f5117)";
    // split_override 1 on the many-split backend: the same bits again.
    m.split_override = 1;
    const RunResult c = many->run(m);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(testing::same_bits(a, c)) << "case " << i;
    m.split_override = 0;
    if (!testing::same_bits(a, many->run(m))) ++differed;
  }
  // Many splits change the rounding (the bound covers it): the pipelines really differ.
  EXPECT_GT(differed, 0);
}

// A row of 4 tiles whose first two tiles hold no valid token (two empty splits with one split per
// tile), a row with every entry invalid, and sinks +inf, -inf, finite.
Case empty_split_case() {
  Case c;
  c.name = "split-empty";
  c.geom.page_size = 64;
  c.geom.num_pages = 8;
  c.batch = 3;
  c.heads = 3;
  c.topk = 256;
  c.indices.assign(3, std::vector<int32_t>(256, -1));
  for (int k = 128; k < 256; ++k) c.indices[0][static_cast<size_t>(k)] = k;         // tiles 2, 3
  for (int k = 0; k < 256; k += 2) c.indices[2][static_cast<size_t>(k)] = k + 100;  // all tiles
  c.sink = std::vector<double>{HUGE_VAL, -HUGE_VAL, 0.75};
  c.data_seed = 5;
  return c;
}

TEST(SplitKv, EmptySplitsEmptyRowsAndInfiniteSinksThroughTheCombine) {
  const MaterializedCase m = materialize(empty_split_case());
  const OracleResult ref = run_oracle_eigen(m, 1);
  for (const char* name : {"cpu-mma-split-max", "cpu-mma-split", "cpu-mma-split1"}) {
    const RunResult r = make_backend(name)->run(m);
    ASSERT_TRUE(r.ok()) << name << ": " << r.message;
    const int32_t dv = m.d_v();
    for (int32_t b = 0; b < 3; ++b) {
      for (int32_t h = 0; h < 3; ++h) {
        for (int32_t d = 0; d < dv; ++d) {
          const double v = r.out[(static_cast<size_t>(b) * 3 + h) * dv + d];
          ASSERT_TRUE(std::isfinite(v)) << name << " b=" << b << " h=" << h << " d=" << d;
          if (b == 1 || h == 0) {
            EXPECT_EQ(v, 0.0) << name << ": empty row or +inf sink gives 0";
          }
        }
      }
    }
    for (int32_t h = 0; h < 3; ++h) EXPECT_EQ(r.lse[3 + h], HUGE_VAL) << name << ": empty row";
    // Within the tolerance bound of the oracle (the split pipeline's terms included).
    const Bounds bd = compute_bounds(m, ref, pipeline_for(Precision::kMmaBf16));
    const BoundCheck bc = check_bounds(Side{&r.out, &r.lse, true}, Side{&ref.out, &ref.lse}, bd,
                                       m.batch, m.heads, dv);
    EXPECT_TRUE(bc.passed) << name << ": " << bc.describe();
    // -inf sink: the same bits as no sink.
    MaterializedCase no_sink = m;
    no_sink.sink.clear();
    const RunResult r2 = make_backend(name)->run(no_sink);
    ASSERT_TRUE(r2.ok());
    for (int32_t b = 0; b < 3; ++b) {
      EXPECT_EQ(testing::head_out_bits(m, r, b, 1), testing::head_out_bits(m, r2, b, 1)) << name;
      EXPECT_EQ(testing::head_lse_bits(m, r, b, 1), testing::head_lse_bits(m, r2, b, 1)) << name;
    }
  }
}

TEST(SplitKv, SplitAgreeAppliesToSplitBackendsAndPasses) {
  auto split = make_backend("cpu-mma-split"), unsplit = make_backend("cpu-mma");
  const Case c = empty_split_case();
  const CaseEvaluation ev = evaluate_case(c, {split.get(), unsplit.get()}, {"split-agree"});
  int applicable = 0;
  for (const auto& o : ev.outcomes) {
    if (o.property != "split-agree") continue;
    if (o.backend == "cpu-mma") {
      EXPECT_FALSE(o.applicable) << format_outcome(o);
    } else {
      EXPECT_TRUE(o.applicable) << format_outcome(o);
      EXPECT_TRUE(o.passed) << format_outcome(o);
      EXPECT_GT(o.tightness, 0) << "1 split against 4 splits: the bits differ somewhere";
      ++applicable;
    }
  }
  EXPECT_EQ(applicable, 1);
}

// Every row's splits depend on the row alone: rows and heads computed alone give the same bits
// with many splits (batch-alone and head-alone stay exact), here with rows of different lengths.
TEST(SplitKv, RowsAndHeadsAloneKeepTheirBits) {
  auto be = make_backend("cpu-mma-split");
  Case c;
  c.geom.page_size = 61;
  c.geom.num_pages = 12;
  c.batch = 4;
  c.heads = 40;
  c.topk = 700;
  c.topk_length = std::vector<int32_t>{700, 1, 130, 0};
  c.data_seed = 9;
  const MaterializedCase m = materialize(c);
  const RunResult full = be->run(m);
  ASSERT_TRUE(full.ok());
  for (int32_t b = 0; b < m.batch; ++b) {
    const MaterializedCase one = testing::slice_batch(m, b, 1);
    const RunResult r = be->run(one);
    ASSERT_TRUE(r.ok());
    for (int32_t h = 0; h < m.heads; ++h) {
      ASSERT_EQ(testing::head_out_bits(one, r, 0, h), testing::head_out_bits(m, full, b, h))
          << "row " << b << " head " << h;
    }
  }
  for (int32_t h : {0, 17, 39}) {
    const MaterializedCase one = testing::slice_heads(m, h, 1);
    const RunResult r = be->run(one);
    ASSERT_TRUE(r.ok());
    for (int32_t b = 0; b < m.batch; ++b) {
      ASSERT_EQ(testing::head_out_bits(one, r, b, 0), testing::head_out_bits(m, full, b, h));
    }
  }
}

}  // namespace
}  // namespace mlafuzz
