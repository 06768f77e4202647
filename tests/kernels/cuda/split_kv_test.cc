// GPU tests of the split-KV kernels (docs/SPEC.md: split counts 1, automatic and one per tile,
// combined by the combine kernel): the unsplit kernel's bits with one split, agreement within
// the bound, empty splits and rows, infinite sinks, rows alone. Skipped without a CUDA device.
#include <gtest/gtest.h>

#include "tests/kernels/cuda/gpu_test_support.h"

namespace mlafuzz {
namespace {

using testing::check_within;
using testing::kernel_bound;
using testing::kSeed;
using testing::random_cases;
using testing::random_recipe;

// ---- split-KV: split counts 1, automatic and one per tile ----

// The split pipeline with one split is the unsplit kernel's arithmetic (a_0 = exp(0) = 1): the
// same bits as cuda-mma, through the partials and the combine kernel.
TEST(CudaSplit, OneSplitGivesTheUnsplitKernelsBits) {
  SKIP_WITHOUT_DEVICE();
  auto a = make_backend("cuda-mma"), b = make_backend("cuda-mma-split1");
  CounterRng rng(kSeed + 10, Stream::kGenerator);
  const int cases = random_cases(60);
  for (int i = 0; i < cases; ++i) {
    const MaterializedCase m = materialize(random_recipe(rng));
    const RunResult ra = a->run(m), rb = b->run(m);
    ASSERT_TRUE(ra.ok() && rb.ok()) << ra.message << rb.message;
    EXPECT_EQ(rb.guard_violations, 0);
    ASSERT_TRUE(testing::same_bits(ra, rb)) << "case " << i;
  }
}

// Split counts 1 and one per tile (split_override, as the split-agree property sets it) against
// the automatic count: within twice the bound; every count within the bound of the oracle.
TEST(CudaSplit, SplitCountsAgreeWithinTheBound) {
  SKIP_WITHOUT_DEVICE();
  auto be = make_backend("cuda-mma-split");
  ASSERT_TRUE(be->traits().splits_kv);
  CounterRng rng(kSeed + 11, Stream::kGenerator);
  const int cases = random_cases(100);
  for (int i = 0; i < cases; ++i) {
    MaterializedCase m = materialize(random_recipe(rng));
    const RunResult clean = be->run(m);
    ASSERT_TRUE(clean.ok()) << clean.message;
    const OracleResult ref = run_oracle_eigen(m, 1);
    const Bounds bd = kernel_bound(m, ref, true);
    const std::string what = "case " + std::to_string(i) + " (topk " + std::to_string(m.topk) + ")";
    check_within(m, clean, ref.out, ref.lse, bd, false, what + " automatic vs oracle");
    for (int split : {1, -1, 3}) {
      m.split_override = split;
      const RunResult r = be->run(m);
      ASSERT_TRUE(r.ok()) << r.message;
      const std::string w = what + " split " + std::to_string(split);
      check_within(m, r, ref.out, ref.lse, bd, false, w + " vs oracle");
      check_within(m, r, clean.out, clean.lse, add_bounds(bd, bd), true, w + " vs automatic");
    }
    if (HasFailure()) return;
  }
}

// Splits without a valid token, a row whose splits are all empty, sinks +inf / -inf / finite.
TEST(CudaSplit, EmptySplitsEmptyRowsAndInfiniteSinks) {
  SKIP_WITHOUT_DEVICE();
  Case c;
  c.geom.page_size = 64;
  c.geom.num_pages = 8;
  c.batch = 3;
  c.heads = 3;
  c.topk = 256;
  c.indices.assign(3, std::vector<int32_t>(256, -1));
  for (int k = 128; k < 256; ++k) c.indices[0][static_cast<size_t>(k)] = k;  // tiles 0, 1 empty
  for (int k = 0; k < 256; k += 2) c.indices[2][static_cast<size_t>(k)] = k + 100;
  c.sink = std::vector<double>{HUGE_VAL, -HUGE_VAL, 0.75};
  const MaterializedCase m = materialize(c);
  const OracleResult ref = run_oracle_eigen(m, 1);
  for (const char* name : {"cuda-mma-split-max", "cuda-mma-split", "cuda-mma-split1"}) {
    const RunResult r = make_backend(name)->run(m);
    ASSERT_TRUE(r.ok()) << name << ": " << r.message;
    check_within(m, r, ref.out, ref.lse, kernel_bound(m, ref, true), false, name);
    const int32_t dv = m.d_v();
    for (int32_t b = 0; b < 3; ++b) {
      for (int32_t h = 0; h < 3; ++h) {
        for (int32_t d = 0; d < dv; ++d) {
          const double v = r.out[(static_cast<size_t>(b) * 3 + h) * dv + d];
          ASSERT_TRUE(std::isfinite(v)) << name << " b=" << b << " h=" << h << " d=" << d;
          if (b == 1 || h == 0) {
            EXPECT_EQ(v, 0.0) << name << ": empty row or +inf sink";
          }
        }
      }
    }
    for (int32_t h = 0; h < 3; ++h) EXPECT_EQ(r.lse[3 + h], HUGE_VAL) << name << ": empty row";
  }
}

// The split count of a row depends on the row alone: a row computed alone keeps its bits.
TEST(CudaSplit, RowsAloneKeepTheirBits) {
  SKIP_WITHOUT_DEVICE();
  Case c;
  c.geom.page_size = 61;
  c.geom.num_pages = 12;
  c.batch = 4;
  c.heads = 40;
  c.topk = 700;
  c.topk_length = std::vector<int32_t>{700, 1, 130, 0};
  c.data_seed = 9;
  const MaterializedCase m = materialize(c);
  for (const char* name : {"cuda-mma-split", "cuda-mma-split-max"}) {
    auto be = make_backend(name);
    const RunResult full = be->run(m);
    ASSERT_TRUE(full.ok()) << full.message;
    for (int32_t b = 0; b < m.batch; ++b) {
      const MaterializedCase one = testing::slice_batch(m, b, 1);
      const RunResult r = be->run(one);
      ASSERT_TRUE(r.ok());
      for (int32_t h = 0; h < m.heads; ++h) {
        ASSERT_EQ(testing::head_out_bits(one, r, 0, h), testing::head_out_bits(m, full, b, h))
            << name << " row " << b << " head " << h;
        ASSERT_EQ(testing::head_lse_bits(one, r, 0, h), testing::head_lse_bits(m, full, b, h));
      }
    }
  }
}

}  // namespace
}  // namespace mlafuzz
