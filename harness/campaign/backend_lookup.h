// Backend names a campaign accepts: everything make_backend() knows, plus planted-bug variants
// "cpu-mma~<mutant>" (e.g. "cpu-mma~unmasked-pad-columns") in builds with MLAFUZZ_MUTANTS. The
// mutants never enter the normal registry: only campaigns (and their workers) resolve them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "harness/backend.h"

namespace mlafuzz::campaign {

// Throws std::runtime_error naming the unknown backend or mutant (and listing the known ones).
std::unique_ptr<Backend> make_campaign_backend(const std::string& name);

// Expands "all"/"available" like parse_backend_list and checks that every name resolves.
std::vector<std::string> parse_campaign_backends(const std::string& list);

// Names of the mutants this build can make ("cpu-mma~..."); empty without MLAFUZZ_MUTANTS.
std::vector<std::string> campaign_mutant_names();

}  // namespace mlafuzz::campaign
