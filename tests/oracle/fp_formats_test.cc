// The number formats the oracle decodes with (mla/fp_formats.h) against a fixed
// table derived from the format definition, and rounding on hand-picked values.
#include "mla/fp_formats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "oracle/oracle.h"

namespace {

#define NAN_ (__builtin_nan(""))

// e4m3fn per OCP FP8: (-1)^s * 2^(e-7) * (1 + m/8) for e > 0, (-1)^s * 2^-6 * m/8 for e = 0,
// NaN for S.1111.111. Generated from that definition (not from the code under test).
constexpr double kE4m3[256] = {
    0x0p+0,  0x1p-9,    0x1p-8,    0x1.8p-8,  0x1p-7,    0x1.4p-7,  0x1.8p-7,  0x1.cp-7,   // 0x00
    0x1p-6,  0x1.2p-6,  0x1.4p-6,  0x1.6p-6,  0x1.8p-6,  0x1.ap-6,  0x1.cp-6,  0x1.ep-6,   // 0x08
    0x1p-5,  0x1.2p-5,  0x1.4p-5,  0x1.6p-5,  0x1.8p-5,  0x1.ap-5,  0x1.cp-5,  0x1.ep-5,   // 0x10
    0x1p-4,  0x1.2p-4,  0x1.4p-4,  0x1.6p-4,  0x1.8p-4,  0x1.ap-4,  0x1.cp-4,  0x1.ep-4,   // 0x18
    0x1p-3,  0x1.2p-3,  0x1.4p-3,  0x1.6p-3,  0x1.8p-3,  0x1.ap-3,  0x1.cp-3,  0x1.ep-3,   // 0x20
    0x1p-2,  0x1.2p-2,  0x1.4p-2,  0x1.6p-2,  0x1.8p-2,  0x1.ap-2,  0x1.cp-2,  0x1.ep-2,   // 0x28
    0x1p-1,  0x1.2p-1,  0x1.4p-1,  0x1.6p-1,  0x1.8p-1,  0x1.ap-1,  0x1.cp-1,  0x1.ep-1,   // 0x30
    0x1p+0,  0x1.2p+0,  0x1.4p+0,  0x1.6p+0,  0x1.8p+0,  0x1.ap+0,  0x1.cp+0,  0x1.ep+0,   // 0x38
    0x1p+1,  0x1.2p+1,  0x1.4p+1,  0x1.6p+1,  0x1.8p+1,  0x1.ap+1,  0x1.cp+1,  0x1.ep+1,   // 0x40
    0x1p+2,  0x1.2p+2,  0x1.4p+2,  0x1.6p+2,  0x1.8p+2,  0x1.ap+2,  0x1.cp+2,  0x1.ep+2,   // 0x48
    0x1p+3,  0x1.2p+3,  0x1.4p+3,  0x1.6p+3,  0x1.8p+3,  0x1.ap+3,  0x1.cp+3,  0x1.ep+3,   // 0x50
    0x1p+4,  0x1.2p+4,  0x1.4p+4,  0x1.6p+4,  0x1.8p+4,  0x1.ap+4,  0x1.cp+4,  0x1.ep+4,   // 0x58
    0x1p+5,  0x1.2p+5,  0x1.4p+5,  0x1.6p+5,  0x1.8p+5,  0x1.ap+5,  0x1.cp+5,  0x1.ep+5,   // 0x60
    0x1p+6,  0x1.2p+6,  0x1.4p+6,  0x1.6p+6,  0x1.8p+6,  0x1.ap+6,  0x1.cp+6,  0x1.ep+6,   // 0x68
    0x1p+7,  0x1.2p+7,  0x1.4p+7,  0x1.6p+7,  0x1.8p+7,  0x1.ap+7,  0x1.cp+7,  0x1.ep+7,   // 0x70
    0x1p+8,  0x1.2p+8,  0x1.4p+8,  0x1.6p+8,  0x1.8p+8,  0x1.ap+8,  0x1.cp+8,  NAN_,       // 0x78
    -0x0p+0, -0x1p-9,   -0x1p-8,   -0x1.8p-8, -0x1p-7,   -0x1.4p-7, -0x1.8p-7, -0x1.cp-7,  // 0x80
    -0x1p-6, -0x1.2p-6, -0x1.4p-6, -0x1.6p-6, -0x1.8p-6, -0x1.ap-6, -0x1.cp-6, -0x1.ep-6,  // 0x88
    -0x1p-5, -0x1.2p-5, -0x1.4p-5, -0x1.6p-5, -0x1.8p-5, -0x1.ap-5, -0x1.cp-5, -0x1.ep-5,  // 0x90
    -0x1p-4, -0x1.2p-4, -0x1.4p-4, -0x1.6p-4, -0x1.8p-4, -0x1.ap-4, -0x1.cp-4, -0x1.ep-4,  // 0x98
    -0x1p-3, -0x1.2p-3, -0x1.4p-3, -0x1.6p-3, -0x1.8p-3, -0x1.ap-3, -0x1.cp-3, -0x1.ep-3,  // 0xa0
    -0x1p-2, -0x1.2p-2, -0x1.4p-2, -0x1.6p-2, -0x1.8p-2, -0x1.ap-2, -0x1.cp-2, -0x1.ep-2,  // 0xa8
    -0x1p-1, -0x1.2p-1, -0x1.4p-1, -0x1.6p-1, -0x1.8p-1, -0x1.ap-1, -0x1.cp-1, -0x1.ep-1,  // 0xb0
    -0x1p+0, -0x1.2p+0, -0x1.4p+0, -0x1.6p+0, -0x1.8p+0, -0x1.ap+0, -0x1.cp+0, -0x1.ep+0,  // 0xb8
    -0x1p+1, -0x1.2p+1, -0x1.4p+1, -0x1.6p+1, -0x1.8p+1, -0x1.ap+1, -0x1.cp+1, -0x1.ep+1,  // 0xc0
    -0x1p+2, -0x1.2p+2, -0x1.4p+2, -0x1.6p+2, -0x1.8p+2, -0x1.ap+2, -0x1.cp+2, -0x1.ep+2,  // 0xc8
    -0x1p+3, -0x1.2p+3, -0x1.4p+3, -0x1.6p+3, -0x1.8p+3, -0x1.ap+3, -0x1.cp+3, -0x1.ep+3,  // 0xd0
    -0x1p+4, -0x1.2p+4, -0x1.4p+4, -0x1.6p+4, -0x1.8p+4, -0x1.ap+4, -0x1.cp+4, -0x1.ep+4,  // 0xd8
    -0x1p+5, -0x1.2p+5, -0x1.4p+5, -0x1.6p+5, -0x1.8p+5, -0x1.ap+5, -0x1.cp+5, -0x1.ep+5,  // 0xe0
    -0x1p+6, -0x1.2p+6, -0x1.4p+6, -0x1.6p+6, -0x1.8p+6, -0x1.ap+6, -0x1.cp+6, -0x1.ep+6,  // 0xe8
    -0x1p+7, -0x1.2p+7, -0x1.4p+7, -0x1.6p+7, -0x1.8p+7, -0x1.ap+7, -0x1.cp+7, -0x1.ep+7,  // 0xf0
    -0x1p+8, -0x1.2p+8, -0x1.4p+8, -0x1.6p+8, -0x1.8p+8, -0x1.ap+8, -0x1.cp+8, NAN_,       // 0xf8
};
#undef NAN_

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(E4m3, AllEncodingsMatchTheFormatDefinition) {
  const double* table = mlafuzz::e4m3_table();
  for (int v = 0; v < 256; ++v) {
    const float f = mla::e4m3_to_float(static_cast<uint8_t>(v));
    if (std::isnan(kE4m3[v])) {
      EXPECT_TRUE(std::isnan(f)) << v;
      EXPECT_TRUE(std::isnan(table[v])) << v;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), kE4m3[v]) << std::hex << v;
    EXPECT_EQ(std::signbit(f), std::signbit(kE4m3[v])) << std::hex << v;  // -0 stays -0
    EXPECT_EQ(table[v], kE4m3[v]) << std::hex << v;
  }
  EXPECT_EQ(kE4m3[0x7e], 448.0);
  EXPECT_EQ(kE4m3[0x01], std::ldexp(1.0, -9));
}

