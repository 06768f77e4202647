// RapidCheck generators of case recipes, built in dependent steps with rc::gen::mapcat:
//   family -> layout and dims -> page size, stride, pages and physical order -> B, H, topk ->
//   index lists and topk_length -> scales and values -> sinks, conventions, padding, fills.
// Choices are edge-weighted (rc::gen::weightedOneOf / weightedElement) toward what breaks
// kernels. Bulk data (index lists, page permutations, sinks) is drawn by
// CounterRng from a seed the generator draws, so a case stays small to describe.
//
// generate_case (generate.h) drives the generator deterministically: rc::Random keyed by
// (seed, case_index), size rc::kNominalSize, so every range is used in full. RapidCheck's own
// shrinking is not used: failures shrink as recipes (shrink.h).
#pragma once

#include <rapidcheck.h>

#include <string>
#include <vector>

#include "core/case.h"
#include "properties/generate.h"

namespace mlafuzz {

// The generator behind generate_case.
rc::Gen<Case> case_generator(const GenConfig& cfg);

// Classification tags of a case (the fuzz summary and reports show their distribution).
std::vector<std::string> classify_case(const Case& c);

// The RapidCheck random state generate_case uses for (seed, case_index).
rc::Random case_random(uint64_t seed, uint64_t case_index);

}  // namespace mlafuzz
