// Test references frozen from earlier forms of the tolerance code: check_bounds as an
// element-by-element loop (reference_bounds.cc) and the bounds computed token by token
// (reference_compute_bounds.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "properties/tolerance.h"

namespace mlafuzz::reference {

// check_bounds element by element, as it was: the figures the row-wise one must give bit for bit.
// Sides a and b hold widened values (out, lse).
BoundCheck reference_check_bounds(const Side& a, const Side& b, const Bounds& bound, int32_t batch,
                                  int32_t heads, int32_t d_v);

// The bounds of compute_bounds_set computed token by token, per head and pipeline: the
// values the dense form must give up to the rounding of its sums.
std::vector<Bounds> reference_compute_bounds_set(const MaterializedCase& m, const OracleResult& ref,
                                                 const std::vector<BoundsRequest>& requests);

}  // namespace mlafuzz::reference
