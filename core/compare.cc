#include "core/compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <stdexcept>

namespace mlafuzz {
namespace {

// Counts positions of one non-finite class in each array; FlashMLA's deal_with_anomalies.
struct Anomaly {
  const char* name;
  bool (*is)(double);
};
constexpr Anomaly kAnomalies[] = {
    {"+inf", [](double v) { return std::isinf(v) && v > 0; }},
    {"-inf", [](double v) { return std::isinf(v) && v < 0; }},
    {"nan", [](double v) { return std::isnan(v); }},
};

std::string coords(int64_t flat, int32_t heads, int32_t d_v) {
  if (flat < 0) return "-";
  if (d_v <= 0) return fmt::format("(b={}, h={})", flat / heads, flat % heads);
  const int64_t row = flat / d_v;
  return fmt::format("(b={}, h={}, d={})", row / heads, row % heads, flat % d_v);
}

// FlashMLA's fixed tolerances are information beside the verdict (the tolerance property), so
// the line never says FAIL: it counts the elements outside them.
std::string check_line(const char* what, const AllcloseResult& c, int32_t heads, int32_t d_v) {
  const std::string tol = fmt::format("FlashMLA's fixed tolerance (abs<{:.3g} or rel<{:.3g})",
                                      c.tol.abs_tol, c.tol.rel_tol);
  std::string s = c.passed ? fmt::format("{}: all {} elements within {}", what, c.n, tol)
                           : fmt::format("{}: info: {} of {} elements outside {}", what,
                                         c.n - c.n_pass, c.n, tol);
  s += fmt::format("; cos_diff={:.3e} (FlashMLA's limit {:.1e}); non-finite {}", c.cos_diff,
                   c.tol.cos_tol,
                   c.nonfinite_match ? "match" : "mismatch (" + c.nonfinite_detail + ")");
  if (c.worst >= 0) {
    s += fmt::format("; worst at {}: got {:.6e}, ref {:.6e}", coords(c.worst, heads, d_v),
                     c.worst_a, c.worst_r);
  }
  return s;
}

// check_allclose's figures where every element of both arrays is finite, block by block: the
// errors, pass flags, pass count and maxima in lanes (an error's bits as an integer: for
// errors >= 0 the integers order as the values do), the worst element the first with the
// largest error (of the failing ones when some fail) found again in its block, and the
// cosine's sums one element after the other (their bits).
void allclose_finite(const double* a, const double* r, size_t n, AllcloseResult& c) {
  constexpr size_t kBlock = 256;
  // Per element of the block: its error's bits, and those bits + 1 where it fails (0 passes).
  int64_t d[kBlock], fail_d[kBlock];
  const AllcloseTol tol = c.tol;
  double dot = 0, norm = 0;
  int64_t worst_any = -1, worst_fail = 0;
  size_t any_block = 0, fail_block = n;
  const auto errors = [&](size_t b0, size_t len) {
    int64_t pass = 0, block_any = 0, block_fail = 0;
    for (size_t k = 0; k < len; ++k) {
      const double e = std::fabs(a[b0 + k] - r[b0 + k]);
      const double q = e / (std::fabs(r[b0 + k]) + 1e-6);
      const int64_t ok =
          static_cast<int64_t>(e < tol.abs_tol) | static_cast<int64_t>(q < tol.rel_tol);
      const auto bits = std::bit_cast<int64_t>(e);
      d[k] = bits;
      fail_d[k] = ok != 0 ? 0 : bits + 1;
      pass += ok;
      block_any = std::max(block_any, bits);
      block_fail = std::max(block_fail, fail_d[k]);
    }
    return std::array<int64_t, 3>{pass, block_any, block_fail};
  };
  for (size_t b0 = 0; b0 < n; b0 += kBlock) {
    const size_t len = std::min(kBlock, n - b0);
    const auto [pass, block_any, block_fail] = errors(b0, len);
    c.n_pass += pass;
    if (block_any > worst_any) {
      worst_any = block_any;
      any_block = b0;
    }
    if (block_fail > worst_fail) {
      worst_fail = block_fail;
      fail_block = b0;
    }
    for (size_t i = b0; i < b0 + len; ++i) {
      dot += a[i] * r[i];
      norm += a[i] * a[i] + r[i] * r[i];
    }
  }
  const bool failing = fail_block < n;
  const size_t b0 = failing ? fail_block : any_block;
  const size_t len = std::min(kBlock, n - b0);
  errors(b0, len);
  const int64_t* in = failing ? fail_d : d;
  const int64_t want = failing ? worst_fail : worst_any;
  size_t k = 0;
  while (k + 1 < len && in[k] != want) ++k;
  c.worst = static_cast<int64_t>(b0 + k);
  c.worst_a = a[b0 + k];
  c.worst_r = r[b0 + k];
  c.cos_diff = norm == 0 ? 0 : 1 - 2 * dot / norm;  // FlashMLA: 0 when both are all zero
}

}  // namespace

bool all_finite(const double* v, size_t n) {
  constexpr uint64_t kExponent = 0x7ff0000000000000ull;
  uint64_t off = 0;
  for (size_t i = 0; i < n; ++i) {
    off |= static_cast<uint64_t>((std::bit_cast<uint64_t>(v[i]) & kExponent) == kExponent);
  }
  return off == 0;
}

DiffStats diff_stats(const std::vector<double>& a, const std::vector<double>& ref) {
  DiffStats s;
  double sum = 0;
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(ref[i])) continue;
    const double d = std::fabs(a[i] - ref[i]);
    ++s.compared;
    sum += d;
    if (s.worst < 0 || d > s.max_abs) {
      s.max_abs = d;
      s.worst = static_cast<int64_t>(i);
    }
    s.max_ref = std::max(s.max_ref, std::fabs(ref[i]));
  }
  if (s.compared > 0) s.mean_abs = sum / static_cast<double>(s.compared);
  s.rel = s.max_ref > 0 ? s.max_abs / s.max_ref : 0;
  return s;
}

