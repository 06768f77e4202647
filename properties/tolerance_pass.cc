// The pass over V of the tolerance model's terms (tolerance_pass.h). Lanes run across the columns
// d and every lane adds its terms one token at a time with a fused multiply-add, so the AVX-512,
// AVX2 and scalar versions give the same bits; the widest the CPU has is chosen at run time.
#include "properties/tolerance_pass.h"

#include <cmath>
#include <type_traits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MLAFUZZ_PASS_X86 1
#endif

namespace mlafuzz {
namespace {

template <typename T>
struct PassArgs {
  const T* V;
  int64_t ldv, n;
  int32_t heads, dv;
  const T* O;
  int64_t ldo;
  const T *c1, *c0, *cw, *cu;  // cu null: no fourth sum
  int64_t ldc;
  T *g1, *g0, *w, *u;
  int64_t ldg;
};

// Columns [d0, d1) of every head, one column at a time.
template <typename T>
void sums_scalar(const PassArgs<T>& a, int32_t d0, int32_t d1) {
  for (int32_t h = 0; h < a.heads; ++h) {
    const T* c1 = a.c1 + h * a.ldc;
    const T* c0 = a.c0 + h * a.ldc;
    const T* cw = a.cw + h * a.ldc;
    for (int32_t d = d0; d < d1; ++d) {
      const T o = a.O[h * a.ldo + d];
      const T* cu = a.cu != nullptr ? a.cu + h * a.ldc : nullptr;
      T s1 = 0, s0 = 0, sw = 0, su = 0;
      for (int64_t k = 0; k < a.n; ++k) {
        const T v = a.V[k * a.ldv + d];
        const T t = std::fabs(v - o);
        s1 = std::fma(c1[k], t, s1);
        s0 = std::fma(c0[k], t, s0);
        sw = std::fma(cw[k], std::fabs(v), sw);
        if (cu != nullptr) su = std::fma(cu[k], std::fabs(v), su);
      }
      a.g1[h * a.ldg + d] = s1;
      a.g0[h * a.ldg + d] = s0;
      a.w[h * a.ldg + d] = sw;
      if (cu != nullptr) a.u[h * a.ldg + d] = su;
    }
  }
}

#ifdef MLAFUZZ_PASS_X86

// One ISA's vector operations (AVX-512: 8 doubles, AVX2: 4), for the kernel below.
#define MLAFUZZ_AVX512 __attribute__((target("avx512f"), always_inline)) inline
struct Avx512 {
  using T = double;
  using V = __m512d;
  static constexpr int kLanes = 8;
  static MLAFUZZ_AVX512 V load(const double* p) { return _mm512_loadu_pd(p); }
  static MLAFUZZ_AVX512 void store(double* p, V x) { _mm512_storeu_pd(p, x); }
  static MLAFUZZ_AVX512 V set1(double x) { return _mm512_set1_pd(x); }
  static MLAFUZZ_AVX512 V zero() { return _mm512_setzero_pd(); }
  static MLAFUZZ_AVX512 V sub(V x, V y) { return _mm512_sub_pd(x, y); }
  static MLAFUZZ_AVX512 V abs(V x) { return _mm512_abs_pd(x); }
  static MLAFUZZ_AVX512 V fma(V x, V y, V z) { return _mm512_fmadd_pd(x, y, z); }
};
struct Avx512f {
  using T = float;
  using V = __m512;
  static constexpr int kLanes = 16;
  static MLAFUZZ_AVX512 V load(const float* p) { return _mm512_loadu_ps(p); }
  static MLAFUZZ_AVX512 void store(float* p, V x) { _mm512_storeu_ps(p, x); }
  static MLAFUZZ_AVX512 V set1(float x) { return _mm512_set1_ps(x); }
  static MLAFUZZ_AVX512 V zero() { return _mm512_setzero_ps(); }
  static MLAFUZZ_AVX512 V sub(V x, V y) { return _mm512_sub_ps(x, y); }
  static MLAFUZZ_AVX512 V abs(V x) { return _mm512_abs_ps(x); }
  static MLAFUZZ_AVX512 V fma(V x, V y, V z) { return _mm512_fmadd_ps(x, y, z); }
};
#undef MLAFUZZ_AVX512

#define MLAFUZZ_AVX2 __attribute__((target("avx2,fma"), always_inline)) inline
struct Avx2 {
  using T = double;
  using V = __m256d;
  static constexpr int kLanes = 4;
  static MLAFUZZ_AVX2 V load(const double* p) { return _mm256_loadu_pd(p); }
  static MLAFUZZ_AVX2 void store(double* p, V x) { _mm256_storeu_pd(p, x); }
  static MLAFUZZ_AVX2 V set1(double x) { return _mm256_set1_pd(x); }
  static MLAFUZZ_AVX2 V zero() { return _mm256_setzero_pd(); }
  static MLAFUZZ_AVX2 V sub(V x, V y) { return _mm256_sub_pd(x, y); }
  static MLAFUZZ_AVX2 V abs(V x) { return _mm256_andnot_pd(_mm256_set1_pd(-0.0), x); }
  static MLAFUZZ_AVX2 V fma(V x, V y, V z) { return _mm256_fmadd_pd(x, y, z); }
};
struct Avx2f {
  using T = float;
  using V = __m256;
  static constexpr int kLanes = 8;
  static MLAFUZZ_AVX2 V load(const float* p) { return _mm256_loadu_ps(p); }
  static MLAFUZZ_AVX2 void store(float* p, V x) { _mm256_storeu_ps(p, x); }
  static MLAFUZZ_AVX2 V set1(float x) { return _mm256_set1_ps(x); }
  static MLAFUZZ_AVX2 V zero() { return _mm256_setzero_ps(); }
  static MLAFUZZ_AVX2 V sub(V x, V y) { return _mm256_sub_ps(x, y); }
  static MLAFUZZ_AVX2 V abs(V x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }
  static MLAFUZZ_AVX2 V fma(V x, V y, V z) { return _mm256_fmadd_ps(x, y, z); }
};
#undef MLAFUZZ_AVX2

// Heads [h0, h0 + HB) and columns [d, d + D * lanes): the 3 * HB * D sums in registers over all
// tokens, a token's weights broadcast, its row of V loaded once for the HB heads (BLOCK). Every
// head over columns in blocks of D vectors, then of one vector (SUMS; returns the columns done).
// Stamped out once per ISA: a function's target attribute must cover the intrinsics it inlines.
#define MLAFUZZ_PASS_KERNEL(BLOCK, SUMS, TARGET)                                   \
  template <typename I, int HB, int D, bool kU>                                    \
  __attribute__((target(TARGET), always_inline)) inline void BLOCK(                \
      const PassArgs<typename I::T>& a, int32_t h0, int32_t d) {                   \
    using V = typename I::V;                                                       \
    using T = typename I::T;                                                       \
    V o[HB][D], s1[HB][D], s0[HB][D], sw[HB][D], su[HB][D];                        \
    for (int i = 0; i < HB; ++i) {                                                 \
      for (int j = 0; j < D; ++j) {                                                \
        o[i][j] = I::load(a.O + (h0 + i) * a.ldo + d + j * I::kLanes);             \
        s1[i][j] = s0[i][j] = sw[i][j] = su[i][j] = I::zero();                     \
      }                                                                            \
    }                                                                              \
    const T* c1 = a.c1 + h0 * a.ldc;                                               \
    const T* c0 = a.c0 + h0 * a.ldc;                                               \
    const T* cw = a.cw + h0 * a.ldc;                                               \
    const T* cu = kU ? a.cu + h0 * a.ldc : nullptr;                                \
    for (int64_t k = 0; k < a.n; ++k) {                                            \
      V v[D], va[D];                                                               \
      for (int j = 0; j < D; ++j) {                                                \
        v[j] = I::load(a.V + k * a.ldv + d + j * I::kLanes);                       \
        va[j] = I::abs(v[j]);                                                      \
      }                                                                            \
      for (int i = 0; i < HB; ++i) {                                               \
        const V b1 = I::set1(c1[i * a.ldc + k]);                                   \
        const V b0 = I::set1(c0[i * a.ldc + k]);                                   \
        const V bw = I::set1(cw[i * a.ldc + k]);                                   \
        const V bu = kU ? I::set1(cu[i * a.ldc + k]) : I::zero();                  \
        for (int j = 0; j < D; ++j) {                                              \
          const V t = I::abs(I::sub(v[j], o[i][j]));                               \
          s1[i][j] = I::fma(b1, t, s1[i][j]);                                      \
          s0[i][j] = I::fma(b0, t, s0[i][j]);                                      \
          sw[i][j] = I::fma(bw, va[j], sw[i][j]);                                  \
          if (kU) su[i][j] = I::fma(bu, va[j], su[i][j]);                          \
        }                                                                          \
      }                                                                            \
    }                                                                              \
    for (int i = 0; i < HB; ++i) {                                                 \
      for (int j = 0; j < D; ++j) {                                                \
        const int64_t at = (h0 + i) * a.ldg + d + j * I::kLanes;                   \
        I::store(a.g1 + at, s1[i][j]);                                             \
        I::store(a.g0 + at, s0[i][j]);                                             \
        I::store(a.w + at, sw[i][j]);                                              \
        if (kU) I::store(a.u + at, su[i][j]);                                      \
      }                                                                            \
    }                                                                              \
  }                                                                                \
  template <typename I, int HB, int D, bool kU>                                    \
  __attribute__((target(TARGET))) int32_t SUMS(const PassArgs<typename I::T>& a) { \
    constexpr int kWide = D * I::kLanes;                                           \
    int32_t d = 0;                                                                 \
    for (; d + kWide <= a.dv; d += kWide) {                                        \
      int32_t h = 0;                                                               \
      for (; h + HB <= a.heads; h += HB) BLOCK<I, HB, D, kU>(a, h, d);             \
      for (; h < a.heads; ++h) BLOCK<I, 1, D, kU>(a, h, d);                        \
    }                                                                              \
    for (; d + I::kLanes <= a.dv; d += I::kLanes) {                                \
      int32_t h = 0;                                                               \
      for (; h + HB <= a.heads; h += HB) BLOCK<I, HB, 1, kU>(a, h, d);             \
      for (; h < a.heads; ++h) BLOCK<I, 1, 1, kU>(a, h, d);                        \
    }                                                                              \
    return d;                                                                      \
  }

MLAFUZZ_PASS_KERNEL(block_avx512, sums_avx512, "avx512f")
MLAFUZZ_PASS_KERNEL(block_avx2, sums_avx2, "avx2,fma")
#undef MLAFUZZ_PASS_KERNEL

#endif  // MLAFUZZ_PASS_X86

int isa() {
#ifdef MLAFUZZ_PASS_X86
  static const int level = __builtin_cpu_supports("avx512f")                                   ? 2
                           : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? 1
                                                                                               : 0;
  return level;
#else
  return 0;
#endif
}

template <typename T>
void sums(const PassArgs<T>& a) {
  int32_t done = 0;
#ifdef MLAFUZZ_PASS_X86
  using W = std::conditional_t<std::is_same_v<T, float>, Avx512f, Avx512>;
  using N = std::conditional_t<std::is_same_v<T, float>, Avx2f, Avx2>;
  const bool u = a.cu != nullptr;
  if (isa() == 2) {
    done = u ? sums_avx512<W, 2, 2, true>(a) : sums_avx512<W, 2, 2, false>(a);
  } else if (isa() == 1) {
    done = u ? sums_avx2<N, 1, 2, true>(a) : sums_avx2<N, 1, 2, false>(a);
  }
#endif
  sums_scalar(a, done, a.dv);
}

}  // namespace

void weighted_abs_sums(const double* V, int64_t ldv, int64_t n, int32_t heads, int32_t dv,
                       const double* O, int64_t ldo, const double* c1, const double* c0,
                       const double* cw, const double* cu, int64_t ldc, double* g1, double* g0,
                       double* w, double* u, int64_t ldg) {
  sums(PassArgs<double>{V, ldv, n, heads, dv, O, ldo, c1, c0, cw, cu, ldc, g1, g0, w, u, ldg});
}

void weighted_abs_sums(const float* V, int64_t ldv, int64_t n, int32_t heads, int32_t dv,
                       const float* O, int64_t ldo, const float* c1, const float* c0,
                       const float* cw, const float* cu, int64_t ldc, float* g1, float* g0,
                       float* w, float* u, int64_t ldg) {
  sums(PassArgs<float>{V, ldv, n, heads, dv, O, ldo, c1, c0, cw, cu, ldc, g1, g0, w, u, ldg});
}

}  // namespace mlafuzz
