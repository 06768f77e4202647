// Number formats of the FP8 paged KV cache, shared by host and device code.
//
// Every conversion here is exact or correctly rounded (round to nearest even) and written with
// integer bit manipulation only, so host (any compiler) and device give identical bits. This is
// the single place where e4m3fn, ue8m0 and bf16 are interpreted: the oracle, the host models and
// both CUDA kernels call these functions, so a decode bug shows on the CPU too.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MLA_HD __host__ __device__ __forceinline__
#else
#define MLA_HD inline
#endif

namespace mla {

MLA_HD float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

MLA_HD uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

// ---- bfloat16 (stored as raw uint16_t bits) ----

MLA_HD float bf16_to_float(uint16_t b) { return bits_to_float(static_cast<uint32_t>(b) << 16); }

// Round to nearest even; NaN stays a quiet NaN with its sign; overflow rounds to +-inf as IEEE.
MLA_HD uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

MLA_HD float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// ---- float8 e4m3fn: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits, no infinities ----
// Exponent 0 is subnormal (m * 2^-9). 0x7f and 0xff are NaN. Largest finite value 448.

MLA_HD float e4m3_to_float(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xfu;
  const uint32_t man = v & 0x7u;
  if (exp == 0xfu && man == 0x7u) return bits_to_float(sign | 0x7fc00000u);
  if (exp == 0) {
    // m * 2^-9 is exact in fp32: m < 8, computed as a small float times a power of two.
    const float mag = static_cast<float>(man) * bits_to_float(0x3b000000u);  // 2^-9
    return bits_to_float(sign | float_to_bits(mag));
  }
  // Rebias 7 -> 127 and widen the mantissa 3 -> 23 bits.
  return bits_to_float(sign | ((exp + 120u) << 23) | (man << 20));
}

// Round to nearest even with saturation to +-448 (the production writer's "satfinite"
// behaviour: FlashMLA tests/quant.py clamps before the cast). NaN maps to 0x7f (sign kept).
MLA_HD uint8_t float_to_e4m3_sat(float f) {
  const uint32_t u = float_to_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448 (inf too)
  const int exp = static_cast<int>(a >> 23) - 127;                  // unbiased
  if (exp < -6) {
    // Subnormal range: quantum 2^-9. value / 2^-9 rounded to nearest even integer in [0, 8].
    // Exact: a * 2^9 is a power-of-two scaling of a float, then RNE to an integer by bits.
    const float scaled = bits_to_float(a) * 512.0f;  // exact (no overflow, maybe subnormal in)
    uint32_t q = static_cast<uint32_t>(scaled);      // truncation
    const float rem = scaled - static_cast<float>(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
    return static_cast<uint8_t>(sign | q);  // q == 8 encodes 2^-6, the smallest normal: exact
  }
  // Normal range: keep 3 mantissa bits with RNE on the 20 dropped bits.
  uint32_t man = a & 0x7fffffu;
  uint32_t e = static_cast<uint32_t>(exp + 7);
  uint32_t keep = man >> 20;
  const uint32_t rest = man & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (keep & 1u))) {
    ++keep;
    if (keep == 8u) {
      keep = 0;
      ++e;
    }
  }
  if (e > 15u || (e == 15u && keep == 7u)) return static_cast<uint8_t>(sign | 0x7eu);
  return static_cast<uint8_t>(sign | (e << 3) | keep);
}

// ---- ue8m0 scale byte: 2^(e - 127); 0xff is NaN (OCP MX convention) ----

// Selects, not branches: the MMA kernel decodes four tokens' scales at once (their loads in
// flight together), which a branch per scale would serialize.
MLA_HD float ue8m0_to_float(uint8_t e) {
  uint32_t bits = static_cast<uint32_t>(e) << 23;
  bits = e == 0 ? 0x00400000u : bits;      // 2^-127, an fp32 subnormal (exact)
  bits = e == 0xffu ? 0x7fc00000u : bits;  // NaN
  return bits_to_float(bits);
}

}  // namespace mla
