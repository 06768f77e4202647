// What real cache writers produce: fp32 V32 scales (vLLM's amax / 448) and indices past the
// physical cache (the out_of_range convention). The case format keeps old files' meaning, the
// materialized bytes are what the writers store, the tolerance model carries the dequantization
// rounding (correct host models below tightness 1, a power-of-two scale reader far above it),
// and the generator offers out_of_range only inside an envelope that names it.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/case.h"
#include "core/envelope.h"
#include "core/materialize.h"
#include "kernels/host/host_models.h"
#include "oracle/oracle.h"
#include "properties/generate.h"
#include "properties/tolerance.h"
#include "tests/core/build_paths.h"

namespace mlafuzz {
namespace {

Case v32_case(ScaleMode mode, uint64_t seed) {
  Case c;
  c.geom.layout = mla::Layout::kV32;
  c.geom.nope_dim = 512;
  c.geom.scale_tile = 128;
  c.geom.page_size = 16;
  c.geom.num_pages = 4;
  c.batch = 2;
  c.heads = 8;
  c.topk = 40;
  c.scales.mode = mode;
  c.scales.convention = ScaleConvention::kFp32;
  if (mode == ScaleMode::kFixed) c.scales.mantissa = 1.5;
  if (mode == ScaleMode::kRandom) {
    c.scales.exp_lo = 118;
    c.scales.exp_hi = 124;
  }
  c.data_seed = seed;
  return c;
}

float stored_scale(const MaterializedCase& m, int64_t slot, int t) {
  return mla::tile_scale(m.geom, m.cache.data(), mla::token_address(m.geom, slot), t);
}

TEST(WritersCase, AFileWithoutTheNewFieldsMeansPowerOfTwoScalesAndIsWrittenAsBefore) {
  const std::string path =
      std::string(mlafuzz::build_paths::kSourceDir) + "/corpus/cases/edge_v32.json";
  const Case c = load_case(path);
  EXPECT_EQ(c.scales.convention, ScaleConvention::kPowerOfTwo);
  EXPECT_EQ(c.scales.mantissa, 1.0);
  const std::string text = to_json(c);
  EXPECT_EQ(text.find("\"convention\""), std::string::npos) << text;
  EXPECT_EQ(text.find("\"mantissa\""), std::string::npos) << text;
  // Its stored V32 scales are powers of two (the default convention).
  const MaterializedCase m = materialize(c);
  for (int64_t s = 0; s < mla::num_slots(m.geom); ++s) {
    for (int t = 0; t < mla::num_scale_tiles(m.geom); ++t) {
      int e = 0;
      ASSERT_EQ(std::frexp(stored_scale(m, s, t), &e), 0.5f) << "slot " << s << " tile " << t;
    }
  }
}

TEST(WritersCase, Fp32ScalesAndOutOfRangeRoundTripAndAreCheckedByName) {
  Case c = v32_case(ScaleMode::kFixed, 3);
  c.conventions.invalid_index = mla::InvalidIndexRule::kOutOfRange;
  c.batch = 1;
  c.topk = 3;
  c.indices = {{std::numeric_limits<int32_t>::max(), 5, 64}};
  const Case back = case_from_json(to_json(c));
  EXPECT_EQ(back.scales.convention, ScaleConvention::kFp32);
  EXPECT_EQ(back.scales.mantissa, 1.5);
  EXPECT_EQ(back.conventions.invalid_index, mla::InvalidIndexRule::kOutOfRange);
  EXPECT_EQ(to_json(back), to_json(c));

  Case any = c;  // the same list under any_negative: 64 and INT_MAX are past the 64 slots
  any.conventions.invalid_index = mla::InvalidIndexRule::kAnyNegative;
  try {
    validate(any);
    ADD_FAILURE() << "an index past the cache passed validation under any_negative";
  } catch (const CaseError& e) {
    EXPECT_EQ(e.field(), "indices[0][0]");
  }
  Case model1;
  model1.scales.convention = ScaleConvention::kFp32;
  try {
    validate(model1);
    ADD_FAILURE() << "fp32 scales passed validation on MODEL1";
  } catch (const CaseError& e) {
    EXPECT_EQ(e.field(), "scales.convention");
  }
  Case mant = v32_case(ScaleMode::kWriter, 1);
  mant.scales.mantissa = 1.5;  // only fixed fp32 scales take a mantissa
  EXPECT_THROW(validate(mant), CaseError);
}

TEST(WritersMaterialize, TheFp32WriterStoresAmaxOver448AtLeastFltMin) {
  const Case c = v32_case(ScaleMode::kWriter, 11);
  const MaterializedCase m = materialize(c);
  int not_pow2 = 0;
  for (int64_t s = 0; s < mla::num_slots(m.geom); ++s) {
    for (int t = 0; t < 4; ++t) {
      float amax = 0;
      for (int d = t * 128; d < (t + 1) * 128; ++d) {
        amax = std::max(amax, std::fabs(kv_source_value(c, s, d)));
      }
      const float want = std::max(amax / 448.0f, FLT_MIN);
      ASSERT_EQ(mla::float_to_bits(stored_scale(m, s, t)), mla::float_to_bits(want))
          << "slot " << s << " tile " << t;
      int e = 0;
      not_pow2 += std::frexp(want, &e) != 0.5f;
    }
  }
  EXPECT_GT(not_pow2, 200);  // of 256 tiles: amax / 448 is almost never a power of two
}

TEST(WritersMaterialize, RandomFp32ScalesReachTheEdgesAndSubnormals) {
  Case c = v32_case(ScaleMode::kRandom, 5);
  c.scales.exp_lo = 0;
  c.scales.exp_hi = 2;
  c.geom.num_pages = 16;
  const MaterializedCase m = materialize(c);
  std::set<uint32_t> mantissas;
  int subnormal = 0, tiny_normal = 0;
  for (int64_t s = 0; s < mla::num_slots(m.geom); ++s) {
    for (int t = 0; t < 4; ++t) {
      const float v = stored_scale(m, s, t);
      ASSERT_TRUE(v > 0 && std::isfinite(v));
      if (v < FLT_MIN) {
        ++subnormal;
      } else {
        ++tiny_normal;
        mantissas.insert(mla::float_to_bits(v) & 0x7fffffu);
      }
    }
  }
  EXPECT_GT(subnormal, 0);
  EXPECT_GT(tiny_normal, 0);
  for (const float edge : {1.5f, std::nextafter(2.0f, 0.0f), std::nextafter(1.0f, 2.0f)}) {
    EXPECT_TRUE(mantissas.count(mla::float_to_bits(edge) & 0x7fffffu)) << edge;
  }
}

TEST(WritersMaterialize, OutOfRangeCachesEndInNaNGuardBytes) {
  Case c = v32_case(ScaleMode::kWriter, 2);
  const MaterializedCase plain = materialize(c);
  EXPECT_EQ(static_cast<int64_t>(plain.cache.size()), mla::cache_bytes(plain.geom));
  c.conventions.invalid_index = mla::InvalidIndexRule::kOutOfRange;
  const MaterializedCase m = materialize(c);
  const int64_t bytes = mla::cache_bytes(m.geom);
  ASSERT_EQ(static_cast<int64_t>(m.cache.size()), bytes + 2 * m.geom.page_stride);
  for (int64_t i = bytes; i < static_cast<int64_t>(m.cache.size()); ++i) {
    ASSERT_EQ(m.cache[static_cast<size_t>(i)], 0xff) << i;
  }
  // The same data bytes as without the guard.
  for (int64_t i = 0; i < bytes; ++i) ASSERT_EQ(m.cache[i], plain.cache[i]) << i;
}

// Tightness of a backend's run against the oracle under the tolerance model.
double tightness(Backend& be, const MaterializedCase& m, const MaterializedCase& ran) {
  const OracleResult ref = run_oracle_eigen(m);
  const RunResult r = be.run(ran);
  EXPECT_TRUE(r.ok()) << r.message;
  const Bounds bd = add_bounds(compute_bounds(m, ref, pipeline_of(be)),
                               compute_bounds(m, ref, pipeline_for(Precision::kFloat64)));
  const BoundCheck chk = check_bounds(Side{&r.out, &r.lse, true}, Side{&ref.out, &ref.lse, false},
                                      bd, m.query_rows(), m.heads, m.d_v());
  return chk.nonfinite_match ? chk.tightness : std::numeric_limits<double>::infinity();
}

// The case with every V32 scale rebuilt as 2^floor(log2 s): what a pow2_fp32 reader reads.
MaterializedCase rounded_scales(const MaterializedCase& m) {
  MaterializedCase r = m;
  for (int64_t s = 0; s < mla::num_slots(m.geom); ++s) {
    const mla::TokenAddress a = mla::token_address(m.geom, s);
    for (int t = 0; t < 4; ++t) {
      int e = 0;
      (void)std::frexp(stored_scale(m, s, t), &e);
      const uint32_t bits = mla::float_to_bits(std::ldexp(1.0f, e - 1));
      for (int i = 0; i < 4; ++i) {
        r.cache.mut()[static_cast<size_t>(a.scale + 4 * t + i)] =
            static_cast<uint8_t>(bits >> (8 * i));
      }
    }
  }
  return r;
}

TEST(WritersTolerance, CorrectReadersStayBelowOneAndAPowerOfTwoReaderExceedsIt) {
  auto simt = make_cpu_simt_backend();
  auto mma = make_cpu_mma_backend();
  double worst_correct = 0, least_buggy = std::numeric_limits<double>::infinity();
  double mma_without_term = 0;
  for (const ScaleMode mode : {ScaleMode::kWriter, ScaleMode::kFixed, ScaleMode::kRandom}) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      const MaterializedCase m = materialize(v32_case(mode, seed));
      for (Backend* be : {simt.get(), mma.get()}) {
        const double t = tightness(*be, m, m);
        const double bug = tightness(*be, m, rounded_scales(m));
        worst_correct = std::max(worst_correct, t);
        least_buggy = std::min(least_buggy, bug);
        EXPECT_LT(t, 1.0) << be->traits().name << " mode " << scale_mode_name(mode) << " seed "
                          << seed;
        EXPECT_GT(bug, 1.0) << be->traits().name << " reading power-of-two scales, mode "
                            << scale_mode_name(mode) << " seed " << seed;
      }
      // The same MMA run under a model without the dequantization term.
      const OracleResult ref = run_oracle_eigen(m);
      const RunResult r = mma->run(m);
      Pipeline p = pipeline_of(*mma);
      p.u_k = 0;
      const Bounds bd = add_bounds(compute_bounds(m, ref, p),
                                   compute_bounds(m, ref, pipeline_for(Precision::kFloat64)));
      mma_without_term =
          std::max(mma_without_term,
                   check_bounds(Side{&r.out, &r.lse, true}, Side{&ref.out, &ref.lse, false}, bd,
                                m.query_rows(), m.heads, m.d_v())
                       .tightness);
    }
  }
  std::cout << "fp32 V32 scales: worst correct tightness " << worst_correct
            << ", least power-of-two reader tightness " << least_buggy
            << ", cpu-mma without the dequantization term " << mma_without_term << "\n";
  EXPECT_GT(mma_without_term, 1.0) << "the dequantization term is not needed by cpu-mma";
}

