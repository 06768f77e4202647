// The fixed set of cases the host-side benches measure: the first N generated cases of a seed
// (default profile, or production shapes only), with the command-line options that choose them
// and the allocator settings of a long campaign's steady state.
#pragma once

#include <CLI/CLI.hpp>
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

// Adds --seed N, --cases N, --profile default|production and --repeats R to app, read into args
// (which holds the bench's defaults). A bench adds its own options to the same app.
void add_case_set_options(CLI::App& app, CaseSetArgs& args);

// Parses the command line with app. Returns the exit status when the bench must stop: 0 after
// --help, 2 after a message naming the bad argument; nullopt to run.
std::optional<int> parse_args(CLI::App& app, int argc, char** argv);

// Allocator thresholds of a long campaign's steady state (bench/oracle/bench_oracle.cc says why).
void use_campaign_allocator();

// The first args.cases generated cases of args.seed in args.profile.
std::vector<Case> generated_cases(const CaseSetArgs& args);

}  // namespace mlafuzz::bench
