// The campaign's terminal output: messages, the progress line (rewritten in place on a
// terminal, one plain line at a time otherwise) and the figures it shows.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <mutex>
#include <optional>
#include <string>

namespace mlafuzz::campaign {

std::string fmt_g(double x, int digits = 3);
std::string fmt_duration(double s);  // "1h02m", "3m05s", "42s"

// Output shared by the evaluation threads; every call writes whole lines under one lock.
class Console {
 public:
  Console(std::ostream& os, bool live) : os_(os), live_(live) {}
  bool live() const { return live_; }
  // Whole lines (`text` ends in '\n'); on a terminal the progress line is cleared first.
  void message(const std::string& text);
  // The progress line: on a terminal rewritten in place (ended by a newline when `final_line`),
  // otherwise printed as one line.
  void status(const std::string& line, bool final_line);
  // Unguarded: only while no evaluation thread runs.
  std::ostream& out() { return os_; }

 private:
  std::mutex mu_;
  std::ostream& os_;
  bool live_;
};

struct ProgressFigures {
  int64_t cases = 0, failures = 0, findings = 0;
  double worst_tightness = 0;       // over the properties with error figures
  bool nonfinite_mismatch = false;  // printed instead of the worst tightness
  double elapsed_s = 0;
  std::optional<double> time_s;       // the time budget
  std::optional<uint64_t> max_cases;  // the case budget
};

// "mlafuzz: N cases, R cases/s, F failures (S findings), worst tightness T, 1m20s left".
std::string progress_text(const ProgressFigures& p);

}  // namespace mlafuzz::campaign
