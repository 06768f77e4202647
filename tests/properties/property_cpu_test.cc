// Every property on the CPU backends (oracle, oracle-loop, cpu-simt, cpu-mma, cpu-mma-split) over
// generated cases with a fixed seed. The case count keeps the whole ctest suite under ~15 minutes
// on two cores; MLAFUZZ_PROPERTY_CASES and MLAFUZZ_PROPERTY_SEED override it (e.g. for a long run).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <string>

#include "core/backend.h"
#include "core/settings.h"
#include "harness/backends/registry.h"
#include "properties/corpus.h"
#include "properties/evaluate.h"
#include "properties/generate.h"
#include "tests/core/build_paths.h"

namespace mlafuzz {
namespace {

uint64_t env_u64(const char* name, uint64_t fallback) {
  return static_cast<uint64_t>(settings::integer(name, static_cast<int64_t>(fallback)));
}

constexpr uint64_t kDefaultSeed = 20261129;
constexpr uint64_t kDefaultCases = 600;  // ~60 s on one core (measured)

// The cases are dealt out to kShards tests (case i to shard i mod kShards), so that ctest -j
// runs them side by side; together they check every case.
constexpr uint64_t kShards = 4;

class PropertiesCpu : public ::testing::TestWithParam<uint64_t> {};

TEST_P(PropertiesCpu, EveryPropertyOnEveryCpuBackend) {
  const uint64_t shard = GetParam();
  const uint64_t seed = env_u64("MLAFUZZ_PROPERTY_SEED", kDefaultSeed);
  const uint64_t cases = env_u64("MLAFUZZ_PROPERTY_CASES", kDefaultCases);
  std::cout << "seed " << seed << ", " << cases << " cases, shard " << shard << " of " << kShards
            << " (cases i with i mod " << kShards << " = " << shard << ")\n";
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Backend*> backends;
  // cpu-mma-split: the split-KV pipeline (automatic count), which split-agree reruns with 1 split
  // and with one split per tile.
  for (const char* n : {"oracle", "oracle-loop", "cpu-simt", "cpu-mma", "cpu-mma-split"}) {
    owned.push_back(make_backend(n));
    backends.push_back(owned.back().get());
  }
  // Worst tightness per backend and property, printed at the end.
  std::map<std::string, double> worst;
  std::map<std::string, uint64_t> worst_case;
  std::map<std::string, int> outcomes;
  int failures = 0;
  double seconds = 0;
  const auto show = static_cast<int64_t>(env_u64("MLAFUZZ_PROPERTY_SHOW", ~0ull >> 1));
  std::vector<std::pair<double, uint64_t>> slowest;
  // Production shapes (H=64, topk 512, B up to 32) cost seconds each on the host models: CI
  // replays them from corpus/cases (one ctest test each) instead of drawing them here.
  GenConfig cfg;
  cfg.production_probability = 0;
  uint64_t checked = 0;
  for (uint64_t i = shard; i < cases; i += kShards) {
    ++checked;
    const Case c = generate_case(seed, i, cfg, nullptr);
    const CaseEvaluation ev = evaluate_case(c, backends, {});
    seconds += ev.seconds;
    if (show == static_cast<int64_t>(i)) {  // MLAFUZZ_PROPERTY_SHOW=K prints case K in full
      std::cout << to_json(c);
      for (const auto& o : ev.outcomes) std::cout << "  " << format_outcome(o) << "\n";
    }
    slowest.push_back({ev.seconds, i});
    for (const auto& o : ev.outcomes) {
      if (!o.applicable) continue;
      ++outcomes[o.backend + " " + o.property];
      const std::string key = o.backend + " " + o.property;
      // The worst tightness among passing outcomes: the margin of a correct implementation.
      if (o.passed && o.tightness >= worst[key]) {
        worst[key] = o.tightness;
        worst_case[key] = i;
      }
      if (o.applicable && !o.passed && failures < 10) {
        ++failures;
        // Saved as a finding so that one command reproduces it.
        const std::string path =
            save_corpus_entry("property-test-failures", c, make_finding(o, c, seed, i));
        ADD_FAILURE() << format_outcome(o) << "\n  case " << i << " of seed " << seed
                      << ", saved as " << path
                      << "\n  reproduce: " << mlafuzz::build_paths::kMlafuzz << " repro " << path;
      }
    }
  }
  std::cout << checked << " cases in " << seconds << " s; slowest:";
  std::sort(slowest.rbegin(), slowest.rend());
  for (size_t k = 0; k < std::min<size_t>(5, slowest.size()); ++k) {
    std::cout << " case " << slowest[k].second << " " << slowest[k].first << " s ("
              << shape_class(generate_case(seed, slowest[k].second, cfg, nullptr)) << ")";
  }
  std::cout << "\n";
  for (const auto& [k, v] : worst) {
    std::cout << "tightness " << k << " max " << v << " (case " << worst_case[k] << ", "
              << outcomes[k] << " outcomes)\n";
  }
}

INSTANTIATE_TEST_SUITE_P(Shards, PropertiesCpu, ::testing::Range<uint64_t>(0, kShards));

}  // namespace
}  // namespace mlafuzz