TEST(E4m3, EveryFiniteCodeRoundTrips) {
  for (int v = 0; v < 256; ++v) {
    if ((v & 0x7f) == 0x7f) continue;
    EXPECT_EQ(mla::float_to_e4m3_sat(mla::e4m3_to_float(static_cast<uint8_t>(v))), v) << v;
  }
}

TEST(E4m3, RoundsToNearestEvenAndSaturates) {
  struct Case {
    float in;
    uint8_t want;
  };
  const Case cases[] = {
      {0.0f, 0x00},
      {-0.0f, 0x80},
      {1.0f, 0x38},
      {1.0625f, 0x38},     // tie between 1 (even) and 1.125
      {1.0625001f, 0x39},  // just above the tie
      {1.1875f, 0x3a},     // tie between 1.125 and 1.25 (even)
      {-1.1875f, 0xba},
      {232.0f, 0x76},  // tie between 224 (even) and 240
      {236.0f, 0x77},
      {448.0f, 0x7e},
      {456.0f, 0x7e},  // above the largest finite: saturate, never NaN
      {464.0f, 0x7e},  // the would-be tie with 480
      {1e6f, 0x7e},
      {-1e6f, 0xfe},
      {HUGE_VALF, 0x7e},
      {-HUGE_VALF, 0xfe},
      {0x1p-9f, 0x01},          // smallest subnormal
      {0x1p-10f, 0x00},         // tie between 0 (even) and 2^-9
      {0x1.000002p-10f, 0x01},  // just above it
      {0x1.8p-9f, 0x02},        // 1.5 * 2^-9: tie between 1 and 2 (even)
      {0x1.4p-8f, 0x02},        // 2.5 * 2^-9: tie between 2 (even) and 3
      {0x1.ep-7f, 0x08},        // 7.5 * 2^-9 rounds up to the smallest normal 2^-6
      {0x1.dp-7f, 0x07},        // 7.25 * 2^-9
      {0x1p-20f, 0x00},         // underflow to zero
      {-0x1p-20f, 0x80},
      {0x1.ep-6f, 0x0f},
      {0x1.fp-6f, 0x10},  // tie between 0x1.ep-6 (odd mantissa 7) and 2^-5: even
  };
  for (const Case& c : cases) {
    EXPECT_EQ(mla::float_to_e4m3_sat(c.in), c.want) << std::hexfloat << c.in;
  }
  EXPECT_EQ(mla::float_to_e4m3_sat(from_bits(0x7fc00000u)), 0x7f);
  EXPECT_EQ(mla::float_to_e4m3_sat(from_bits(0xffc00000u)), 0xff);
}

