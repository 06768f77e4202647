// check_bounds written as an element-by-element loop: the reference the row-wise check_bounds is
// pinned against (tests/properties/model_test.cc,
// Tolerance.CheckBoundsRowWiseEqualsTheElementLoop): every figure, the worst element and the
// message bit for bit.
#include "tests/properties/reference_bounds.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "core/value_format.h"

namespace mlafuzz::reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Classifies a value for the non-finite position check.
int finite_class(double v) {
  if (std::isnan(v)) return 1;
  if (v == kInf) return 2;
  if (v == -kInf) return 3;
  return 0;
}

const char* class_name(int c) {
  static const char* const names[] = {"finite", "NaN", "+inf", "-inf"};
  return names[c];
}

double ratio(double excess, double bound) {
  if (excess <= 0) return 0;
  return bound > 0 ? excess / bound : kInf;
}

}  // namespace

BoundCheck reference_check_bounds(const Side& a, const Side& b, const Bounds& bound, int32_t batch,
                                  int32_t heads, int32_t d_v) {
  BoundCheck r;
  r.bf16_outputs = a.out_bf16;
  // The element loop keeps its running figures in locals (the compiler cannot keep r's fields
  // in registers across the stores of a lambda that writes them), and takes the path that
  // writes a message only for non-finite values; the order of every update is the one of the
  // loop over (b, h, d) then the row's lse, so the figures, the worst element (the first with
  // the largest ratio) and the mean are the same as a loop over consider() would give.
  double sum_abs = 0, max_abs = 0, out_max_ref = 0, lse_max_abs = 0;
  double out_tightness = 0, lse_tightness = 0, worst = 0;
  int64_t n_abs = 0;
  bool any = false, passed = true;
  // Non-finite values: a class mismatch fails (the first one is described); equal classes are
  // skipped. Returns true when the element is finite on both sides.
  const auto finite_pair = [&](double va, double vb, int bb, int hh, int dd) {
    if (std::isfinite(va) && std::isfinite(vb)) return true;
    const int ca = finite_class(va), cb = finite_class(vb);
    if (ca != cb) {
      if (r.nonfinite_match) {
        const ValueFormat fa = !a.out_bf16 ? ValueFormat::kFp64
                               : dd >= 0   ? ValueFormat::kBf16
                                           : ValueFormat::kFp32;
        std::ostringstream os;
        os << (dd >= 0 ? "out[b=" : "lse[b=") << bb << ",h=" << hh;
        if (dd >= 0) os << ",d=" << dd;
        os << "]: " << class_name(ca) << " (" << format_value(va, fa) << ") where the reference is "
           << class_name(cb) << " (" << format_value(vb, ValueFormat::kFp64) << ")";
        r.nonfinite_detail = os.str();
      }
      r.nonfinite_match = false;
      passed = false;
    }
    return false;
  };
  const auto record = [&](double t, double va, double vb, double err, double excess, double bnd,
                          int bb, int hh, int dd) {
    worst = std::max(worst, t);
    any = true;
    r.b = bb;
    r.h = hh;
    r.d = dd;
    r.value = va;
    r.reference = vb;
    r.error = err;
    r.excess = excess;
    r.bound = bnd;
  };
  const bool a_bf16 = a.out_bf16, b_bf16 = b.out_bf16;
  for (int32_t bb = 0; bb < batch; ++bb) {
    for (int32_t hh = 0; hh < heads; ++hh) {
      const size_t rh = static_cast<size_t>(bb) * heads + hh;
      const double* ao = a.out->data() + rh * d_v;
      const double* bo = b.out->data() + rh * d_v;
      const double* bd = bound.out.data() + rh * d_v;
      for (int32_t dd = 0; dd < d_v; ++dd) {
        const double va = ao[dd], vb = bo[dd];
        if (!finite_pair(va, vb, bb, hh, dd)) continue;
        double alo = va, ahi = va, blo = vb, bhi = vb;
        if (a_bf16) bf16_rounding_interval(va, &alo, &ahi);
        if (b_bf16) bf16_rounding_interval(vb, &blo, &bhi);
        const double excess = std::max({blo - ahi, alo - bhi, 0.0});
        const double err = std::fabs(va - vb);
        const double t = ratio(excess, bd[dd]);
        out_tightness = std::max(out_tightness, t);
        sum_abs += err;
        ++n_abs;
        max_abs = std::max(max_abs, err);
        out_max_ref = std::max(out_max_ref, std::fabs(vb));
        if (t > worst || !any) record(t, va, vb, err, excess, bd[dd], bb, hh, dd);
        if (t > 1) passed = false;
      }
      const double va = (*a.lse)[rh], vb = (*b.lse)[rh];
      if (!finite_pair(va, vb, bb, hh, -1)) continue;
      const double err = std::fabs(va - vb);  // the excess too: lse values are exact
      const double t = ratio(err, bound.lse[rh]);
      lse_tightness = std::max(lse_tightness, t);
      lse_max_abs = std::max(lse_max_abs, err);
      if (t > worst || !any) record(t, va, vb, err, err, bound.lse[rh], bb, hh, -1);
      if (t > 1) passed = false;
    }
  }
  r.passed = passed;
  r.tightness = worst;
  r.max_abs = max_abs;
  r.out_max_ref = out_max_ref;
  r.lse_max_abs = lse_max_abs;
  r.out_tightness = out_tightness;
  r.lse_tightness = lse_tightness;
  r.mean_abs = n_abs > 0 ? sum_abs / static_cast<double>(n_abs) : 0;
  r.max_rel = r.out_max_ref > 0 ? r.max_abs / r.out_max_ref : 0;
  return r;
}

}  // namespace mlafuzz::reference