AllcloseResult check_allclose(const std::vector<double>& a_in, const std::vector<double>& r_in,
                              const AllcloseTol& tol) {
  if (a_in.size() != r_in.size()) {
    throw std::invalid_argument(
        fmt::format("check_allclose: {} elements against {}", a_in.size(), r_in.size()));
  }
  AllcloseResult c;
  c.tol = tol;
  c.n = static_cast<int64_t>(a_in.size());
  if (!a_in.empty() && all_finite(a_in.data(), a_in.size()) &&
      all_finite(r_in.data(), r_in.size())) {
    allclose_finite(a_in.data(), r_in.data(), a_in.size(), c);
    c.pass_rate = static_cast<double>(c.n_pass) / static_cast<double>(c.n);
    c.passed = c.n_pass == c.n && std::fabs(c.cos_diff) <= tol.cos_tol;
    return c;
  }
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

std::string Comparison::original_line() const {
  return fmt::format("out max|d|={:.3e} mean={:.3e} rel={:.3e} | lse max|d|={:.3e}", out.max_abs,
                     out.mean_abs, out.rel, lse.max_abs);
}

std::string Comparison::metrics_lines() const {
  std::string s =
      check_line("out", out_check, heads, d_v) + "\n" + check_line("lse", lse_check, heads, 0);
  if (guard_violations != 0) {
    s += fmt::format("\nguard FAIL: {} canary elements overwritten outside the output",
                     guard_violations);
  }
  return s;
}

Comparison compare_results(const RunResult& a, const RunResult& ref, int32_t batch, int32_t heads,
                           int32_t d_v, const std::string& backend, const std::string& reference) {
  const size_t n_out = static_cast<size_t>(int64_t{batch} * heads * d_v);
  const size_t n_lse = static_cast<size_t>(int64_t{batch} * heads);
  for (const RunResult* r : {&a, &ref}) {
    if (r->out.size() != n_out || r->lse.size() != n_lse) {
      throw std::invalid_argument(fmt::format(
          "compare_results: {} has out {} / lse {} elements, expected {} / {}",
          r == &a ? "backend" : "reference", r->out.size(), r->lse.size(), n_out, n_lse));
    }
  }
  Comparison c;
  c.backend = backend;
  c.reference = reference;
  c.batch = batch;
  c.heads = heads;
  c.d_v = d_v;
  c.out = diff_stats(a.out, ref.out);
  c.lse = diff_stats(a.lse, ref.lse);
  c.out_check = check_allclose(a.out, ref.out, kFlashMlaOutTol);
  c.lse_check = check_allclose(a.lse, ref.lse, kFlashMlaLseTol);
  c.guard_violations = a.guard_violations;
  return c;
}

}  // namespace mlafuzz
