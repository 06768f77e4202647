// The tolerance model's pass over V (properties/tolerance.h, "Evaluation"): the weighted sums of
// |V - O| and |V| that every pipeline's bound of a query row reads.
#pragma once

#include <cstdint>

namespace mlafuzz {

// For heads h < heads and columns d < dv, over the tokens k < n:
//   g1[h][d] = sum_k c1[h][k] |V[k][d] - O[h][d]|
//   g0[h][d] = sum_k c0[h][k] |V[k][d] - O[h][d]|
//   w[h][d]  = sum_k cw[h][k] |V[k][d]|
//   u[h][d]  = sum_k cu[h][k] |V[k][d]|  (only when cu is not null)
// V row k at V + k * ldv, O row h at O + h * ldo, weights row h at c + h * ldc, outputs row h at
// out + h * ldg. Each sum is one fused multiply-add per token in the order of k, lanes across d:
// the same bits on every build and CPU (AVX-512, AVX2 or scalar).
void weighted_abs_sums(const double* V, int64_t ldv, int64_t n, int32_t heads, int32_t dv,
                       const double* O, int64_t ldo, const double* c1, const double* c0,
                       const double* cw, const double* cu, int64_t ldc, double* g1, double* g0,
                       double* w, double* u, int64_t ldg);
// The same in float (twice the lanes): per sum one fused multiply-add per token, rounded to
// float (the caller bounds the roundings).
void weighted_abs_sums(const float* V, int64_t ldv, int64_t n, int32_t heads, int32_t dv,
                       const float* O, int64_t ldo, const float* c1, const float* c0,
                       const float* cw, const float* cu, int64_t ldc, float* g1, float* g0,
                       float* w, float* u, int64_t ldg);

}  // namespace mlafuzz
