// Renderings of a report: comparison of two nights, JUnit XML, self-contained HTML with inline
// SVG charts, terminal summary.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <string_view>

#include "harness/campaign/report.h"
#include "properties/property_table.h"

namespace mlafuzz::campaign {
namespace {

std::string fmt_g(double x, int digits = 3) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, x);
  return buf;
}

// A tightness figure, or "non-finite mismatch" (which outranks every finite tightness).
std::string tightness_text(double t, bool nonfinite, const char* mismatch = "non-finite mismatch") {
  return nonfinite ? mismatch : fmt_g(t);
}
std::string max_tightness_text(const PropertyStats& s,
                               const char* mismatch = "non-finite mismatch") {
  return tightness_text(s.max_tightness, s.nonfinite_mismatches > 0, mismatch);
}

// Escapes text for XML and HTML content and attribute values.
std::string esc(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char ch : s) {
    switch (ch) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      case '\'':
        o += "&#39;";
        break;
      default:
        // Control characters other than tab/newline are not allowed in XML 1.0.
        if (static_cast<unsigned char>(ch) < 0x20 && ch != '\n' && ch != '\t') {
          o += ' ';
        } else {
          o += ch;
        }
    }
  }
  return o;
}

std::string pair_key(const std::string& backend, const std::string& property) {
  return backend + " / " + property;
}

