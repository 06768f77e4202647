// The campaign side of a case, step by step, on a fixed set of cases: the first N generated
// cases of a seed (default profile, or production shapes only) evaluated as
// `mlafuzz fuzz --backends cpu-mma,cpu-simt --jobs 1` evaluates them (evaluate_case, every
// property, in-process host models).
//
// Usage: bench_case_steps [--seed N] [--cases N] [--profile default|production] [--repeats R]
// Prints ms per case of each step (CaseSteps, wall clock per step; per case and step the fastest
// of R repeats, so a loaded machine only adds to the figures), each step's ratio to the oracle,
// and a hash of every outcome's figures (verdict, worst element, error, bound, tightness, the
// metrics and the detail text): two builds meant to judge alike give the same hash.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/common/case_set.h"
#include "harness/backends/registry.h"
#include "properties/evaluate.h"

namespace {

using mlafuzz::CaseStep;

struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) {
      h ^= b[i];
      h *= 1099511628211ull;
    }
  }
  template <typename T>
  void value(const T& v) {
    bytes(&v, sizeof v);
  }
  void text(const std::string& s) {
    value(s.size());
    bytes(s.data(), s.size());
  }
};

void hash_outcome(Fnv& f, const mlafuzz::PropertyOutcome& o) {
  f.text(o.property);
  f.text(o.backend);
  f.text(o.detail);
  for (const bool b : {o.applicable, o.passed, o.nonfinite_mismatch, o.run_failed, o.guard_written,
                       o.flashmla_pass}) {
    f.value(b);
  }
  for (const int i : {o.worst_b, o.worst_h, o.worst_d}) f.value(i);
  for (const double d : {o.error, o.bound, o.max_abs, o.mean_abs, o.max_rel, o.cos_diff,
                         o.lse_max_abs, o.tightness, o.out_max_ref}) {
    f.value(d);
  }
}

}  // namespace

int main(int argc, char** argv) {
  mlafuzz::bench::CaseSetArgs args;
  CLI::App app{"evaluate_case step by step on the first N generated cases"};
  mlafuzz::bench::add_case_set_options(app, args);
  if (const auto rc = mlafuzz::bench::parse_args(app, argc, argv)) return *rc;
  mlafuzz::bench::use_campaign_allocator();
  const std::vector<mlafuzz::Case> cs = mlafuzz::bench::generated_cases(args);
  const int repeats = args.repeats;
  std::vector<std::unique_ptr<mlafuzz::Backend>> owned;
  std::vector<mlafuzz::Backend*> backends;
  for (const char* name : {"cpu-mma", "cpu-simt"}) {
    owned.push_back(mlafuzz::make_backend(name));
    backends.push_back(owned.back().get());
  }
  constexpr int kSteps = mlafuzz::kCaseStepCount;
  // best[case][step]: the fastest of the repeats.
  std::vector<std::vector<double>> best(cs.size(), std::vector<double>(kSteps, 1e300));
  uint64_t hash = 0;
  for (int r = 0; r < repeats; ++r) {
    Fnv f;
    for (size_t i = 0; i < cs.size(); ++i) {
      const mlafuzz::CaseEvaluation ev = mlafuzz::evaluate_case(cs[i], backends, {});
      for (int s = 0; s < kSteps; ++s) best[i][s] = std::min(best[i][s], ev.steps.seconds[s]);
      for (const mlafuzz::PropertyOutcome& o : ev.outcomes) hash_outcome(f, o);
    }
    if (r > 0 && f.h != hash) {
      std::fprintf(stderr,
                   "bench_case_steps: repeat %d judged differently (hash %016llx, %016llx)\n", r,
                   static_cast<unsigned long long>(f.h), static_cast<unsigned long long>(hash));
      return 1;
    }
    hash = f.h;
  }
  std::vector<double> ms(kSteps, 0);
  for (const auto& c : best) {
    for (int s = 0; s < kSteps; ++s) ms[s] += 1e3 * c[s] / static_cast<double>(cs.size());
  }
  const auto at = [&](CaseStep s) { return ms[static_cast<int>(s)]; };
  const double oracle = at(CaseStep::kOracle);
  std::printf("seed %llu %s, %d cases, fastest of %d: ms per case",
              static_cast<unsigned long long>(args.seed), args.profile.c_str(), args.cases,
              repeats);
  for (int s = 0; s < kSteps; ++s) {
    if (s == static_cast<int>(CaseStep::kGenerate)) continue;
    std::printf(" %s %.3f", mlafuzz::case_step_name(static_cast<CaseStep>(s)), ms[s]);
  }
  const double side = at(CaseStep::kMaterialize) + oracle + at(CaseStep::kBounds) +
                      at(CaseStep::kVariants) + at(CaseStep::kChecks);
  std::printf(
      "\n/oracle: materialize %.2fx bounds %.2fx variants %.2fx checks %.2fx campaign side %.2fx; "
      "outcomes hash %016llx\n",
      at(CaseStep::kMaterialize) / oracle, at(CaseStep::kBounds) / oracle,
      at(CaseStep::kVariants) / oracle, at(CaseStep::kChecks) / oracle, side / oracle,
      static_cast<unsigned long long>(hash));
  return 0;
}
