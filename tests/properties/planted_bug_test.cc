// The planted bug end to end: the cpu-mma variant that leaves the padded columns 448..511
// unmasked is found by generated cases, shrunk to a case a person can read (one row, one head,
// one or two tokens), saved as a corpus entry, and `mlafuzz repro` on that entry exits 1 with
// the mutant and 0 with the correct cpu-mma.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>

#include "core/backend.h"
#include "kernels/host/host_mutants.h"
#include "properties/corpus.h"
#include "properties/evaluate.h"
#include "properties/generate.h"
#include "properties/shrink.h"
#include "tests/core/build_paths.h"

namespace mlafuzz {
namespace {

constexpr uint64_t kSeed = 4;
// Generated cases use nope 448 about half of the time (padded columns exist); the first failure
// comes within a handful of cases. 60 leaves a wide margin and still fails a harness that could
// not find the bug.
constexpr uint64_t kMaxCases = 60;

int run_command(const std::string& cmd) {
  const int st = std::system((cmd + " > /dev/null 2>&1").c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(PlantedBug, UnmaskedPadColumnsFoundShrunkSavedAndReproduced) {
  std::unique_ptr<Backend> mutant = make_cpu_mma_mutant_backend(mla::Mutant::kUnmaskedPadColumns);
  ASSERT_NE(mutant, nullptr);
  const std::vector<Backend*> backends{mutant.get()};
  GenConfig cfg;
  std::cout << "seed " << kSeed << "\n";

  const PropertyOutcome* found = nullptr;
  CaseEvaluation ev;
  Case failing;
  uint64_t index = 0;
  for (; index < kMaxCases && !found; ++index) {
    failing = generate_case(kSeed, index, cfg, nullptr);
    ev = evaluate_case(failing, backends, {});
    if (ev.failed()) found = ev.failures().front();
  }
  ASSERT_NE(found, nullptr) << "the planted bug survived " << kMaxCases
                            << " generated cases of seed " << kSeed;
  std::cout << "found at case " << index - 1 << ": " << format_outcome(*found) << "\n";

  const ShrinkResult sr =
      shrink_case(failing, same_failure_predicate(*found, backends), ShrinkLimits{});
  EXPECT_EQ(sr.stopped_by, ShrinkStop::kFixedPoint);
  const CaseSize size = case_size(sr.minimal);
  std::cout << "shrunk in " << sr.steps << " steps, " << sr.evaluations << " evaluations, "
            << sr.seconds << " s: B=" << size.rows << " H=" << size.heads << " topk=" << size.topk
            << " valid tokens=" << size.valid_tokens << "\n"
            << to_json(sr.minimal);
  EXPECT_EQ(size.rows, 1);
  EXPECT_EQ(size.heads, 1);
  EXPECT_LE(size.topk, 2);
  EXPECT_GE(size.valid_tokens, 1);

  const std::string dir =
      (std::filesystem::temp_directory_path() / ("mlafuzz-planted-" + std::to_string(::getpid())))
          .string();
  const Finding f = make_finding(*found, sr.minimal, kSeed, index - 1);
  const std::string path = save_corpus_entry(dir, sr.minimal, f);
  const CorpusEntry back = load_corpus_entry(path);
  EXPECT_EQ(to_json(back.c), to_json(sr.minimal));

  const std::string bin = mlafuzz::build_paths::kMlafuzz;
  const std::string with_mutant = bin + " repro " + path + " --backends " + mutant->traits().name;
  const std::string with_correct = bin + " repro " + path + " --backends cpu-mma";
  EXPECT_EQ(run_command(with_mutant), 1) << with_mutant;
  EXPECT_EQ(run_command(with_correct), 0) << with_correct;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mlafuzz