std::string joined(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

// The properties a finding fails (its own list, or the property of a version-1 finding).
std::vector<std::string> properties_of(const Finding& f) {
  if (!f.properties.empty()) return f.properties;
  return {f.property};
}

// Raw failures of all findings.
int64_t raw_total(const Report& r) {
  int64_t n = 0;
  for (const auto& f : r.findings) n += f.count;
  return n;
}

// "poison x12 (model1 B1 H1 T1-2 P=pow2 ...), tolerance x3 (...)": the raw classes of a finding.
std::string raw_text(const Finding& f, const char* sep) {
  std::vector<std::string> v;
  for (const auto& raw : f.raw) {
    v.push_back(raw.property + " x" + std::to_string(raw.count) + " (" + raw.shape_class +
                "; first: seed " + std::to_string(raw.seed) + " case " +
                std::to_string(raw.case_index) + ")");
  }
  return joined(v, sep);
}

// The lines of one finding, for the terminal and JUnit (each line indented by `indent`).
// The ledger's and the nights' marks of a finding: " [known: ID] [open since N] [flaky: ...]".
std::string finding_marks(const Finding& f) {
  std::string m;
  if (!f.known.empty()) m += " [known: " + f.known + "]";
  if (!f.state.empty()) m += " [" + f.state + " since " + f.state_since + "]";
  if (f.flaky_runs > 0 && f.flaky_failures < f.flaky_runs) {
    m += " [flaky: failed " + std::to_string(f.flaky_failures) + " of " +
         std::to_string(f.flaky_runs) + " replays]";
  }
  return m;
}

std::string finding_lines(const Finding& f, const std::string& indent) {
  std::ostringstream os;
  os << indent << "fails " << joined(properties_of(f), ", ") << "; " << f.count
     << " raw failure(s) folded";
  if (!f.raw.empty()) os << " in " << f.raw.size() << " class(es)";
  os << "\n";
  if (!f.locus.empty()) os << indent << "where: " << f.locus << "\n";
  if (!f.inputs.empty()) os << indent << f.inputs << "\n";
  if (!f.summary.empty()) os << indent << f.summary << "\n";
  os << indent << "first: seed " << f.seed << " case " << f.case_index
     << (f.shrunk ? ", shrunk" : ", not shrunk")
     << (f.shrink_note.empty() ? "" : " (" + f.shrink_note + ")") << "\n";
  if (!f.corpus_path.empty()) os << indent << "saved: " << f.corpus_path << "\n";
  os << indent << "reproduce: " << f.repro << "\n";
  return os.str();
}

// Whether a finding holds the failures of (backend, property).
bool holds(const Finding& f, const std::string& backend, const std::string& property) {
  if (f.backend != backend) return false;
  for (const auto& p : properties_of(f)) {
    if (p == property) return true;
  }
  for (const auto& raw : f.raw) {
    if (raw.property == property || (raw.property == "fault" && property == "run")) return true;
  }
  return false;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Compare
// ---------------------------------------------------------------------------------------------

namespace {

// The findings of NEW against OLD's, one line each (still open, known, new, gone) into os;
// returns whether a new finding is a regression.
bool compare_findings(const Report& o, const Report& n, std::ostringstream& os) {
  bool regression = false;
  std::set<std::string> old_sigs, new_sigs;
  for (const auto& f : o.findings) old_sigs.insert(f.signature);
  for (const auto& f : n.findings) new_sigs.insert(f.signature);
  // A version-1 OLD report has ungrouped findings: a NEW group is the same bug when OLD has a
  // finding of its backend and one of its properties.
  const bool old_ungrouped = o.version < 2;
  if (old_ungrouped) {
    os << "note: OLD is a version-1 report (findings not grouped): NEW findings are matched to its "
          "findings by backend and property\n";
  }
  const auto in_old = [&](const Finding& f) {
    if (old_sigs.count(f.signature)) return true;
    if (!old_ungrouped) return false;
    for (const auto& of : o.findings) {
      for (const auto& p : properties_of(f)) {
        if (holds(of, f.backend, p)) return true;
      }
    }
    return false;
  };
  for (const auto& f : n.findings) {
    if (in_old(f)) {
      os << "still open: " << f.signature << " (" << f.count << " raw failure(s))\n";
      continue;
    }
    if (!f.known.empty()) {
      os << "known new finding: " << f.signature << " (" << f.known << ")\n";
      continue;
    }
    regression = true;
    os << "REGRESSION new finding: " << f.signature << " (" << f.count << " raw failure(s))";
    if (!f.repro.empty()) os << "\n    reproduce: " << f.repro;
    os << "\n";
  }
  for (const auto& f : o.findings) {
    bool still = new_sigs.count(f.signature) > 0;
    for (const auto& nf : n.findings)
      still = still || (old_ungrouped && holds(f, nf.backend, f.property));
    if (!still) os << "gone: finding " << f.signature << "\n";
  }
  return regression;
}

// The (backend, property) results of NEW against OLD's (new, worse or changed tightness,
// failure rate, not run any more) into os; returns whether one is a regression.
bool compare_results(const Report& o, const Report& n, const CompareOptions& opt,
                     std::ostringstream& os) {
  bool regression = false;
  for (const auto& ns : n.results) {
    const PropertyStats* os_ = o.find_stats(ns.backend, ns.property);
    const std::string who = pair_key(ns.backend, ns.property);
    if (!os_) {
      os << "new: " << who << " (" << ns.cases << " cases, " << ns.failures << " failures)\n";
      continue;
    }
    const double a = os_->max_tightness, b = ns.max_tightness;
    const bool new_nonfinite = ns.nonfinite_mismatches > 0 && os_->nonfinite_mismatches == 0;
    const bool worse = new_nonfinite || (std::isnan(b) && !std::isnan(a)) ||
                       (b >= opt.min_tightness && b > opt.factor * a);
    if (new_nonfinite) {
      regression = true;
      os << "REGRESSION " << who << ": " << ns.nonfinite_mismatches << " non-finite mismatch(es)";
      if (!ns.worst.empty()) os << "\n    reproduce: " << ns.worst.front().repro;
      os << "\n";
    } else if (worse) {
      regression = true;
      os << "REGRESSION worst tightness " << who << ": " << fmt_g(a) << " -> " << fmt_g(b)
         << " (more than " << fmt_g(opt.factor) << "x)";
      if (!ns.worst.empty()) os << "\n    reproduce: " << ns.worst.front().repro;
      os << "\n";
    } else if (a != b && (a > 0 || b > 0)) {
      os << "tightness " << who << ": " << fmt_g(a) << " -> " << fmt_g(b) << "\n";
    }
    const double fo = os_->applicable() ? double(os_->failures) / os_->applicable() : 0;
    const double fn = ns.applicable() ? double(ns.failures) / ns.applicable() : 0;
    if (fo != fn) {
      os << "failure rate " << who << ": " << fmt_g(100 * fo) << "% -> " << fmt_g(100 * fn)
         << "%\n";
    }
  }
  for (const auto& s : o.results) {
    if (!n.find_stats(s.backend, s.property)) {
      os << "not run any more: " << pair_key(s.backend, s.property) << "\n";
    }
  }
  return regression;
}

}  // namespace

Comparison compare_reports(const Report& o, const Report& n, const CompareOptions& opt) {
  Comparison c;
  std::ostringstream os;
  os << "cases: " << o.cases << " -> " << n.cases << "; cases/s: " << fmt_g(o.cases_per_s) << " -> "
     << fmt_g(n.cases_per_s) << "\n";
  if (o.commit != n.commit) os << "commit: " << o.commit << " -> " << n.commit << "\n";
  const bool new_finding = compare_findings(o, n, os);
  const bool worse_result = compare_results(o, n, opt, os);
  c.regression = new_finding || worse_result;
  os << (c.regression ? "verdict: REGRESSION\n" : "verdict: no regression\n");
  c.text = os.str();
  return c;
}

// ---------------------------------------------------------------------------------------------
// JUnit
// ---------------------------------------------------------------------------------------------

namespace {

// A (backend, property) fails only for failures no finding holds (findings lost, or a campaign
// run without them): each bug fails one test case, its finding's.
bool uncovered(const Report& r, const PropertyStats& s) {
  if (s.failures == 0) return false;
  for (const auto& f : r.findings) {
    if (holds(f, s.backend, s.property)) return false;
  }
  return true;
}

// The "findings" test suite: one test case per finding, failed (or skipped when the
// known-failure ledger holds it).
void junit_findings_suite(const Report& r, int64_t known, std::ostringstream& x) {
  x << "  <testsuite name=\"findings\" tests=\"" << r.findings.size() << "\" failures=\""
    << r.findings.size() - known << "\" errors=\"0\" skipped=\"" << known << "\" time=\""
    << fmt_g(r.duration_s, 6) << "\" timestamp=\"" << esc(r.start) << "\" hostname=\""
    << esc(r.host) << "\">\n";
  for (const auto& f : r.findings) {
    std::string body = "finding " + f.signature + finding_marks(f) + " seen " +
                       std::to_string(f.count) + "x\n" + finding_lines(f, "");
    if (!f.raw.empty()) body += "raw failures: " + raw_text(f, "; ") + "\n";
    const std::string causes =
        f.causes.empty() ? "fails on the canonical case" : joined(f.causes, "; ");
    x << "    <testcase name=\"" << esc(f.signature) << "\" classname=\"mlafuzz.findings."
      << esc(f.backend) << "\">\n";
    if (!f.known.empty()) {
      x << "      <skipped message=\"" << esc("known: " + f.known + " (" + f.known_note + ")")
        << "\">" << esc(body) << "</skipped>\n    </testcase>\n";
      continue;
    }
    x << "      <failure message=\"" << esc((f.kind.empty() ? f.property : f.kind) + ": " + causes)
      << "\" type=\"" << esc(f.kind.empty() ? f.property : f.kind) << "\">" << esc(body)
      << "</failure>\n"
      << "    </testcase>\n";
  }
  x << "  </testsuite>\n";
}

// One backend's test suite: a test case per property, its figures, failed for failures no
// finding holds, skipped where no case applied.
void junit_backend_suite(const Report& r, const std::string& backend,
                         const std::vector<const PropertyStats*>& stats, std::ostringstream& x) {
  int64_t f = 0, sk = 0;
  for (const auto* s : stats) {
    f += uncovered(r, *s) ? 1 : 0;
    sk += s->applicable() == 0;
  }
  x << "  <testsuite name=\"" << esc(backend) << "\" tests=\"" << stats.size() << "\" failures=\""
    << f << "\" errors=\"0\" skipped=\"" << sk << "\" time=\"" << fmt_g(r.duration_s, 6)
    << "\" timestamp=\"" << esc(r.start) << "\" hostname=\"" << esc(r.host) << "\">\n";
  for (const auto* s : stats) {
    x << "    <testcase name=\"" << esc(s->property) << "\" classname=\"mlafuzz." << esc(backend)
      << "\">\n";
    std::string grouped;
    for (const auto& fi : r.findings) {
      if (holds(fi, s->backend, s->property)) grouped += "\n  in finding " + fi.signature;
    }
    x << "      <system-out>" << s->cases << " cases, " << s->not_applicable << " not applicable, "
      << s->failures << " failures; max_abs " << fmt_g(s->max_abs) << ", mean_abs "
      << fmt_g(s->mean_abs()) << ", lse_max_abs " << fmt_g(s->lse_max_abs) << ", tightness max "
      << max_tightness_text(*s) << " p99 " << fmt_g(s->tightness.quantile(0.99, s->max_tightness))
      << esc(grouped) << "</system-out>\n";
    if (uncovered(r, *s)) {
      std::ostringstream body;
      for (const auto& w : s->worst) {
        if (!w.failed) continue;
        body << "case " << w.case_index << " (" << w.shape << "): " << w.detail
             << "\nreproduce: " << w.repro << "\n";
      }
      x << "      <failure message=\"" << s->failures << " of " << s->applicable()
        << " cases failed (in no finding); worst tightness " << max_tightness_text(*s)
        << "\" type=\"" << esc(s->property) << "\">" << esc(body.str()) << "</failure>\n";
    } else if (s->applicable() == 0) {
      x << "      <skipped message=\"not applicable to this backend\"/>\n";
    }
    x << "    </testcase>\n";
  }
  x << "  </testsuite>\n";
}

}  // namespace

std::string render_junit(const Report& r) {
  std::map<std::string, std::vector<const PropertyStats*>> by_backend;
  for (const auto& s : r.results) by_backend[s.backend].push_back(&s);
  // A finding the known-failure ledger holds is a skipped test case, not a failure.
  int64_t known = 0;
  for (const auto& f : r.findings) known += !f.known.empty();
  int64_t tests = static_cast<int64_t>(r.findings.size());
  int64_t failures = tests - known, skipped = known;
  for (const auto& s : r.results) {
    ++tests;
    if (uncovered(r, s)) ++failures;
    if (s.applicable() == 0) ++skipped;
  }
  std::ostringstream x;
  x << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  x << "<testsuites name=\"mlafuzz\" tests=\"" << tests << "\" failures=\"" << failures
    << "\" errors=\"0\" skipped=\"" << skipped << "\" time=\"" << fmt_g(r.duration_s, 6) << "\">\n";
  junit_findings_suite(r, known, x);
  for (const auto& [backend, stats] : by_backend) junit_backend_suite(r, backend, stats, x);
  x << "</testsuites>\n";
  return x.str();
}

// ---------------------------------------------------------------------------------------------
// HTML with inline SVG
// ---------------------------------------------------------------------------------------------

namespace {

const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                          "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"};

struct Point {
  double x, y;
  int series;
  bool failed;
};

// Axis mapping, linear or log10, from data range to pixels.
struct Axis {
  double lo, hi;
  bool log;
  double p0, p1;  // pixel range
  double map(double v) const {
    double a = log ? std::log10(v) : v, l = log ? std::log10(lo) : lo,
           h = log ? std::log10(hi) : hi;
    if (h <= l) return (p0 + p1) / 2;
    return p0 + (a - l) / (h - l) * (p1 - p0);
  }
  std::vector<double> ticks() const {
    std::vector<double> t;
    if (log) {
      for (double e = std::floor(std::log10(lo)); e <= std::ceil(std::log10(hi)); e += 1) {
        const double v = std::pow(10.0, e);
        if (v >= lo * 0.999 && v <= hi * 1.001) t.push_back(v);
      }
      if (t.size() < 2) t = {lo, hi};
    } else {
      for (int i = 0; i <= 4; ++i) t.push_back(lo + (hi - lo) * i / 4);
    }
    return t;
  }
};

Axis fit_axis(std::vector<double> v, bool log, double p0, double p1) {
  Axis a{0, 1, log, p0, p1};
  if (log) v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !(x > 0); }), v.end());
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return log ? Axis{1e-6, 1, true, p0, p1} : a;
  auto [mn, mx] = std::minmax_element(v.begin(), v.end());
  a.lo = *mn;
  a.hi = *mx;
  if (log) {
    a.lo = std::pow(10.0, std::floor(std::log10(a.lo)));
    a.hi = std::pow(10.0, std::ceil(std::log10(a.hi)));
    if (a.hi <= a.lo) a.hi = a.lo * 10;
  } else if (a.hi <= a.lo) {
    a.lo -= 1;
    a.hi += 1;
  }
  return a;
}