TEST(Ue8m0, Extremes) {
  EXPECT_EQ(mla::ue8m0_to_float(0), std::ldexp(1.0f, -127));  // fp32 subnormal, exact
  EXPECT_EQ(bits(mla::ue8m0_to_float(0)), 0x00400000u);
  EXPECT_EQ(mla::ue8m0_to_float(1), std::ldexp(1.0f, -126));
  EXPECT_EQ(mla::ue8m0_to_float(127), 1.0f);
  EXPECT_EQ(mla::ue8m0_to_float(128), 2.0f);
  EXPECT_EQ(mla::ue8m0_to_float(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(mla::ue8m0_to_float(255)));
  for (int e = 1; e < 255; ++e) EXPECT_EQ(mla::ue8m0_to_float(e), std::ldexp(1.0f, e - 127)) << e;
}

TEST(Bf16, RoundsToNearestEvenIncludingTies) {
  EXPECT_EQ(mla::float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(mla::float_to_bf16(1.0f + 0x1p-8f), 0x3f80);             // tie: keep even 0x3f80
  EXPECT_EQ(mla::float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // above the tie
  EXPECT_EQ(mla::float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);         // tie: up to even 0x3f82
  EXPECT_EQ(mla::float_to_bf16(1.0f + 0x1p-8f - 0x1p-23f), 0x3f80);  // below the tie
  EXPECT_EQ(mla::float_to_bf16(-1.0f - 3 * 0x1p-8f), 0xbf82);
  EXPECT_EQ(mla::float_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(mla::float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(mla::float_to_bf16(HUGE_VALF), 0x7f80);
  EXPECT_EQ(mla::float_to_bf16(-HUGE_VALF), 0xff80);
  EXPECT_EQ(mla::float_to_bf16(from_bits(0x7f7fffffu)), 0x7f80);  // FLT_MAX overflows to inf
  EXPECT_EQ(mla::float_to_bf16(from_bits(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(mla::float_to_bf16(from_bits(0x00018000u)), 0x0002);  // subnormal tie, up to even
  EXPECT_EQ(mla::float_to_bf16(from_bits(0x00008000u)), 0x0000);  // subnormal tie, down to even
  // NaN stays NaN (quiet, sign kept), even a payload that truncation would turn into inf.
  EXPECT_EQ(mla::float_to_bf16(from_bits(0x7f800001u)), 0x7fc0);
  EXPECT_EQ(mla::float_to_bf16(from_bits(0xff800001u)), 0xffc0);
  EXPECT_EQ(mla::float_to_bf16(from_bits(0x7fc00000u)), 0x7fc0);
  EXPECT_TRUE(std::isnan(mla::bf16_to_float(0x7fc0)));
  EXPECT_EQ(mla::bf16_to_float(0x3f81), 1.0f + 0x1p-7f);
  EXPECT_EQ(mla::bf16_to_float(0x0001), 0x1p-133f);
  for (uint32_t b = 0; b < 0x10000; ++b) {  // every finite bf16 round-trips
    const float f = mla::bf16_to_float(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(mla::float_to_bf16(f), b) << b;
  }
}

}  // namespace
