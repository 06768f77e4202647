// The tolerance model's bounds as computed before BoundTerms, frozen as a test reference
// (reference_bounds.cc says why).
#pragma once

#include <vector>

#include "harness/core/materialize.h"
#include "oracle/oracle.h"
#include "properties/tolerance.h"

namespace mlafuzz::reference {

// compute_bounds_set and compute_bounds as they were: the same values bit for bit.
std::vector<Bounds> reference_bounds_set(const MaterializedCase& m, const OracleResult& ref,
                                         const std::vector<BoundsRequest>& requests);
Bounds reference_bounds(const MaterializedCase& m, const OracleResult& ref, const Pipeline& p,
                        int tile_topk = 0);

// check_bounds element by element, as it was: the figures the row-wise one must give bit for bit.
BoundCheck reference_check_bounds(const Side& a, const Side& b, const Bounds& bound, int32_t batch,
                                  int32_t heads, int32_t d_v);

}  // namespace mlafuzz::reference
