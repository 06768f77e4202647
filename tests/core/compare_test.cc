// Comparison metrics on hand-made arrays with known answers.
#include "core/compare.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/value_format.h"

namespace mlafuzz {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// check_allclose as one branchy loop over the elements (the code before the finite arrays' block
// path), frozen as the reference of Allclose.EqualsTheElementLoop.
namespace reference {

struct Anomaly {
  const char* name;
  bool (*is)(double);
};
constexpr Anomaly kAnomalies[] = {
    {"+inf", [](double v) { return std::isinf(v) && v > 0; }},
    {"-inf", [](double v) { return std::isinf(v) && v < 0; }},
    {"nan", [](double v) { return std::isnan(v); }},
};

AllcloseResult reference_check_allclose(const std::vector<double>& a_in,
                                        const std::vector<double>& r_in, const AllcloseTol& tol) {
  if (a_in.size() != r_in.size()) {
    throw std::invalid_argument(
        fmt::format("check_allclose: {} elements against {}", a_in.size(), r_in.size()));
  }
  AllcloseResult c;
  c.tol = tol;
  c.n = static_cast<int64_t>(a_in.size());
  // One pass: the non-finite classes' counts (kAnomalies' order) and the metrics.
  int64_t in_a[3] = {0, 0, 0}, in_r[3] = {0, 0, 0};
  bool same_class[3] = {true, true, true};
  double dot = 0, norm = 0;
  double worst_fail = -1, worst_any = -1;
  int64_t worst_any_i = -1;
  for (size_t i = 0; i < a_in.size(); ++i) {
    const bool fa = std::isfinite(a_in[i]), fr = std::isfinite(r_in[i]);
    if (!fa || !fr) {
      for (int k = 0; k < 3; ++k) {
        const bool ma = kAnomalies[k].is(a_in[i]), mr = kAnomalies[k].is(r_in[i]);
        in_a[k] += ma;
        in_r[k] += mr;
        same_class[k] = same_class[k] && ma == mr;
      }
    }
    // FlashMLA zeroes the non-finite positions of each array before the other metrics.
    const double a = fa ? a_in[i] : 0.0;
    const double r = fr ? r_in[i] : 0.0;
    dot += a * r;
    norm += a * a + r * r;
    bool pass;
    double d;
    if (fa && fr) {
      d = std::fabs(a - r);
      pass = d < tol.abs_tol || d / (std::fabs(r) + 1e-6) < tol.rel_tol;
    } else {
      // Same class (+inf, -inf or NaN) at the same position passes; any other pairing is a
      // mismatch, counted as failing and ranked worst so the report points at it.
      const bool same = std::isnan(a_in[i]) ? std::isnan(r_in[i]) : a_in[i] == r_in[i];
      pass = same;
      d = same ? 0.0 : HUGE_VAL;
    }
    if (pass) {
      ++c.n_pass;
    } else if (d > worst_fail) {
      worst_fail = d;
      c.worst = static_cast<int64_t>(i);
    }
    if (d > worst_any) {
      worst_any = d;
      worst_any_i = static_cast<int64_t>(i);
    }
  }
  for (int k = 0; k < 3; ++k) {
    if (!same_class[k]) {
      c.nonfinite_match = false;
      if (!c.nonfinite_detail.empty()) c.nonfinite_detail += "; ";
      c.nonfinite_detail +=
          fmt::format("{}: {} in backend, {} in reference", kAnomalies[k].name, in_a[k], in_r[k]);
    }
  }
  if (c.worst < 0) c.worst = worst_any_i;
  if (c.worst >= 0) {
    c.worst_a = a_in[static_cast<size_t>(c.worst)];
    c.worst_r = r_in[static_cast<size_t>(c.worst)];
  }
  c.pass_rate = c.n > 0 ? static_cast<double>(c.n_pass) / static_cast<double>(c.n) : 1.0;
  c.cos_diff = norm == 0 ? 0 : 1 - 2 * dot / norm;  // FlashMLA: 0 when both are all zero
  c.passed = c.nonfinite_match && c.n_pass == c.n && std::fabs(c.cos_diff) <= tol.cos_tol;
  return c;
}

}  // namespace reference

// Every figure of check_allclose bit for bit as the element loop gives it, on random arrays
// across the block size (256) with ties, exact matches, zero arrays and non-finite values.
TEST(Allclose, EqualsTheElementLoop) {
  const auto bits = [](double v) { return std::bit_cast<uint64_t>(v); };
  for (uint64_t seed = 1; seed <= 400; ++seed) {
    CounterRng rng(seed, Stream::kPoison, 41);
    const size_t sizes[] = {0, 1, 2, 255, 256, 257, 700};
    const size_t n = sizes[rng.uniform_int(0, 6)];
    const double special = rng.bernoulli(0.2) ? 0.01 : 0.0;
    const double zeros = rng.bernoulli(0.1) ? 1.0 : 0.05;
    const double spread = rng.bernoulli(0.5) ? 1e-4 : 1e-1;
    // Or one error everywhere (the worst element then the first of the ties, across blocks).
    const bool constant = rng.bernoulli(0.2);
    std::vector<double> a(n), r(n);
    for (size_t i = 0; i < n; ++i) {
      if (constant) {
        r[i] = static_cast<double>(rng.uniform_int(-3, 3));
        a[i] = r[i] + 0.25;
        continue;
      }
      const double u = rng.uniform();
      r[i] = u < zeros ? 0.0
                       : rng.normal() * std::ldexp(1.0, static_cast<int>(rng.uniform_int(-8, 8)));
      a[i] = rng.bernoulli(0.3) ? r[i] : r[i] + spread * rng.normal();
      if (i > 0 && rng.bernoulli(0.1)) {  // ties of the error with the element before
        r[i] = r[i - 1];
        a[i] = a[i - 1];
      }
      const double v = rng.uniform();
      if (v < special) a[i] = kNaN;
      if (v >= special && v < 2 * special) r[i] = rng.bernoulli(0.5) ? kInf : -kInf;
    }
    for (const AllcloseTol& tol : {kFlashMlaOutTol, kFlashMlaLseTol, AllcloseTol{1e9, 1e9, 1}}) {
      const AllcloseResult got = check_allclose(a, r, tol);
      const AllcloseResult want = reference::reference_check_allclose(a, r, tol);
      const std::string why = "seed " + std::to_string(seed) + " n " + std::to_string(n) +
                              "; rerun: core_tests --gtest_filter=Allclose.EqualsTheElementLoop";
      EXPECT_EQ(got.n, want.n) << why;
      EXPECT_EQ(got.n_pass, want.n_pass) << why;
      EXPECT_EQ(got.worst, want.worst) << why;
      EXPECT_EQ(got.passed, want.passed) << why;
      EXPECT_EQ(got.nonfinite_match, want.nonfinite_match) << why;
      EXPECT_EQ(got.nonfinite_detail, want.nonfinite_detail) << why;
      EXPECT_EQ(bits(got.pass_rate), bits(want.pass_rate)) << why;
      EXPECT_EQ(bits(got.cos_diff), bits(want.cos_diff)) << got.cos_diff << " " << why;
      EXPECT_EQ(bits(got.worst_a), bits(want.worst_a)) << why;
      EXPECT_EQ(bits(got.worst_r), bits(want.worst_r)) << why;
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(DiffStats, OriginalTestFigures) {
  const std::vector<double> ref{1.0, -2.0, 0.5, kInf};
  const std::vector<double> a{1.001, -2.004, 0.5, kInf};
  const DiffStats s = diff_stats(a, ref);
  EXPECT_EQ(s.compared, 3);  // the inf position is left out
  EXPECT_NEAR(s.max_abs, 0.004, 1e-15);
  EXPECT_NEAR(s.mean_abs, 0.005 / 3, 1e-15);
  EXPECT_EQ(s.max_ref, 2.0);
  EXPECT_NEAR(s.rel, 0.002, 1e-15);
  EXPECT_EQ(s.worst, 1);
}

TEST(Allclose, AbsOrRelPerElement) {
  const AllcloseTol tol{1e-3, 1e-2, 1.0};
  // 0: abs ok; 1: rel ok (|d|=0.05 on 10); 2: neither (|d|=0.02 on 1); 3: exact.
  const std::vector<double> ref{0.0, 10.0, 1.0, 3.0};
  const std::vector<double> a{0.0009, 10.05, 1.02, 3.0};
  const AllcloseResult c = check_allclose(a, ref, tol);
  EXPECT_EQ(c.n, 4);
  EXPECT_EQ(c.n_pass, 3);
  EXPECT_DOUBLE_EQ(c.pass_rate, 0.75);
  EXPECT_EQ(c.worst, 2);
  EXPECT_EQ(c.worst_a, 1.02);
  EXPECT_EQ(c.worst_r, 1.0);
  EXPECT_FALSE(c.passed);
}

TEST(Allclose, CosDiffFormula) {
  const std::vector<double> ref{1, 2, 3}, a{1, 2, 4};
  const AllcloseResult c = check_allclose(a, ref, {10, 10, 1});
  // 1 - 2*(1+4+12)/((1+4+16)+(1+4+9)) = 1 - 34/35
  EXPECT_NEAR(c.cos_diff, 1.0 / 35, 1e-15);
  EXPECT_TRUE(c.passed);
  EXPECT_FALSE(check_allclose(a, ref, {10, 10, 0.02}).passed);       // cos bound alone fails it
  EXPECT_EQ(check_allclose({0, 0}, {0, 0}, {1, 1, 0}).cos_diff, 0);  // all zero: 0 as FlashMLA
}

TEST(Allclose, NonFinitePositionsMustMatch) {
  const AllcloseTol tol = kFlashMlaLseTol;
  const std::vector<double> ref{kInf, 1.0, -kInf, kNaN};
  EXPECT_TRUE(check_allclose({kInf, 1.0, -kInf, kNaN}, ref, tol).passed);
  const AllcloseResult c = check_allclose({1.0, kInf, -kInf, kNaN}, ref, tol);
  EXPECT_FALSE(c.nonfinite_match);
  EXPECT_FALSE(c.passed);
  EXPECT_NE(c.nonfinite_detail.find("+inf: 1 in backend, 1 in reference"), std::string::npos)
      << c.nonfinite_detail;
  EXPECT_EQ(c.n_pass, 2);
  const AllcloseResult d = check_allclose({kInf, 1.0, kInf, kNaN}, ref, tol);
  EXPECT_NE(d.nonfinite_detail.find("-inf: 0 in backend, 1 in reference"), std::string::npos);
  EXPECT_EQ(d.worst, 2);
}

TEST(Compare, CoordinatesOfTheWorstElementAndLines) {
  // B=2, H=2, d_v=3; worst out element at (b=1, h=0, d=2) = flat 8.
  RunResult ref, a;
  ref.out.assign(12, 1.0);
  a.out = ref.out;
  a.out[8] = 1.5;
  ref.lse = {0.5, 0.5, kInf, 0.5};
  a.lse = ref.lse;
  const Comparison c = compare_results(a, ref, 2, 2, 3, "cpu-mma", "oracle");
  EXPECT_FALSE(c.passed());
  EXPECT_TRUE(c.lse_check.passed);
  EXPECT_EQ(c.out_check.worst, 8);
  EXPECT_EQ(c.original_line(),
            "out max|d|=5.000e-01 mean=4.167e-02 rel=5.000e-01 | lse max|d|=0.000e+00");
  EXPECT_NE(c.metrics_lines().find("(b=1, h=0, d=2)"), std::string::npos) << c.metrics_lines();
  // FlashMLA's fixed tolerances are information: counted, never called FAIL.
  EXPECT_NE(
      c.metrics_lines().find("out: info: 1 of 12 elements outside FlashMLA's fixed tolerance"),
      std::string::npos)
      << c.metrics_lines();
  EXPECT_NE(c.metrics_lines().find("lse: all 4 elements within FlashMLA's fixed tolerance"),
            std::string::npos)
      << c.metrics_lines();
  EXPECT_EQ(c.metrics_lines().find("FAIL"), std::string::npos) << c.metrics_lines();
  a.out[8] = 1.0;
  EXPECT_TRUE(compare_results(a, ref, 2, 2, 3).passed());
  a.guard_violations = 1;  // a write outside the output fails the comparison by itself
  EXPECT_FALSE(compare_results(a, ref, 2, 2, 3).passed());
  EXPECT_THROW(compare_results(a, ref, 2, 2, 4), std::invalid_argument);
}

TEST(Compare, FlashMlaTolerances) {
  EXPECT_EQ(kFlashMlaOutTol.abs_tol, 1e-3);
  EXPECT_EQ(kFlashMlaOutTol.rel_tol, 2.01 / 128);
  EXPECT_EQ(kFlashMlaOutTol.cos_tol, 5e-6);
  EXPECT_EQ(kFlashMlaLseTol.abs_tol, 1e-6);
  EXPECT_EQ(kFlashMlaLseTol.rel_tol, 8.01 / 65536);
}

// Failure details print every digit: fp32 with %.9g and its bits, bf16 with its bits, and the
// distance in ulps (two LSEs one bit apart never both read "8.66268").
TEST(ValueFormat, FullPrecisionBitsAndUlps) {
  const float a = 8.66268063f;
  const float b = std::nextafter(a, 100.0f);
  EXPECT_NE(format_value(a, ValueFormat::kFp32), format_value(b, ValueFormat::kFp32));
  EXPECT_EQ(format_value(a, ValueFormat::kFp32), "8.66268063 (fp32 0x410a9a57)");
  EXPECT_EQ(format_value(b, ValueFormat::kFp32), "8.66268158 (fp32 0x410a9a58)");
  EXPECT_EQ(ulp_distance_fp32(mla::float_to_bits(a), mla::float_to_bits(b)), 1);
  EXPECT_EQ(format_bf16_bits(0x3fc0), "1.5 (bf16 0x3fc0)");
  EXPECT_EQ(ulp_distance_bf16(0x3f80, 0x3f81), 1);
  EXPECT_EQ(ulp_distance_bf16(0x0000, 0x8000), 1);   // +0 and -0 are neighbours
  EXPECT_EQ(ulp_distance_bf16(0x0001, 0x8001), 3);   // across zero
  EXPECT_EQ(ulp_distance_bf16(0x7fc0, 0x3f80), -1);  // NaN
  EXPECT_EQ(format_value(0.1, ValueFormat::kFp64), "0.10000000000000001 (fp64)");
  EXPECT_EQ(ulp_of(1.0, ValueFormat::kBf16), 0x1p-7);
  EXPECT_EQ(ulp_of(1.0, ValueFormat::kFp32), 0x1p-23);
  EXPECT_EQ(ulp_of(0x1p-140, ValueFormat::kFp32), 0x1p-149);  // subnormal spacing
  EXPECT_EQ(ulps_text(1.0078125, 1.0, ValueFormat::kBf16), "1 ulp (bf16)");
  EXPECT_EQ(ulps_text(1.0, 1.0 + 0x1p-9, ValueFormat::kBf16), "0.25 ulp (bf16)");
}

}  // namespace
}  // namespace mlafuzz
