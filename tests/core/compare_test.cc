// Comparison metrics on hand-made arrays with known answers.
#include "core/compare.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/value_format.h"

namespace mlafuzz {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

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
