// The fixed set of cases the host-side benches measure: the first N generated cases of a seed
// (default profile, or production shapes only), with the command line that chooses them and the
// allocator settings of a long campaign's steady state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/case.h"

namespace mlafuzz::bench {

struct CaseSetArgs {
  uint64_t seed = 21;
  int cases = 40;
  int repeats = 3;
  std::string profile = "default";  // or "production"
};

// Parses [--seed N] [--cases N] [--profile default|production] [--repeats R] (args holds the
// bench's defaults). Returns the exit status when the bench must stop: 0 after --help, 2 with a
// message naming the bad argument; nullopt to run.
std::optional<int> parse_case_set_args(int argc, char** argv, const std::string& description,
                                       CaseSetArgs& args);

// Allocator thresholds of a long campaign's steady state (bench/oracle/bench_oracle.cc says why).
void use_campaign_allocator();

// The first args.cases generated cases of args.seed in args.profile.
std::vector<Case> generated_cases(const CaseSetArgs& args);

}  // namespace mlafuzz::bench
