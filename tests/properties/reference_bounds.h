// check_bounds as an element-by-element loop, frozen as a test reference (reference_bounds.cc).
#pragma once

#include <cstdint>

#include "properties/tolerance.h"

namespace mlafuzz::reference {

// check_bounds element by element, as it was: the figures the row-wise one must give bit for bit.
// Sides a and b hold widened values (out, lse).
BoundCheck reference_check_bounds(const Side& a, const Side& b, const Bounds& bound, int32_t batch,
                                  int32_t heads, int32_t d_v);

}  // namespace mlafuzz::reference