constexpr int kW = 520, kH = 300, kL = 60, kR = 12, kT = 28, kB = 42;

// Opens a chart: the svg element, its title and the plot area's frame.
void svg_open(std::ostringstream& s, const std::string& title) {
  s << "<svg class=\"chart\" width=\"" << kW << "\" height=\"" << kH << "\" viewBox=\"0 0 " << kW
    << " " << kH << "\" role=\"img\">\n";
  s << "<text x=\"" << kW / 2 << "\" y=\"16\" text-anchor=\"middle\" class=\"t\">" << esc(title)
    << "</text>\n";
  s << "<rect x=\"" << kL << "\" y=\"" << kT << "\" width=\"" << kW - kL - kR << "\" height=\""
    << kH - kT - kB << "\" fill=\"none\" stroke=\"#999\"/>\n";
}

void svg_frame(std::ostringstream& s, const std::string& title, const Axis& x, const Axis& y,
               const std::string& xlabel, const std::string& ylabel) {
  svg_open(s, title);
  for (double t : x.ticks()) {
    const double px = x.map(t);
    s << "<line x1=\"" << px << "\" y1=\"" << kH - kB << "\" x2=\"" << px << "\" y2=\""
      << kH - kB + 4 << "\" stroke=\"#666\"/><text x=\"" << px << "\" y=\"" << kH - kB + 15
      << "\" text-anchor=\"middle\" class=\"a\">" << fmt_g(t, 3) << "</text>\n";
  }
  for (double t : y.ticks()) {
    const double py = y.map(t);
    s << "<line x1=\"" << kL - 4 << "\" y1=\"" << py << "\" x2=\"" << kW - kR << "\" y2=\"" << py
      << "\" stroke=\"#eee\"/><text x=\"" << kL - 6 << "\" y=\"" << py + 4
      << "\" text-anchor=\"end\" class=\"a\">" << fmt_g(t, 3) << "</text>\n";
  }
  s << "<text x=\"" << (kL + kW - kR) / 2 << "\" y=\"" << kH - 6
    << "\" text-anchor=\"middle\" class=\"a\">" << esc(xlabel) << "</text>\n";
  s << "<text x=\"12\" y=\"" << (kT + kH - kB) / 2 << "\" text-anchor=\"middle\" class=\"a\" "
    << "transform=\"rotate(-90 12 " << (kT + kH - kB) / 2 << ")\">" << esc(ylabel) << "</text>\n";
}

