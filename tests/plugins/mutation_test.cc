// Mutation score on the CPU: every planted bug the host model implements is killed within a
// small budget, by a property that the unmutated cpu-mma passes on the same shrunk case, and
// shrinks to a case a person can read. The budgets are counts (cases to the first failure,
// evaluations of shrinking), so the results do not depend on the machine's speed; the
// wall-clock limits are only a guard against a hang.
#include "harness/mutation/mutation.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "harness/backends/registry.h"
#include "properties/shrink.h"
#include "tests/core/test_util.h"

namespace mlafuzz {
namespace {

class CpuMutants : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    MutationOptions o;
    o.kind = MutantKind::kCpu;
    o.seed = 1;
    o.budget_seconds = 600;  // a guard against a hang: max_cases decides
    o.max_cases = 200;
    o.shrink.max_seconds = 600;  // likewise: the default count of evaluations decides
    options_ = new MutationOptions(o);
    results_ = new std::vector<MutantResult>(run_mutants(o, nullptr));
  }
  static void TearDownTestSuite() {
    delete results_;
    delete options_;
  }
  static const MutationOptions* options_;
  static const std::vector<MutantResult>* results_;
};
const MutationOptions* CpuMutants::options_ = nullptr;
const std::vector<MutantResult>* CpuMutants::results_ = nullptr;

TEST_F(CpuMutants, EveryHostMutantIsKilledAndOnlyTheRaceIsSkipped) {
  ASSERT_EQ(results_->size(), all_mutants().size());
  for (const MutantResult& r : *results_) {
    if (r.mutant == mla::Mutant::kMissingBarrier) {
      EXPECT_EQ(r.status, MutantStatus::kSkipped);
      EXPECT_NE(r.skip_reason.find("GPU only"), std::string::npos) << r.skip_reason;
      continue;
    }
    EXPECT_EQ(r.status, MutantStatus::kKilled) << r.name << " survived " << r.cases << " cases";
    EXPECT_TRUE(r.control_passed) << r.name
                                  << ": the unmutated cpu-mma fails too: " << r.control_detail;
    EXPECT_FALSE(r.property.empty()) << r.name;
    EXPECT_FALSE(r.first_property.empty()) << r.name;
  }
}

// The score covers the catalogue: the mutants killed are exactly the cpu-mma variants the
// registry can make in this build (mla/mutants.h, less those the host model lacks).
TEST_F(CpuMutants, EveryMutantTheRegistryCanMakeIsKilled) {
  std::vector<std::string> killed;
  for (const MutantResult& r : *results_) {
    if (r.status == MutantStatus::kKilled) killed.push_back(r.backend);
  }
  const std::vector<std::string> buildable = mutant_backend_names(/*gpu=*/false);
  EXPECT_FALSE(buildable.empty());
  EXPECT_EQ(killed, buildable);
  const MutationSummary s = summarize(*results_);
  EXPECT_EQ(s.killed, static_cast<int>(buildable.size()));
  EXPECT_EQ(s.killed + s.skipped, static_cast<int>(all_mutants().size()));
}

TEST_F(CpuMutants, KillsAreFastAndShrunkCasesAreSmall) {
  const MutationSummary s = summarize(*results_);
  EXPECT_LT(s.median_cases, 50);
  for (const MutantResult& r : *results_) {
    if (r.status != MutantStatus::kKilled) continue;
    ASSERT_TRUE(r.shrunk.has_value()) << r.name;
    // Every shrink reaches a fixed point within the default count of evaluations.
    EXPECT_EQ(r.shrink_stopped_by, ShrinkStop::kFixedPoint)
        << r.name << " after " << r.shrink_evaluations << " evaluations";
    EXPECT_LE(r.shrink_evaluations, options_->shrink.max_evaluations) << r.name;
    EXPECT_EQ(r.batch, 1) << r.name;
    EXPECT_EQ(r.heads, 1) << r.name;
    // One or two tokens show every CPU mutant (no-rescale and row-sum-bf16: two).
    EXPECT_LE(r.valid_tokens, 2) << r.name;
    EXPECT_EQ(r.batch, r.shrunk->batch);
    EXPECT_EQ(r.valid_tokens, case_size(*r.shrunk).valid_tokens) << r.name;
  }
}

TEST_F(CpuMutants, KillsReplayFromTheReportAlone) {
  for (const MutantResult& r : *results_) {
    if (r.status != MutantStatus::kKilled) continue;
    const auto mutant = make_backend(r.backend);
    const std::vector<std::string> property{r.property};
    // The shrunk case, through its JSON form, still kills the mutant.
    const Case shrunk = case_from_json_value(case_to_json_value(*r.shrunk));
    EXPECT_TRUE(evaluate_case(shrunk, {mutant.get()}, property).failed()) << r.name;
    // The first failing case regenerates from (seed, case index) and fails again.
    const Case first = generate_case(options_->seed, r.failing_index, options_->gen, nullptr);
    EXPECT_TRUE(evaluate_case(first, {mutant.get()}, {}).failed()) << r.name;
  }
}

