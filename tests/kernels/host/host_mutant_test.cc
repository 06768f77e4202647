// The cpu-mma mutants (kernels/host/host_mutants.h): each one is live (differs from the correct
// model on a case made to expose it), inert where its bug cannot apply, and never crashes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/backend.h"
#include "core/materialize.h"
#include "kernels/host/host_models.h"
#include "kernels/host/host_mutants.h"
#include "mla/mutants.h"
#include "mla/split_kv.h"
#include "tests/kernels/host/host_test_support.h"

namespace mlafuzz {
namespace {

using mla::Mutant;

std::vector<Mutant> host_mutants() {
  std::vector<Mutant> all;
  for (int32_t i = 0; i < static_cast<int32_t>(Mutant::kCount); ++i) {
    if (host_mutant_supported(static_cast<Mutant>(i))) all.push_back(static_cast<Mutant>(i));
  }
  return all;
}

// A case that exposes mutant mu: MODEL1, P = 64 over 4 pages, B = 2, H = 4, topk = 100 (one full
// and one partial tile) plus the one feature the bug needs.
Case exposing_case(Mutant mu) {
  Case c;
  c.name = std::string("expose-") + mla::mutant_name(mu);
  c.geom.page_size = 64;
  c.geom.num_pages = 4;
  c.batch = 2;
  c.heads = 4;
  c.topk = 100;
  c.data_seed = 11;
  switch (mu) {
    case Mutant::kWrongScaleGroup:
      c.scales = {ScaleMode::kRandom, 120, 130};
      break;
    case Mutant::kPageStrideIgnored:
      c.geom.page_stride = mla::min_page_stride(c.geom) + 1000;
      break;
    case Mutant::kPageSizePow2:
      c.geom.page_size = 61;
      break;
    case Mutant::kInvalidIndexUnmasked:
      c.index_spec.invalid_fraction = 0.3;
      break;
    case Mutant::kTopkLengthIgnored:
      c.topk_length = std::vector<int32_t>{50, 10};
      break;
    case Mutant::kNoRescale:
      c.topk = 256;
      c.q_values.magnitude = 4;
      break;
    case Mutant::kSinkInLse:
    case Mutant::kSinkIgnored:
      c.sink = std::vector<double>{1.0, -1.0, 0.5, 2.0};
      break;
    case Mutant::kEmptyRowNaN:
      c.topk_length = std::vector<int32_t>{0, 100};
      break;
    case Mutant::kStorePaddedColumns:
      c.out_head_pad = 8;
      break;
    case Mutant::kSplitEmptyNaN:  // row 0's first tile (one split per tile) holds no valid token
      c.indices.assign(2, std::vector<int32_t>(100, -1));
      for (int32_t k = 0; k < 100; ++k) {
        if (k >= 64) c.indices[0][static_cast<size_t>(k)] = k;
        c.indices[1][static_cast<size_t>(k)] = 2 * k;
      }
      break;
    case Mutant::kSinkPerSplit:
      c.sink = std::vector<double>{1.0, -1.0, 0.5, 2.0};
      break;
    default:
      break;
  }
  return c;
}

bool differs(const RunResult& a, const RunResult& b) {
  return !testing::same_bits(a, b) || a.guard_violations != b.guard_violations;
}

TEST(CpuMmaMutants, CatalogueCoversEveryHostMutant) {
  const std::vector<Mutant> all = host_mutants();
  EXPECT_EQ(all.size(), static_cast<size_t>(Mutant::kCount) - 2);  // not kNone, kMissingBarrier
  EXPECT_FALSE(host_mutant_supported(Mutant::kMissingBarrier));
  EXPECT_EQ(make_cpu_mma_mutant_backend(Mutant::kMissingBarrier), nullptr);
  EXPECT_EQ(make_cpu_mma_mutant_backend(Mutant::kNone), nullptr);
  for (Mutant mu : all) {
    auto b = make_cpu_mma_mutant_backend(mu);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->traits().name, std::string("cpu-mma~") + mla::mutant_name(mu));
    EXPECT_EQ(b->traits().precision, Precision::kMmaBf16);
  }
}

// The correct model a mutant varies: cpu-mma, or for the combine's mutants the split pipeline
// with one split per tile (what they run).
std::unique_ptr<Backend> correct_for(Mutant mu) {
  return mla::is_combine_mutant(mu) ? make_cpu_mma_split_backend(mla::kSplitMax)
                                    : make_cpu_mma_backend();
}

TEST(CpuMmaMutants, EachMutantIsLiveOnItsExposingCase) {
  for (Mutant mu : host_mutants()) {
    const MaterializedCase m = materialize(exposing_case(mu));
    const RunResult ref = correct_for(mu)->run(m);
    ASSERT_TRUE(ref.ok());
    ASSERT_EQ(ref.guard_violations, 0);
    const RunResult r = make_cpu_mma_mutant_backend(mu)->run(m);
    ASSERT_TRUE(r.ok()) << mla::mutant_name(mu) << ": " << r.message;
    EXPECT_TRUE(differs(ref, r)) << mla::mutant_name(mu) << " is not live on its exposing case";
  }
}

// Where a bug's trigger is absent the mutant computes exactly the correct bits: this pins down
// the mechanics modelled (and keeps a mutant from being "killed" by an unrelated difference).
TEST(CpuMmaMutants, InertWhereTheirBugCannotApply) {
  struct Inert {
    Mutant mu;
    Case c;
  };
  std::vector<Inert> cases;
  Case v32;  // nope 512 is already a power of two: no padded columns to unmask or store
  v32.geom = {mla::Layout::kV32, 512, 64, 128, 64, 0, 4};
  v32.batch = 2;
  v32.heads = 4;
  v32.topk = 100;
  v32.out_head_pad = 8;
  cases.push_back({Mutant::kUnmaskedPadColumns, v32});
  cases.push_back({Mutant::kStorePaddedColumns, v32});
  Case pow2 = exposing_case(Mutant::kNone);  // P = 64: next_pow2(P) == P
  cases.push_back({Mutant::kPageSizePow2, pow2});
  cases.push_back({Mutant::kPageStrideIgnored, pow2});     // minimum stride
  cases.push_back({Mutant::kTopkLengthIgnored, pow2});     // no topk_length
  cases.push_back({Mutant::kInvalidIndexUnmasked, pow2});  // no invalid entry
  cases.push_back({Mutant::kSinkIgnored, pow2});           // no sink
  Case full_tiles = pow2;
  full_tiles.topk = 128;
  cases.push_back({Mutant::kDropPartialTile, full_tiles});
  // The combine's: no empty split; no sink; one tile (one split: a_0 = exp2(0) = exp(0) = 1).
  // (sink-per-split is not inert with one split: its sink lands in the LSE.)
  cases.push_back({Mutant::kSplitEmptyNaN, pow2});
  cases.push_back({Mutant::kSinkPerSplit, pow2});
  Case one_tile = pow2;
  one_tile.topk = 64;
  one_tile.sink = std::vector<double>{1.0, -1.0, 0.5, 2.0};
  cases.push_back({Mutant::kSplitMergeLog2, one_tile});
  for (const Inert& in : cases) {
    const MaterializedCase m = materialize(in.c);
    const RunResult ref = correct_for(in.mu)->run(m),
                    r = make_cpu_mma_mutant_backend(in.mu)->run(m);
    ASSERT_TRUE(ref.ok() && r.ok());
    EXPECT_FALSE(differs(ref, r)) << mla::mutant_name(in.mu);
  }
}

TEST(CpuMmaMutants, NeverCrashOrWriteOutsideTheirBuffers) {
  CounterRng rng(0x6d7574616e74ull, Stream::kGenerator);
  std::vector<MaterializedCase> cases;
  for (int i = 0; i < 25; ++i) cases.push_back(materialize(testing::random_recipe(rng)));
  for (Mutant mu : host_mutants()) {
    auto b = make_cpu_mma_mutant_backend(mu);
    for (const MaterializedCase& m : cases) {
      const RunResult r = b->run(m);
      ASSERT_TRUE(r.ok()) << mla::mutant_name(mu) << ": " << r.message;
      ASSERT_EQ(r.out_raw.size(), OutputBuffers(m).out.size());
    }
  }
}

}  // namespace
}  // namespace mlafuzz
