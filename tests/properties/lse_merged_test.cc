// The LSE-merged production pipeline (docs/SPEC.md section 8; properties/tolerance.h):
// the host model cpu-mma-lse-merged (main and extra lists computed alone, each stored in bf16 with
// its LSE, then merged) and the tolerance bound of such a pipeline, which a plugin or a python:
// kernel selects with extra_pipeline = lse_merged.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>

#include "core/case.h"
#include "core/materialize.h"
#include "harness/backends/registry.h"
#include "oracle/oracle.h"
#include "properties/evaluate.h"
#include "properties/generate.h"
#include "properties/properties.h"
#include "properties/tolerance.h"

namespace mlafuzz {
namespace {

constexpr uint64_t kSeed = 2424;

GenConfig extra_cases() {
  GenConfig cfg;
  cfg.production_probability = 0.2;
  cfg.max_work = 1 << 17;
  return cfg;
}

TEST(LseMerged, DeclaresItsPipelineAndSelectsTheMergedBound) {
  const auto merged = make_backend("cpu-mma-lse-merged");
  const auto joint = make_backend("cpu-mma");
  EXPECT_EQ(merged->traits().extra_pipeline, ExtraPipeline::kLseMerged);
  EXPECT_EQ(joint->traits().extra_pipeline, ExtraPipeline::kJoint);
  EXPECT_TRUE(pipeline_of(*merged).lse_merged);
  EXPECT_FALSE(pipeline_of(*joint).lse_merged);
  EXPECT_STREQ(extra_pipeline_name(ExtraPipeline::kLseMerged), "lse_merged");
}

// Without an extra cache there is nothing to merge: the same bits as cpu-mma, and the same bound.
TEST(LseMerged, WithoutAnExtraCacheItIsCpuMmaBitForBit) {
  std::cout << "seed " << kSeed << "\n";
  const auto merged = make_backend("cpu-mma-lse-merged");
  const auto joint = make_backend("cpu-mma");
  GenConfig cfg = extra_cases();
  cfg.extra_cache = false;
  for (uint64_t i = 0; i < 20; ++i) {
    const MaterializedCase m = materialize(generate_case(kSeed, i, cfg, nullptr));
    ASSERT_FALSE(m.has_extra);
    const RunResult a = merged->run(m), b = joint->run(m);
    ASSERT_EQ(a.status, RunStatus::kOk) << a.message;
    EXPECT_EQ(a.out_raw, b.out_raw) << "case " << i << " of seed " << kSeed;
    // Bitwise (the guard bands hold NaN canaries, which == would never match).
    ASSERT_EQ(a.lse_raw.size(), b.lse_raw.size());
    EXPECT_EQ(std::memcmp(a.lse_raw.data(), b.lse_raw.data(), a.lse_raw.size() * sizeof(float)), 0)
        << "case " << i << " of seed " << kSeed;
    const OracleResult ref = run_oracle_eigen(m, 1);
    const Bounds bm = compute_bounds(m, ref, pipeline_of(*merged));
    const Bounds bj = compute_bounds(m, ref, pipeline_of(*joint));
    EXPECT_EQ(bm.out, bj.out);
    EXPECT_EQ(bm.lse, bj.lse);
  }
}

// With an extra cache the two pipelines round differently, and each stays within its own bound.
// The largest error/bound of the merged model under each bound is printed (under the joint
// bound it is what a kernel declaring the wrong pipeline would be judged by).
TEST(LseMerged, EachPipelineStaysWithinItsOwnBound) {
  std::cout << "seed " << kSeed << "\n";
  const auto merged = make_backend("cpu-mma-lse-merged");
  const auto joint = make_backend("cpu-mma");
  int with_extra = 0, differ = 0;
  double worst_merged = 0, worst_under_joint = 0;
  for (uint64_t i = 0; i < 80 && with_extra < 30; ++i) {
    const MaterializedCase m = materialize(generate_case(kSeed, i, extra_cases(), nullptr));
    if (!m.has_extra) continue;
    ++with_extra;
    const OracleResult ref = run_oracle_eigen(m, 1);
    const RunResult a = merged->run(m), b = joint->run(m);
    ASSERT_EQ(a.status, RunStatus::kOk) << a.message;
    differ += a.out_raw != b.out_raw;
    const Bounds bm = compute_bounds(m, ref, pipeline_of(*merged));
    const Bounds bj = compute_bounds(m, ref, pipeline_of(*joint));
    const Side ref_side{&ref.out, &ref.lse, false};
    const BoundCheck cm =
        check_bounds({&a.out, &a.lse, true}, ref_side, bm, m.query_rows(), m.heads, m.d_v());
    const BoundCheck cj =
        check_bounds({&b.out, &b.lse, true}, ref_side, bj, m.query_rows(), m.heads, m.d_v());
    const BoundCheck cmj =
        check_bounds({&a.out, &a.lse, true}, ref_side, bj, m.query_rows(), m.heads, m.d_v());
    EXPECT_TRUE(cm.passed) << "cpu-mma-lse-merged: " << cm.describe() << "\n  case " << i
                           << " of seed " << kSeed << ":\n"
                           << to_json(m.recipe);
    EXPECT_TRUE(cj.passed) << "cpu-mma: " << cj.describe() << "\n  case " << i << " of seed "
                           << kSeed;
    worst_merged = std::max(worst_merged, cm.tightness);
    worst_under_joint = std::max(worst_under_joint, cmj.tightness);
  }
  std::cout << "cases with an extra cache " << with_extra << ", outputs differing from cpu-mma "
            << differ << "; cpu-mma-lse-merged error/bound: merged bound " << worst_merged
            << ", joint bound " << worst_under_joint << "\n";
  EXPECT_GT(with_extra, 10);
  EXPECT_GT(differ, 5);  // the second rounding is visible: the model is not the joint one
  // Judged by the joint bound, the correct LSE-merged model fails (1.3 at this seed): the joint
  // bound does not cover the partials' bf16 rounding, which is why the merged bound exists.
  EXPECT_GT(worst_under_joint, 1.0);
  EXPECT_LE(worst_merged, 1.0);
}

// Every property on generated cases (extra caches among them) with the LSE-merged model.
TEST(LseMerged, GeneratedCasesPassEveryProperty) {
  std::cout << "seed " << kSeed << "\n";
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Backend*> backends;
  for (const char* n : {"oracle", "cpu-simt", "cpu-mma-lse-merged"}) {
    owned.push_back(make_backend(n));
    backends.push_back(owned.back().get());
  }
  int with_extra = 0;
  for (uint64_t i = 0; i < 40; ++i) {
    GenConfig cfg = extra_cases();
    cfg.production_probability = 0;
    cfg.max_work = 1 << 15;
    const Case c = generate_case(kSeed + 1, i, cfg, nullptr);
    with_extra += c.extra.has_value();
    const CaseEvaluation ev = evaluate_case(c, backends, {});
    for (const auto& o : ev.outcomes) {
      if (!o.applicable) continue;
      EXPECT_TRUE(o.passed) << format_outcome(o) << "\n  case " << i << " of seed " << kSeed + 1
                            << ":\n"
                            << to_json(c);
    }
  }
  EXPECT_GT(with_extra, 5);
}

}  // namespace
}  // namespace mlafuzz
