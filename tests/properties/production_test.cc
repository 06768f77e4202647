// The production decode of DeepSeek-V4-Flash (docs/SPEC.md section 8) on the CPU: case format
// version 2, the joint softmax in both oracles and both host models, the s_q axis, and the
// production properties on generated cases.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "core/case.h"
#include "core/materialize.h"
#include "harness/backends/registry.h"
#include "oracle/oracle.h"
#include "properties/evaluate.h"
#include "properties/generate.h"
#include "properties/properties.h"

namespace mlafuzz {
namespace {

std::string field_of(const std::string& json) {
  try {
    case_from_json(json);
  } catch (const CaseError& e) {
    return e.field();
  }
  return "(accepted)";
}

TEST(CaseV2, FieldsRoundTripAndVersionOneStillLoads) {
  Case c;
  c.batch = 2;
  c.heads = 3;
  c.topk = 4;
  c.s_q = 3;
  c.geom.page_size = 8;
  c.geom.num_pages = 2;
  ExtraCache e;
  e.page_size = 2;
  e.num_pages = 5;
  e.topk = 6;
  e.topk_length = std::vector<int32_t>{6, 0};
  e.page_order = {4, 3, 2, 1, 0};
  c.extra = e;
  const Case x = with_explicit_indices(c);
  ASSERT_EQ(x.indices.size(), 6u);
  ASSERT_EQ(x.extra->indices.size(), 6u);
  const Case y = case_from_json(to_json(x));
  EXPECT_EQ(to_json(y), to_json(x));
  EXPECT_EQ(content_hash(materialize(y)), content_hash(materialize(x)));
  // A version-1 file loads as version 2 and keeps its meaning; [B][topk] stays valid for s_q 1.
  const Case v1 = case_from_json(R"({"version": 1, "batch": 2, "topk": 2, "heads": 1,
      "indices": [[0, 1], [2, -1]]})");
  EXPECT_EQ(v1.version, kCaseFormatVersion);
  EXPECT_EQ(v1.s_q, 1);
  EXPECT_FALSE(v1.extra.has_value());
  EXPECT_EQ(v1.indices[1][1], -1);
}

TEST(CaseV2, ValidationNamesTheField) {
  EXPECT_EQ(field_of(R"({"version": 1, "s_q": 2})"), "s_q");  // a version-2 field in version 1
  EXPECT_EQ(field_of(R"({"version": 1, "extra": {}})"), "extra");
  EXPECT_EQ(field_of(R"({"version": 2, "s_q": 0})"), "s_q");
  EXPECT_EQ(field_of(R"({"version": 2, "s_q": 2, "batch": 1, "topk": 1,
      "indices": [[[0]]]})"),
            "indices[0]");
  EXPECT_EQ(field_of(R"({"version": 2, "batch": 2, "topk": 1, "geometry": {"num_pages": 1},
      "s_q": 1, "extra": {"topk": 6, "geometry": {"page_size": 2, "num_pages": 3},
      "indices": [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 6]]}})"),
            "extra.indices[1][5]");
  EXPECT_EQ(field_of(R"({"version": 2, "batch": 2, "topk": 1, "s_q": 2,
      "extra": {"topk": 6, "geometry": {"page_size": 2, "num_pages": 3},
      "indices": [[[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]],
                  [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 99]]]}})"),
            "extra.indices[1][1][5]");
  EXPECT_EQ(field_of(R"({"version": 2, "extra": {"topk": 2, "topk_length": [3]}})"),
            "extra.topk_length[0]");
  EXPECT_EQ(field_of(R"({"version": 2, "extra": {"geometry": {"page_size": 0}}})"),
            "extra.geometry.page_size");
  EXPECT_EQ(field_of(R"({"version": 2, "extra": {"geometry": {"layout": "v32"}}})"),
            "extra.geometry.layout");  // the layout is the main cache's
}

// A case whose main list is L1 ++ L2 against the same tokens split over a main list L1 and an
// extra list L2 (an extra cache with the main cache's values, paging and order): one joint
// softmax, so both oracles give the same result up to float64 rounding.
TEST(JointSoftmax, SplitListsEqualTheConcatenatedList) {
  Case joint;
  joint.batch = 2;
  joint.heads = 5;
  joint.s_q = 2;
  joint.topk = 12;
  joint.geom.page_size = 7;
  joint.geom.num_pages = 4;
  joint.page_order = {2, 0, 3, 1};
  joint.data_seed = 99;
  joint.index_spec.invalid_fraction = 0.2;
  joint.index_spec.duplicate_fraction = 0.2;
  joint = with_explicit_indices(joint);
  Case split = joint;
  split.topk = 5;
  ExtraCache e;
  e.page_size = 7;
  e.num_pages = 4;
  e.page_order = joint.page_order;
  e.topk = 7;
  e.same_values = true;
  for (auto& row : split.indices) {
    e.indices.emplace_back(row.begin() + 5, row.end());
    row.resize(5);
  }
  split.extra = e;
  const MaterializedCase mj = materialize(joint), ms = materialize(split);
  const OracleResult rj = run_oracle_eigen(mj, 1);
  for (const OracleResult& r : {run_oracle_eigen(ms, 1), run_oracle_loop(ms)}) {
    ASSERT_EQ(r.out.size(), rj.out.size());
    for (size_t i = 0; i < r.out.size(); ++i) EXPECT_NEAR(r.out[i], rj.out[i], 1e-12) << i;
    for (size_t i = 0; i < r.lse.size(); ++i) {
      if (std::isinf(rj.lse[i])) {
        EXPECT_EQ(r.lse[i], rj.lse[i]);
      } else {
        EXPECT_NEAR(r.lse[i], rj.lse[i], 1e-12) << i;
      }
    }
  }
}

