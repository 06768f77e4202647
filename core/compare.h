// Comparison of one backend's output and LSE against a reference backend.
//
// Two views, both printed by `mlafuzz run`:
// - the original test's line (docs/SPEC.md section 1), kept so numbers compare with its history:
//     out max|d|=1.953e-03 mean=7.192e-05 rel=6.711e-03 | lse max|d|=6.914e-05
//   max|d| and mean are over positions where both values are finite; rel = max|d| / max|ref|
//   over those same positions (a scale-free figure: the largest error relative to the largest
//   reference magnitude, not an element-wise relative error).
// - FlashMLA's check_is_allclose (tests/kernelkit/compare.py, docs/SPEC.md section 5): an element
//   passes when |a-r| < abs_tol or |a-r|/(|r|+1e-6) < rel_tol; +inf, -inf and NaN must sit at
//   exactly the same positions (they are then zeroed in both, as FlashMLA does); and
//   cos_diff = 1 - 2*sum(a*r)/sum(a^2+r^2) must stay within cos_tol.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"

namespace mlafuzz {

struct DiffStats {
  double max_abs = 0;    // max |a - r| over positions finite in both
  double mean_abs = 0;   // mean |a - r| over the same positions
  double max_ref = 0;    // max |r| over the same positions
  double rel = 0;        // max_abs / max_ref (0 when max_ref is 0)
  int64_t compared = 0;  // positions finite in both
  int64_t worst = -1;    // flat index of max_abs, -1 if none compared
};
DiffStats diff_stats(const std::vector<double>& a, const std::vector<double>& ref);

// Whether v[0..n) are all finite: no exponent field all ones (tested in integer lanes, which
// the compiler vectorizes; std::isfinite into a bool does not).
bool all_finite(const double* v, size_t n);

struct AllcloseTol {
  double abs_tol;
  double rel_tol;
  double cos_tol;
};
// FlashMLA's test_flash_mla_sparse_decoding tolerances (bf16 output against a reference).
inline constexpr AllcloseTol kFlashMlaOutTol{1e-3, 2.01 / 128, 5e-6};
// lse: FlashMLA passes abs and rel; its cos_diff_tol default (1e-7) applies.
inline constexpr AllcloseTol kFlashMlaLseTol{1e-6, 8.01 / 65536, 1e-7};

struct AllcloseResult {
  AllcloseTol tol{0, 0, 0};
  int64_t n = 0;         // elements
  int64_t n_pass = 0;    // elements within abs_tol or rel_tol (non-finite mismatches fail)
  double pass_rate = 1;  // n_pass / n
  double cos_diff = 0;   // after zeroing the non-finite positions
  bool nonfinite_match = true;
  std::string nonfinite_detail;  // e.g. "+inf: 3 in backend, 4 in reference"; empty if match
  int64_t worst = -1;  // flat index of the largest |a-r| among failing elements (among all
                       // elements when none fails); -1 when empty
  double worst_a = 0, worst_r = 0;
  bool passed = true;
};
AllcloseResult check_allclose(const std::vector<double>& a, const std::vector<double>& ref,
                              const AllcloseTol& tol);

struct Comparison {
  std::string backend, reference;
  int32_t batch = 0, heads = 0, d_v = 0;
  DiffStats out, lse;
  AllcloseResult out_check, lse_check;
  int64_t guard_violations = 0;  // of the backend under test (must be 0)

  bool passed() const { return out_check.passed && lse_check.passed && guard_violations == 0; }
  // "out max|d|=1.953e-03 mean=7.192e-05 rel=6.711e-03 | lse max|d|=6.914e-05"
  std::string original_line() const;
  // FlashMLA metrics, one line each for out and lse, with the worst element's coordinates.
  std::string metrics_lines() const;
};

// Compares a against ref. Both must hold out [B, H, d_v] and lse [B, H]; throws
// std::invalid_argument otherwise.
Comparison compare_results(const RunResult& a, const RunResult& ref, int32_t batch, int32_t heads,
                           int32_t d_v, const std::string& backend = "",
                           const std::string& reference = "");

}  // namespace mlafuzz