TEST_F(CpuMutants, JsonReportIsComplete) {
  const nlohmann::ordered_json j = mutants_to_json(*options_, *results_);
  EXPECT_EQ(j["format"], "mlafuzz-mutants");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["summary"]["survived"], 0);
  EXPECT_EQ(j["mutants"].size(), results_->size());
  for (const auto& m : j["mutants"]) {
    if (m["status"] == "killed") {
      EXPECT_TRUE(m.contains("property"));
      EXPECT_TRUE(m.contains("first_property"));
      EXPECT_TRUE(m["shrunk"].contains("case"));
      EXPECT_GE(m["cases"].get<int>(), 1);
    }
  }
}

// A planted bug that two properties see, as cuda-mma~store-padded-columns on the H200: every
// run overwrites an output guard element ("poison" fails on any case) and, from three rows up,
// rows race (every other run flips an output bit: "determinism" fails). The correct cpu-mma
// computes the rest.
class RowRaceBackend : public TraitsBackend<Backend> {
 public:
  explicit RowRaceBackend(int race_rows = 3) : race_rows_(race_rows) {
    traits_.name = "cpu-mma~row-race";
    traits_.precision = inner_->traits().precision;
  }

 protected:
  RunResult run_case(const MaterializedCase& m) override {
    RunResult r = inner_->run(m);
    r.guard_violations += 1;
    if (m.batch >= race_rows_ && ++races_ % 2 == 0) r.out_raw.at(OutputBuffers::kGuard) ^= 1;
    return r;
  }

 private:
  const int race_rows_;
  std::unique_ptr<Backend> inner_ = make_backend("cpu-mma");
  uint64_t races_ = 0;
};

// Six rows and three heads, on which the mutant fails determinism first.
class ShrinkKill : public ::testing::Test {
 protected:
  void SetUp() override {
    big_ = testing::small_case();
    big_.batch = 6;
    first_ = find_failure(big_, "determinism");
  }
  // The mutant's failure of `property` on c, which the control passes.
  PropertyOutcome find_failure(const Case& c, const std::string& property) {
    const CaseEvaluation ev = evaluate_case(c, {&mutant_}, {property});
    const auto f = ev.failures();
    EXPECT_EQ(f.size(), 1u) << property;
    EXPECT_FALSE(evaluate_case(c, {control_.get()}, {property}).failed()) << property;
    return f.empty() ? PropertyOutcome{} : *f.front();
  }
  RowRaceBackend mutant_;
  std::unique_ptr<Backend> control_ = make_backend("cpu-mma");
  Case big_;
  PropertyOutcome first_;
};

// Killed first by determinism, the bug still shows through poison on one row: the shrinker
// follows it there (it once stopped at B=3, the smallest race) and reports poison.
TEST_F(ShrinkKill, FollowsAnotherPropertyBelowTheFirstKillsSize) {
  ASSERT_EQ(first_.property, "determinism");
  const ShrunkKill k =
      shrink_kill(big_, first_, mutant_, *control_, {"determinism", "poison"}, ShrinkLimits{});
  EXPECT_EQ(k.stopped_by, ShrinkStop::kFixedPoint);
  EXPECT_EQ(k.minimal.batch, 1);
  EXPECT_EQ(k.minimal.heads, 1);
  EXPECT_EQ(k.failure.property, "poison") << format_outcome(k.failure);
  EXPECT_TRUE(k.failure.applicable);
  EXPECT_FALSE(k.failure.passed);
  // The reported failure is the minimal case's own.
  EXPECT_EQ(find_failure(k.minimal, "poison").detail, k.failure.detail);
}

// The first property is kept while it fails, and properties the campaign left out are never
// used: with determinism alone the smallest case is the smallest race.
TEST_F(ShrinkKill, KeepsTheFirstPropertyWhileItFailsAndOnlyEnabledOnes) {
  const ShrunkKill k =
      shrink_kill(big_, first_, mutant_, *control_, {"determinism"}, ShrinkLimits{});
  EXPECT_EQ(k.minimal.batch, 3);
  EXPECT_EQ(k.failure.property, "determinism") << format_outcome(k.failure);
}

// A failure the control shares never counts: with a control that overwrites a guard element too
// (it fails poison, never determinism) only the race is left.
TEST_F(ShrinkKill, AFailureTheControlSharesIsNotFollowed) {
  RowRaceBackend poisoned_control(/*race_rows=*/1 << 30);
  const ShrunkKill k = shrink_kill(big_, first_, mutant_, poisoned_control,
                                   {"determinism", "poison"}, ShrinkLimits{});
  EXPECT_EQ(k.minimal.batch, 3);
  EXPECT_EQ(k.failure.property, "determinism") << format_outcome(k.failure);
}

TEST(MutantNames, RoundTrip) {
  for (const mla::Mutant m : all_mutants()) {
    ASSERT_TRUE(mutant_from_name(mla::mutant_name(m)).has_value());
    EXPECT_EQ(*mutant_from_name(mla::mutant_name(m)), m);
  }
  EXPECT_FALSE(mutant_from_name("no-such-mutant").has_value());
}

}  // namespace
}  // namespace mlafuzz