// H = 128 with s_q = 3 and an extra cache (one row's extra_topk_length 0) on every CPU backend:
// no guard written, and a query token computed alone gives the same bits.
TEST(JointSoftmax, HostModelsRunH128AndQueryTokensAreIndependent) {
  Case c;
  c.batch = 2;
  c.heads = 128;  // H = 128 on every CPU backend
  c.s_q = 3;
  c.topk = 70;
  c.geom.page_size = 61;
  c.geom.num_pages = 3;
  ExtraCache e;
  e.page_size = 2;
  e.num_pages = 40;
  e.topk = 33;
  e.topk_length = std::vector<int32_t>{33, 0};
  c.extra = e;
  c.data_seed = 7;
  const MaterializedCase m = materialize(c);
  for (const char* name : {"cpu-simt", "cpu-mma", "oracle-loop"}) {
    auto be = make_backend(name);
    const RunResult r = be->run(m);
    ASSERT_TRUE(r.ok()) << name << ": " << r.message;
    ASSERT_EQ(r.out.size(), static_cast<size_t>(2 * 3 * 128 * m.d_v()));
    EXPECT_EQ(r.guard_violations, 0) << name;
    const RunResult alone = be->run(query_alone(m, 1, 2));
    ASSERT_TRUE(alone.ok()) << alone.message;
    for (int h = 0; h < 128; ++h) {
      std::string where;
      ASSERT_TRUE(rows_bitwise_equal(r, 128, m.d_v(), 1 * 3 + 2, h, alone, h, &where))
          << name << ": " << where;
    }
  }
}

TEST(MoveToExtra, KeepsTheExactResultAndTheTokenMultiset) {
  Case c;
  c.batch = 3;
  c.heads = 2;
  c.s_q = 2;
  c.topk = 20;
  c.geom.page_size = 16;
  c.geom.num_pages = 3;
  c.index_spec.invalid_fraction = 0.1;
  c.topk_length = std::vector<int32_t>{20, 7, 0};
  c.data_seed = 3;
  const MaterializedCase m = materialize(c);
  const OracleResult ref = run_oracle_loop(m);
  for (const MaterializedCase& v : {move_to_extra(m, 11, 3), swap_caches(move_to_extra(m, 5, 4))}) {
    ASSERT_TRUE(v.has_extra);
    const OracleResult r = run_oracle_loop(v);
    for (size_t i = 0; i < r.out.size(); ++i) EXPECT_NEAR(r.out[i], ref.out[i], 1e-12);
    for (size_t i = 0; i < r.lse.size(); ++i) {
      if (std::isinf(ref.lse[i])) {
        EXPECT_EQ(r.lse[i], ref.lse[i]);
      } else {
        EXPECT_NEAR(r.lse[i], ref.lse[i], 1e-12);
      }
    }
  }
}

// Generated cases of every family with query tokens and extra caches: every property passes on
// the CPU backends (the seed is printed; a failure names the case).
TEST(ProductionProperties, GeneratedCasesPassOnTheCpuBackends) {
  constexpr uint64_t kSeed = 1515;
  std::cout << "seed " << kSeed << "\n";
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Backend*> backends;
  for (const char* n : {"oracle", "oracle-loop", "cpu-simt", "cpu-mma"}) {
    owned.push_back(make_backend(n));
    backends.push_back(owned.back().get());
  }
  GenConfig cfg;
  cfg.production_probability = 0;
  cfg.max_work = 1 << 16;  // small: the production shapes replay from corpus/cases
  int with_extra = 0, with_tokens = 0, query_alone_ran = 0, moved = 0;
  for (uint64_t i = 0; i < 60; ++i) {
    const Case c = generate_case(kSeed, i, cfg, nullptr);
    with_extra += c.extra.has_value();
    with_tokens += c.s_q > 1;
    const CaseEvaluation ev = evaluate_case(c, backends, {});
    for (const auto& o : ev.outcomes) {
      if (!o.applicable) continue;
      query_alone_ran += o.property == "query-alone";
      moved += o.property == "move-to-extra";
      EXPECT_TRUE(o.passed) << format_outcome(o) << "\n  case " << i << " of seed " << kSeed
                            << ":\n"
                            << to_json(c);
    }
  }
  EXPECT_GT(with_extra, 5);
  EXPECT_GT(with_tokens, 5);
  EXPECT_GT(query_alone_ran, 5);
  EXPECT_GT(moved, 20);
}

}  // namespace
}  // namespace mlafuzz