TEST(WritersGenerator, OutOfRangeOnlyWhereTheEnvelopeNamesItWithTheZooInEveryPosition) {
  GenConfig plain;
  GenConfig oor;
  oor.envelope = any_case_envelope();
  int n_oor = 0, first = 0, last = 0, past_end = 0, int_max = 0, fp32 = 0;
  for (uint64_t i = 0; i < 400; ++i) {
    const Case p = generate_case(9, i, plain, nullptr);
    ASSERT_NE(p.conventions.invalid_index, mla::InvalidIndexRule::kOutOfRange) << "case " << i;
    fp32 += p.scales.convention == ScaleConvention::kFp32;
    const Case c = generate_case(9, i, oor, nullptr);
    if (c.conventions.invalid_index != mla::InvalidIndexRule::kOutOfRange) continue;
    ++n_oor;
    const int64_t slots = mla::num_slots(c.geom);
    for (const auto& row : c.indices) {
      first += row.front() >= slots;
      last += row.back() >= slots;
      for (const int32_t v : row) {
        past_end += v == slots || v == slots + 1 || v == slots + c.geom.page_size;
        int_max += v == std::numeric_limits<int32_t>::max();
      }
    }
    materialize(c);  // valid, with its guard
  }
  std::cout << "seed 9: " << n_oor << " of 400 cases out_of_range; lists starting past the cache "
            << first << ", ending past it " << last << "; entries num_slots (+1, +page) "
            << past_end << ", INT_MAX " << int_max << "; default fp32 V32 scale cases " << fp32
            << "\n";
  EXPECT_GT(n_oor, 20);
  EXPECT_GT(first, 0);
  EXPECT_GT(last, 0);
  EXPECT_GT(past_end, 0);
  EXPECT_GT(int_max, 0);
  EXPECT_GT(fp32, 20);
}

