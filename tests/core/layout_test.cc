// Layout round trips: materialize, then read every field of every token back, both through
// mla::token_address / dequant_k and through addresses computed here from the layout text
// (docs/SPEC.md section 2), and compare with an independent re-quantization of the drawn values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/materialize.h"
#include "tests/core/test_util.h"

namespace mlafuzz {
namespace {

// Smallest k with 448 * 2^k >= amax, by search: the definition of ceil(log2(amax / 448)),
// with no cleverness shared with the implementation.
int reference_writer_exponent(float amax) {
  if (amax == 0) return 127;
  int k = -200;
  while (std::ldexp(448.0, k) < static_cast<double>(amax)) ++k;
  return std::min(254, std::max(1, 127 + k));
}

TEST(WriterExponent, MatchesTheDefinitionAcrossTheRange) {
  for (int e = -149; e <= 127; ++e) {
    for (double m : {1.0, 1.5, 1.75, 1.7500001, 1.8, 1.99999}) {
      const float amax = static_cast<float>(std::ldexp(m, e));
      if (amax == 0 || std::isinf(amax)) continue;
      ASSERT_EQ(writer_exponent(amax), reference_writer_exponent(amax)) << amax;
    }
  }
  EXPECT_EQ(writer_exponent(448.0f), 127);  // exactly representable at scale 1
  EXPECT_EQ(writer_exponent(448.5f), 128);  // just above: next power of two
  EXPECT_EQ(writer_exponent(224.0f), 126);
  EXPECT_EQ(writer_exponent(0.0f), 127);
  EXPECT_EQ(writer_exponent(1e-45f), 1);  // clamped: ue8m0 0 is kept out
}

struct Expected {
  int64_t nope, rope, scale;  // byte offsets per the SPEC text
};

Expected spec_address(const mla::CacheGeometry& g, int64_t slot) {
  const int64_t page = slot / g.page_size, j = slot % g.page_size;
  const int64_t base = page * g.page_stride;
  const int32_t tiles = g.nope_dim / g.scale_tile;
  if (g.layout == mla::Layout::kModel1) {
    const int64_t row = g.nope_dim + 2 * g.rope_dim;  // 576 for 448 + 64
    const int64_t scale_row = (tiles + 7) / 8 * 8;    // 8 for 7 tiles
    return {base + j * row, base + j * row + g.nope_dim, base + g.page_size * row + j * scale_row};
  }
  const int64_t tb = g.nope_dim + 4 * tiles + 2 * g.rope_dim;  // 656 for 512 + 4*4 + 128
  return {base + j * tb, base + j * tb + g.nope_dim + 4 * tiles, base + j * tb + g.nope_dim};
}

void check_round_trip(const Case& c) {
  const MaterializedCase m = materialize(c);
  const auto& g = m.geom;
  const int32_t tiles = g.nope_dim / g.scale_tile;
  const uint8_t* cache = m.cache.data();
  for (int64_t t = 0; t < mla::num_slots(g); ++t) {
    // Physical slot from page_order, computed here.
    const int64_t p = g.page_size;
    const int64_t phys =
        c.page_order.empty() ? t : c.page_order[static_cast<size_t>(t / p)] * p + t % p;
    const mla::TokenAddress a = mla::token_address(g, phys);
    const Expected x = spec_address(g, phys);
    ASSERT_EQ(a.nope, x.nope) << "token " << t;
    ASSERT_EQ(a.rope, x.rope) << "token " << t;
    ASSERT_EQ(a.scale, x.scale) << "token " << t;
    for (int32_t tile = 0; tile < tiles; ++tile) {
      float amax = 0;
      for (int32_t i = 0; i < g.scale_tile; ++i) {
        amax = std::max(amax, std::fabs(kv_source_value(c, t, tile * g.scale_tile + i)));
      }
      const int e = reference_writer_exponent(amax);
      const double scale = std::ldexp(1.0, e - 127);
      // The stored scale, read from the bytes directly.
      if (g.layout == mla::Layout::kModel1) {
        ASSERT_EQ(cache[x.scale + tile], e) << "token " << t << " tile " << tile;
      } else {
        const uint8_t* s = cache + x.scale + 4 * tile;
        const uint32_t bits = s[0] | (s[1] << 8) | (s[2] << 16) | (uint32_t{s[3]} << 24);
        ASSERT_EQ(bits, static_cast<uint32_t>(e) << 23) << "token " << t << " tile " << tile;
      }
      for (int32_t i = 0; i < g.scale_tile; ++i) {
        const int32_t d = tile * g.scale_tile + i;
        const float v = kv_source_value(c, t, d);
        const uint8_t code = mla::float_to_e4m3_sat(static_cast<float>(v / scale));
        ASSERT_EQ(cache[x.nope + d], code) << "token " << t << " dim " << d;
        const double want = static_cast<double>(mla::e4m3_to_float(code)) * scale;
        ASSERT_EQ(static_cast<double>(mla::dequant_k(g, cache, a, d)), want);
        // The writer's scale keeps every code within e4m3 range: quantization error is at most
        // half an e4m3 step (2^-4 relative) or half a subnormal quantum.
        ASSERT_LE(std::fabs(want - v),
                  std::max(std::fabs(double{v}) / 16, std::ldexp(1.0, -10) * scale))
            << "token " << t << " dim " << d;
      }
    }
    for (int32_t r = 0; r < g.rope_dim; ++r) {
      const uint16_t bits = mla::float_to_bf16(kv_source_value(c, t, g.nope_dim + r));
      ASSERT_EQ(cache[x.rope + 2 * r], bits & 0xff);
      ASSERT_EQ(cache[x.rope + 2 * r + 1], bits >> 8);
      ASSERT_EQ(mla::dequant_k(g, cache, a, g.nope_dim + r), mla::bf16_to_float(bits));
    }
  }
}

TEST(LayoutRoundTrip, Model1Default) {
  Case c = testing::small_case();
  c.geom.page_size = 8;
  c.geom.num_pages = 2;
  check_round_trip(c);
}

TEST(LayoutRoundTrip, Model1OddPagesPaddedStridePermuted) {
  for (int32_t p : {61, 69}) {
    Case c = testing::small_case();
    c.geom.page_size = p;
    c.geom.num_pages = 3;
    c.geom.page_stride = (p * 584 + 575) / 576 * 576;  // SGLang's padding to a 576 multiple
    c.page_order = {2, 0, 1};
    c.kv_values = {ValueDist::kNormal, 300.0, 0.05};
    c.pad_fill = Fill::kGarbage;
    check_round_trip(c);
  }
}

TEST(LayoutRoundTrip, V32OddPagesPaddedStridePermuted) {
  Case c = testing::small_case();
  c.geom.layout = mla::Layout::kV32;
  c.geom.nope_dim = 512;
  c.geom.scale_tile = 128;
  c.geom.page_size = 61;
  c.geom.num_pages = 2;
  c.geom.page_stride = 61 * 656 + 64;
  c.page_order = {1, 0};
  c.kv_values = {ValueDist::kUniform, 1e-3, 0.1};
  c.pad_fill = Fill::kNaN;
  check_round_trip(c);
}

TEST(LayoutRoundTrip, TinyAndHugeMagnitudes) {
  for (double mag : {1e-30, 1e-5, 1e20}) {
    Case c = testing::small_case();
    c.kv_values.magnitude = mag;
    c.kv_values.special_fraction = 0.2;
    check_round_trip(c);
  }
}

TEST(ScaleModes, FixedAndRandomExponents) {
  Case c = testing::small_case();
  c.kv_values = {ValueDist::kUniform, 0.5, 0.0};
  c.scales = {ScaleMode::kFixed, 120, 120};
  MaterializedCase m = materialize(c);
  const int32_t tiles = 7;
  for (int64_t t = 0; t < mla::num_slots(m.geom); ++t) {
    const mla::TokenAddress a = mla::token_address(m.geom, t);
    for (int32_t tile = 0; tile < tiles; ++tile) ASSERT_EQ(m.cache[a.scale + tile], 120);
    for (int32_t d = 0; d < 448; ++d) {
      // scale 2^-7: |v| <= 0.5 codes as |v| * 128 <= 64, representable: no saturation.
      const float v = kv_source_value(c, t, d);
      ASSERT_EQ(m.cache[a.nope + d], mla::float_to_e4m3_sat(v * 128.0f));
    }
  }
  c.scales = {ScaleMode::kRandom, 100, 140};
  m = materialize(c);
  int lo = 255, hi = -1;
  for (int64_t t = 0; t < mla::num_slots(m.geom); ++t) {
    const mla::TokenAddress a = mla::token_address(m.geom, t);
    for (int32_t tile = 0; tile < tiles; ++tile) {
      lo = std::min<int>(lo, m.cache[a.scale + tile]);
      hi = std::max<int>(hi, m.cache[a.scale + tile]);
      // Codes as the writer makes them, whatever the stored exponent.
      float amax = 0;
      for (int i = 0; i < 64; ++i)
        amax = std::max(amax, std::fabs(kv_source_value(c, t, tile * 64 + i)));
      const float s = std::ldexp(1.0f, reference_writer_exponent(amax) - 127);
      for (int i = 0; i < 64; ++i) {
        ASSERT_EQ(m.cache[a.nope + tile * 64 + i],
                  mla::float_to_e4m3_sat(kv_source_value(c, t, tile * 64 + i) / s));
      }
    }
  }
  EXPECT_GE(lo, 100);
  EXPECT_LE(hi, 140);
  EXPECT_LT(lo, 110);  // 105 draws spread over the range
  EXPECT_GT(hi, 130);
}

TEST(Values, DistributionsHaveTheirShape) {
  Case c = testing::small_case();
  c.geom.num_pages = 20;
  auto collect = [&](ValueSpec s) {
    c.kv_values = s;
    std::vector<float> v;
    for (int64_t t = 0; t < 100; ++t) {
      for (int d = 0; d < 448; ++d) v.push_back(kv_source_value(c, t, d));
    }
    return v;
  };
  for (float v : collect({ValueDist::kSmallInt, 2.0, 0})) {
    ASSERT_EQ(v, std::round(v / 2) * 2);
    ASSERT_LE(std::fabs(v), 6.0f);
  }
  for (float v : collect({ValueDist::kZeros, 2.0, 0})) ASSERT_EQ(v, 0.0f);
  for (float v : collect({ValueDist::kTies, 0.75, 0})) ASSERT_EQ(v, 0.75f);
  for (float v : collect({ValueDist::kUniform, 4.0, 0})) ASSERT_LE(std::fabs(v), 4.0f);
  double sum = 0, sq = 0;
  const auto normal = collect({ValueDist::kNormal, 1.0, 0});
  for (float v : normal) {
    sum += v;
    sq += double{v} * v;
  }
  const double n = static_cast<double>(normal.size());
  EXPECT_NEAR(sum / n, 0.0, 0.02);
  EXPECT_NEAR(sq / n, 1.0, 0.02);
  int specials = 0;
  for (float v : collect({ValueDist::kUniform, 1.0, 0.3})) {
    ASSERT_TRUE(std::isfinite(v));
    specials += v == 0 || std::fabs(v) == 4.0f || v == std::ldexp(1.0f, -133);
  }
  EXPECT_NEAR(specials / n, 0.3, 0.02);
}

}  // namespace
}  // namespace mlafuzz