std::string svg_scatter(const std::string& title, const std::vector<Point>& pts,
                        const std::vector<std::string>& series, bool logx, bool logy,
                        const std::string& xlabel, const std::string& ylabel) {
  std::vector<double> xs, ys;
  for (const auto& p : pts) {
    xs.push_back(p.x);
    ys.push_back(p.y);
  }
  const Axis x = fit_axis(xs, logx, kL, kW - kR);
  const Axis y = fit_axis(ys, logy, kH - kB, kT);
  std::ostringstream s;
  svg_frame(s, title, x, y, xlabel, ylabel);
  int plotted = 0;
  for (const auto& p : pts) {
    if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
    if ((logx && p.x <= 0) || (logy && p.y <= 0)) continue;
    const char* color = kPalette[p.series % 10];
    s << "<circle cx=\"" << fmt_g(x.map(p.x), 5) << "\" cy=\"" << fmt_g(y.map(p.y), 5) << "\" r=\""
      << (p.failed ? 4 : 2.5) << "\" fill=\"" << color << "\" fill-opacity=\"0.6\""
      << (p.failed ? " stroke=\"#000\"" : "") << "/>\n";
    ++plotted;
  }
  if (plotted == 0) {
    s << "<text x=\"" << kW / 2 << "\" y=\"" << kH / 2
      << "\" text-anchor=\"middle\" class=\"a\">no positive values to plot</text>\n";
  }
  for (size_t i = 0; i < series.size(); ++i) {
    s << "<rect x=\"" << kL + 8 << "\" y=\"" << kT + 6 + 14 * i
      << "\" width=\"9\" height=\"9\" fill=\"" << kPalette[i % 10] << "\"/><text x=\"" << kL + 21
      << "\" y=\"" << kT + 14 + 14 * i << "\" class=\"a\">" << esc(series[i]) << "</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

std::string svg_histogram(const std::string& title, const LogHistogram& h) {
  int first = -1, last = -1;
  int64_t peak = 0;
  for (int i = 0; i < LogHistogram::kBins; ++i) {
    if (h.counts[i] > 0) {
      if (first < 0) first = i;
      last = i;
      peak = std::max(peak, h.counts[i]);
    }
  }
  std::ostringstream s;
  if (first < 0) {
    s << "<svg class=\"chart\" width=\"" << kW << "\" height=\"60\" viewBox=\"0 0 " << kW
      << " 60\"><text x=\"10\" y=\"30\" class=\"t\">" << esc(title)
      << ": no applicable cases</text></svg>\n";
    return s.str();
  }
  // Always show the bins around 1 (the bound), so a correct backend is visibly left of it.
  const int one = LogHistogram::bin_of(1.0);
  first = std::min(first, std::max(1, one - 20));
  last = std::max(last, std::min(LogHistogram::kBins - 2, one + 2));
  const Axis x{double(first), double(last + 1), false, double(kL), double(kW - kR)};
  const Axis y{0, double(peak), false, double(kH - kB), double(kT)};
  svg_open(s, title);
  for (int i = first; i <= last; ++i) {
    const double x0 = x.map(i), x1 = x.map(i + 1);
    const double y0 = y.map(double(h.counts[i]));
    const bool over = LogHistogram::lower_edge(i) >= 1.0;
    s << "<rect x=\"" << fmt_g(x0, 5) << "\" y=\"" << fmt_g(y0, 5) << "\" width=\""
      << fmt_g(std::max(1.0, x1 - x0 - 1), 4) << "\" height=\"" << fmt_g(kH - kB - y0, 5)
      << "\" fill=\"" << (over ? "#d62728" : "#1f77b4") << "\"><title>["
      << fmt_g(LogHistogram::lower_edge(i)) << ", " << fmt_g(LogHistogram::upper_edge(i))
      << "): " << h.counts[i] << "</title></rect>\n";
  }
  // Decade labels.
  for (int i = first; i <= last + 1; ++i) {
    if (i == 0 || (i - 1) % LogHistogram::kPerDecade != 0) continue;
    const double px = x.map(i);
    s << "<line x1=\"" << px << "\" y1=\"" << kH - kB << "\" x2=\"" << px << "\" y2=\""
      << kH - kB + 4 << "\" stroke=\"#666\"/><text x=\"" << px << "\" y=\"" << kH - kB + 15
      << "\" text-anchor=\"middle\" class=\"a\">" << fmt_g(LogHistogram::lower_edge(i))
      << "</text>\n";
  }
  const double px1 = x.map(one);
  s << "<line x1=\"" << px1 << "\" y1=\"" << kT << "\" x2=\"" << px1 << "\" y2=\"" << kH - kB
    << "\" stroke=\"#d62728\" stroke-dasharray=\"4 3\"/>\n";
  s << "<text x=\"" << kL - 6 << "\" y=\"" << kT + 10 << "\" text-anchor=\"end\" class=\"a\">"
    << peak << "</text><text x=\"" << kL - 6 << "\" y=\"" << kH - kB
    << "\" text-anchor=\"end\" class=\"a\">0</text>\n";
  s << "<text x=\"" << (kL + kW - kR) / 2 << "\" y=\"" << kH - 6
    << "\" text-anchor=\"middle\" class=\"a\">tightness = max error / bound (log bins; dashed: "
       "bound)</text>\n";
  s << "</svg>\n";
  return s.str();
}

// The page head and the campaign table: what ran, where, how long.
void html_campaign(std::ostream& h, const Report& r) {
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
    << "<title>mlafuzz report: seed " << r.seed << ", " << r.cases << " cases</title>\n"
    << "<style>body{font-family:sans-serif;margin:1.5em;color:#222}"
       "table{border-collapse:collapse;margin:.5em 0 1.5em}"
       "td,th{border:1px solid #ccc;padding:3px 7px;font-size:13px;text-align:right}"
       "td.l,th.l{text-align:left}tr.fail td{background:#fde0e0}"
       ".chart{margin:4px;border:1px solid #eee}.t{font-size:13px;font-weight:bold}"
       ".a{font-size:10px;fill:#333}code{font-size:12px;background:#f4f4f4}"
       ".grid{display:flex;flex-wrap:wrap}</style></head><body>\n";
  h << "<h1>mlafuzz campaign report</h1>\n";
  h << "<table><tr><th class=\"l\">seed</th><td class=\"l\">" << r.seed
    << "</td></tr><tr><th class=\"l\">profile</th><td class=\"l\">" << esc(r.profile)
    << "</td></tr><tr><th class=\"l\">shards</th><td class=\"l\">";
  for (const auto& s : r.shards) {
    h << s.index << "/" << s.count << " (" << esc(s.host) << ", " << s.cases << " cases, "
      << esc(s.stop_reason) << ") ";
  }
  h << "</td></tr><tr><th class=\"l\">backends</th><td class=\"l\">";
  for (const auto& b : r.backends) h << esc(b) << " ";
  h << "</td></tr><tr><th class=\"l\">commit</th><td class=\"l\">" << esc(r.commit)
    << "</td></tr><tr><th class=\"l\">host</th><td class=\"l\">" << esc(r.host)
    << "</td></tr><tr><th class=\"l\">GPU / driver / CUDA</th><td class=\"l\">" << esc(r.gpu_name)
    << " / " << esc(r.driver_version) << " / " << esc(r.cuda_version)
    << "</td></tr><tr><th class=\"l\">start / end</th><td class=\"l\">" << esc(r.start) << " / "
    << esc(r.end) << "</td></tr><tr><th class=\"l\">cases</th><td class=\"l\">" << r.cases << " in "
    << fmt_g(r.duration_s, 4) << " s (" << fmt_g(r.cases_per_s, 4) << " cases/s), stopped by "
    << esc(r.stop_reason) << (r.complete ? "" : " (snapshot of a running campaign)")
    << "</td></tr>";
  for (const auto& w : r.warnings) {
    h << "<tr class=\"fail\"><th class=\"l\">warning</th><td class=\"l\">" << esc(w)
      << "</td></tr>";
  }
  h << "<tr><th class=\"l\">devices</th><td class=\"l\">";
  for (const auto& d : r.devices) {
    h << esc(d.label) << (d.name.empty() ? "" : " (" + esc(d.name) + ")") << ": " << d.cases
      << " cases; ";
  }
  h << "</td></tr></table>\n";
}

// Findings, one row per group (one per bug), the raw failures it folds behind a <details>.
void html_findings(std::ostream& h, const Report& r) {
  h << "<h2>Findings (" << r.findings.size() << ", one per bug; " << raw_total(r)
    << " raw failures folded)</h2>\n";
  if (r.findings.empty()) {
    h << "<p>None.</p>\n";
    return;
  }
  h << "<table><tr><th class=\"l\">backend</th><th class=\"l\">kind</th>"
       "<th class=\"l\">causes</th><th class=\"l\">fails</th><th>raw failures</th>"
       "<th>tightness</th><th class=\"l\">where</th><th class=\"l\">first case</th>"
       "<th class=\"l\">corpus / reproduce</th></tr>\n";
  for (const auto& f : r.findings) {
    h << "<tr class=\"fail\"><td class=\"l\">" << esc(f.backend) << esc(finding_marks(f))
      << "</td><td class=\"l\">" << esc(f.kind.empty() ? f.property : f.kind)
      << "</td><td class=\"l\">"
      << esc(f.causes.empty() ? (f.kind.empty() ? f.signature : "fails on the canonical case")
                              : joined(f.causes, "; "))
      << "</td><td class=\"l\">" << esc(joined(properties_of(f), ", ")) << "</td><td>" << f.count
      << "</td><td>" << tightness_text(f.tightness, f.nonfinite_mismatch) << "</td><td class=\"l\">"
      << esc(f.locus);
    if (!f.inputs.empty()) h << "<br><code>" << esc(f.inputs) << "</code>";
    h << "</td><td class=\"l\">seed " << f.seed << " case " << f.case_index
      << (f.shrink_note.empty() ? "" : "<br>(" + esc(f.shrink_note) + ")")
      << "</td><td class=\"l\"><code>" << esc(f.corpus_path) << "</code><br><code>" << esc(f.repro)
      << "</code></td></tr>\n";
    h << "<tr><td class=\"l\" colspan=\"9\"><details><summary>" << esc(f.signature) << ": "
      << f.raw.size() << " raw failure class(es)</summary><p>" << esc(f.summary)
      << "</p><table><tr><th class=\"l\">property</th><th class=\"l\">shape class</th>"
         "<th>count</th><th class=\"l\">first case</th><th class=\"l\">reproduce</th></tr>\n";
    for (const auto& raw : f.raw) {
      h << "<tr><td class=\"l\">" << esc(raw.property) << "</td><td class=\"l\">"
        << esc(raw.shape_class) << "</td><td>" << raw.count << "</td><td class=\"l\">seed "
        << raw.seed << " case " << raw.case_index << "</td><td class=\"l\"><code>" << esc(raw.repro)
        << "</code></td></tr>\n";
    }
    h << "</table></details></td></tr>\n";
  }
  h << "</table>\n";
}

// Summary table: one row per backend and property.
void html_results(std::ostream& h, const Report& r) {
  h << "<h2>Per backend and property</h2>\n<table><tr><th class=\"l\">backend</th>"
       "<th class=\"l\">property</th><th>cases</th><th>n/a</th><th>failures</th><th>max abs</th>"
       "<th>mean abs</th><th>max rel</th><th>cos diff</th><th>lse max abs</th>"
       "<th>tightness p50</th><th>p90</th><th>p99</th><th>max</th><th>FlashMLA check "
       "fails</th></tr>\n";
  for (const auto& s : r.results) {
    h << "<tr" << (s.failures ? " class=\"fail\"" : "") << "><td class=\"l\">" << esc(s.backend)
      << "</td><td class=\"l\">" << esc(s.property) << "</td><td>" << s.cases << "</td><td>"
      << s.not_applicable << "</td><td>" << s.failures << "</td><td>" << fmt_g(s.max_abs)
      << "</td><td>" << fmt_g(s.mean_abs()) << "</td><td>" << fmt_g(s.max_rel) << "</td><td>"
      << fmt_g(s.max_cos_diff) << "</td><td>" << fmt_g(s.lse_max_abs) << "</td><td>"
      << fmt_g(s.tightness.quantile(0.5, s.max_tightness)) << "</td><td>"
      << fmt_g(s.tightness.quantile(0.9, s.max_tightness)) << "</td><td>"
      << fmt_g(s.tightness.quantile(0.99, s.max_tightness)) << "</td><td>" << max_tightness_text(s)
      << "</td><td>" << s.flashmla_failures << "</td></tr>\n";
  }
  h << "</table>\n";
}

// Tightness histograms, one per backend for every property with error figures, and scatter
// plots from the sampled points of the tolerance property.
void html_charts(std::ostream& h, const Report& r) {
  h << "<h2>Tightness histograms</h2>\n<div class=\"grid\">\n";
  for (const auto& s : r.results) {
    if (!has_error_figures(s.property)) continue;
    h << svg_histogram(s.backend + ": " + s.property, s.tightness);
  }
  h << "</div>\n";

  // Scatter plots from the sampled points of the tolerance property.
  std::vector<std::string> series;
  std::vector<Point> mag, topk, page;
  for (const auto& s : r.results) {
    if (s.property != "tolerance") continue;
    const int id = static_cast<int>(series.size());
    series.push_back(s.backend);
    for (const auto& p : s.samples) {
      mag.push_back({p.out_max_ref, p.max_abs, id, p.failed});
      topk.push_back({double(p.topk), p.tightness, id, p.failed});
      page.push_back({double(p.page_size), p.tightness, id, p.failed});
    }
  }
  h << "<h2>Error against magnitude, topk and page size</h2>\n<p>Sampled cases (up to "
    << PropertyStats::kSamples
    << " per backend, chosen by a hash of the case index so that merged reports sample the "
       "same cases); failed cases outlined.</p>\n<div class=\"grid\">\n";
  h << svg_scatter("max abs error vs max |reference out|", mag, series, true, true,
                   "max |reference out|", "max abs error");
  h << svg_scatter("tightness vs topk", topk, series, true, true, "topk", "tightness");
  h << svg_scatter("tightness vs page size", page, series, true, true, "page size", "tightness");
  h << "</div>\n";
}

constexpr size_t kTopTagValues = 8;

// Distribution of generated cases: one row per tag family with its most frequent values.
void html_tags(std::ostream& h, const Report& r) {
  h << "<h2>Generated cases</h2>\n";
  if (r.tags.empty()) {
    h << "<p>No tags recorded.</p>\n";
    return;
  }
  h << "<p>" << r.cases << " cases; tags by family, most frequent values first.</p>\n"
    << "<table><tr><th class=\"l\">family</th><th class=\"l\">values (cases)</th></tr>\n";
  for (const TagFamily& f : group_tags(r.tags, kTopTagValues)) {
    h << "<tr><td class=\"l\">" << esc(f.family) << "</td><td class=\"l\">";
    for (size_t i = 0; i < f.values.size(); ++i) {
      h << (i ? ", " : "") << esc(f.values[i].first) << " " << f.values[i].second;
    }
    if (f.others > 0) h << ", +" << f.others << " more (" << f.other_count << ")";
    h << "</td></tr>\n";
  }
  h << "</table>\n";
}

// Worst cases of every backend and property.
void html_worst(std::ostream& h, const Report& r) {
  h << "<h2>Worst cases</h2>\n<table><tr><th class=\"l\">backend / property</th><th>case</th>"
       "<th>tightness</th><th>max abs</th><th class=\"l\">shape</th><th class=\"l\">detail</th>"
       "<th class=\"l\">reproduce</th></tr>\n";
  for (const auto& s : r.results) {
    for (const auto& w : s.worst) {
      if (w.tightness <= 0 && !w.failed && !w.nonfinite_mismatch) continue;
      h << "<tr" << (w.failed ? " class=\"fail\"" : "") << "><td class=\"l\">"
        << esc(pair_key(s.backend, s.property)) << "</td><td>" << w.case_index << "</td><td>"
        << tightness_text(w.tightness, w.nonfinite_mismatch) << "</td><td>" << fmt_g(w.max_abs)
        << "</td><td class=\"l\">" << esc(w.shape) << "</td><td class=\"l\">" << esc(w.detail)
        << "</td><td class=\"l\"><code>" << esc(w.repro) << "</code></td></tr>\n";
    }
  }
}

}  // namespace

std::string render_html(const Report& r) {
  std::ostringstream h;
  html_campaign(h, r);
  html_findings(h, r);
  html_results(h, r);
  html_charts(h, r);
  html_tags(h, r);
  html_worst(h, r);
  h << "</table>\n</body></html>\n";
  return h.str();
}

// ---------------------------------------------------------------------------------------------
// Terminal summary
// ---------------------------------------------------------------------------------------------

std::string render_summary(const Report& r) {
  std::ostringstream os;
  os << r.cases << " cases in " << fmt_g(r.duration_s, 4) << " s (" << fmt_g(r.cases_per_s, 4)
     << " cases/s), seed " << r.seed << ", stopped by " << r.stop_reason << "\n";
  os << r.findings.size() << " finding(s), one per bug";
  if (!r.findings.empty()) os << ", folding " << raw_total(r) << " raw failure(s)";
  os << "\n";
  for (const auto& f : r.findings) {
    os << "  [" << f.count << "x] " << f.signature << finding_marks(f) << "\n"
       << finding_lines(f, "      ");
  }
  // Columns as wide as the longest backend and property name, so rows stay aligned.
  size_t wb = std::string_view("backend").size(), wp = std::string_view("property").size();
  bool large_abs_on_passing_rows = false;
  for (const auto& s : r.results) {
    wb = std::max(wb, s.backend.size());
    wp = std::max(wp, s.property.size());
    large_abs_on_passing_rows = large_abs_on_passing_rows || (s.failures == 0 && s.max_abs > 1);
  }
  os << fmt::format("  {:<{}} {:<{}} {:>8} {:>6} {:>8} {:>10} {:>10} {:>10}\n", "backend", wb,
                    "property", wp, "cases", "n/a", "failures", "max abs", "tight p99",
                    "tight max");
  for (const auto& s : r.results) {
    os << fmt::format("  {:<{}} {:<{}} {:>8} {:>6} {:>8} {:>10} {:>10} {:>10}\n", s.backend, wb,
                      s.property, wp, s.cases, s.not_applicable, s.failures, fmt_g(s.max_abs),
                      fmt_g(s.tightness.quantile(0.99, s.max_tightness)),
                      max_tightness_text(s, "non-finite"));
  }
  if (large_abs_on_passing_rows) {
    os << "  max abs is |backend - oracle| in output units: generated values reach 1e30, so it is\n"
          "  large on passing rows too; the verdict is tightness = error/bound (above 1 fails)\n";
  }
  if (!r.devices.empty()) {
    os << "  devices:";
    for (const auto& d : r.devices) os << " " << d.label << "=" << d.cases;
    os << "\n";
  }
  os << render_case_breakdown(r.case_breakdown);
  os << render_time_breakdown(r.time_breakdown);
  if (!r.tags.empty()) {
    // The distribution of generated cases: one line per tag family, its top values first.
    os << "  generated (tag family: top values and case counts):\n";
    for (const TagFamily& f : group_tags(r.tags, kTopTagValues)) {
      os << "    " << f.family << ":";
      for (size_t i = 0; i < f.values.size(); ++i) {
        os << (i ? ", " : " ") << f.values[i].first << " " << f.values[i].second;
      }
      if (f.others > 0) os << ", +" << f.others << " more (" << f.other_count << ")";
      os << "\n";
    }
  }
  if (!r.findings.empty()) {
    os << r.findings.size() << " finding(s), one per bug, listed at the top of this summary\n";
  }
  for (const auto& w : r.warnings) os << "warning: " << w << "\n";
  return os.str();
}

std::vector<TagFamily> group_tags(const std::map<std::string, int64_t>& tags, size_t top) {
  std::map<std::string, std::vector<std::pair<std::string, int64_t>>> families;
  for (const auto& [tag, count] : tags) {
    const size_t eq = tag.find('=');
    if (eq == std::string::npos) {
      families["flags"].emplace_back(tag, count);
    } else {
      families[tag.substr(0, eq)].emplace_back(tag.substr(eq + 1), count);
    }
  }
  std::vector<TagFamily> out;
  for (auto& [name, values] : families) {
    std::stable_sort(values.begin(), values.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    TagFamily f;
    f.family = name;
    for (size_t i = 0; i < values.size(); ++i) {
      if (i < top) {
        f.values.push_back(values[i]);
      } else {
        ++f.others;
        f.other_count += values[i].second;
      }
    }
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace mlafuzz::campaign