TEST(WritersEnvelope, OutOfRangeIsOptInAndV32ScalesRoundTrip) {
  EXPECT_FALSE(Envelope{}.allows(mla::InvalidIndexRule::kOutOfRange));
  EXPECT_TRUE(Envelope{}.allows(ScaleConvention::kFp32));
  EXPECT_TRUE(builtin_kernel_envelope().allows(mla::InvalidIndexRule::kOutOfRange));
  EXPECT_FALSE(cuda_kernel_envelope().allows(mla::InvalidIndexRule::kOutOfRange));
  EXPECT_FALSE(cuda_kernel_envelope().allows(ScaleConvention::kFp32));
  // A JSON envelope without the key (a Python kernel's, --envelope) excludes out_of_range.
  EXPECT_EQ(
      envelope_from_json(nlohmann::ordered_json::parse(R"({"heads": 4})")).invalid_index_rules,
      kBothValues);
  Envelope e;
  e.invalid_index_rules = kAllInvalidIndexRules;
  e.v32_scales = 1u << static_cast<int>(ScaleConvention::kPowerOfTwo);
  EXPECT_EQ(envelope_from_json(envelope_to_json(e)), e);
  Case c = v32_case(ScaleMode::kWriter, 1);
  ASSERT_TRUE(e.rejects(c).has_value());
  EXPECT_EQ(*e.rejects(c), "v32 scales fp32 not allowed");
}

}  // namespace
}  // namespace mlafuzz
