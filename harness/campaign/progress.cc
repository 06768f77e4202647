#include "harness/campaign/progress.h"

#include <cmath>
#include <cstdio>
#include <ostream>
#include <sstream>

namespace mlafuzz::campaign {

std::string fmt_g(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, x);
  return buf;
}

std::string fmt_duration(double s) {
  if (s < 0) s = 0;
  const long long t = std::llround(s);
  char buf[64];
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", t / 3600, (t % 3600) / 60);
  } else if (t >= 60) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", t / 60, t % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%llds", t);
  }
  return buf;
}

void Console::message(const std::string& text) {
  std::lock_guard<std::mutex> lock(mu_);
  os_ << (live_ ? "\r\x1b[K" : "") << text;
}

void Console::status(const std::string& line, bool final_line) {
  std::lock_guard<std::mutex> lock(mu_);
  if (live_) {
    os_ << "\r\x1b[K" << line << (final_line ? "\n" : "") << std::flush;
  } else {
    os_ << line << "\n" << std::flush;
  }
}

std::string progress_text(const ProgressFigures& p) {
  const double t = p.elapsed_s;
  std::ostringstream os;
  os << "mlafuzz: " << p.cases << " cases, " << fmt_g(t > 0 ? p.cases / t : 0) << " cases/s, "
     << p.failures << " failures (" << p.findings << " findings), worst tightness "
     << (p.nonfinite_mismatch ? std::string("non-finite mismatch") : fmt_g(p.worst_tightness));
  if (p.time_s) {
    os << ", " << fmt_duration(*p.time_s - t) << " left";
  } else if (p.max_cases) {
    const uint64_t done = static_cast<uint64_t>(p.cases);
    os << ", " << (*p.max_cases > done ? *p.max_cases - done : 0) << " cases left";
  }
  return os.str();
}

}  // namespace mlafuzz::campaign
