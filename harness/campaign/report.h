// The campaign report: a mergeable summary of everything a campaign ran and found.
//
// Schema "mlafuzz-report", version 2 (docs/report.md): version 2 lists findings as groups,
// one per bug (Finding: signature backend | failure kind | cause set, the properties failing on
// the canonical minimal case, locus, inputs, and the raw failure classes folded in); version-1
// reports load (their findings keep their ungrouped signatures). Every statistic is chosen so that
// merging the reports of disjoint shards gives the statistics of one campaign over the union of
// their cases: counts and sums add, maxima take the max, tightness percentiles come from a
// histogram with fixed log-spaced bins, the worst-case lists keep the top entries under a total
// order, and plotted points are a bottom-k sample keyed by a hash of (seed, case index).
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/campaign/time_breakdown.h"
#include "properties/corpus.h"

namespace mlafuzz::campaign {

inline constexpr const char* kReportFormat = "mlafuzz-report";
inline constexpr int kReportVersion = 2;
inline constexpr int kOldestReportVersion = 1;

// Raised for a malformed report; `what()` names the file and the JSON path of the bad field.
class ReportError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Histogram of non-negative values with fixed log-spaced bins, identical in every report so that
// histograms merge by adding counts. Bin 0 holds values below kLo (zero included); bins
// 1..kBins-2 cover [kLo, kHi) with kPerDecade bins per decade; the last bin holds values >= kHi,
// infinities and NaN.
struct LogHistogram {
  static constexpr double kLo = 1e-6;
  static constexpr double kHi = 1e6;
  static constexpr int kPerDecade = 10;
  static constexpr int kBins = 12 * kPerDecade + 2;

  std::vector<int64_t> counts = std::vector<int64_t>(kBins, 0);

  static int bin_of(double x);
  static double lower_edge(int bin);  // 0 for bin 0
  static double upper_edge(int bin);  // +inf for the last bin
  void add(double x) { ++counts[bin_of(x)]; }
  void merge(const LogHistogram& o);
  int64_t total() const;
  // The q-quantile (0 < q <= 1), interpolated log-linearly inside the bin that holds it (by the
  // rank's position among that bin's counts); 0 when empty or in bin 0, kHi in the last bin.
  // Never above `max` (the largest value recorded, when the caller knows it: a bin's upper edge
  // can lie above every value in it). Percentiles are derived from the histogram (and the max)
  // only, so merged reports give the same percentiles.
  double quantile(double q, double max = std::numeric_limits<double>::infinity()) const;
  bool operator==(const LogHistogram&) const = default;
};

// One of the worst cases of a (backend, property): enough to regenerate and rerun it.
struct WorstCase {
  uint64_t seed = 0, case_index = 0;
  bool failed = false;
  bool nonfinite_mismatch = false;  // ranked above every finite tightness
  double tightness = 0, max_abs = 0;
  std::string detail, shape, repro;
  bool operator==(const WorstCase&) const = default;
};

// A plotted point, sampled by `key` (bottom-k over hash(seed, case index)).
struct Sample {
  uint64_t key = 0, seed = 0, case_index = 0;
  double out_max_ref = 0, max_abs = 0, tightness = 0;
  int32_t topk = 0, page_size = 0;
  bool failed = false;
  bool operator==(const Sample&) const = default;
};

// Statistics of one property on one backend (or backend pair, "cuda-mma|cuda-simt").
struct PropertyStats {
  static constexpr size_t kWorst = 5;
  static constexpr size_t kSamples = 256;

  std::string backend, property;
  int64_t cases = 0;              // outcomes recorded
  int64_t not_applicable = 0;     // outcomes switched off by design
  int64_t failures = 0;           // applicable outcomes that failed
  int64_t flashmla_failures = 0;  // FlashMLA's fixed-tolerance check failed (reported only)
  double max_abs = 0, sum_mean_abs = 0, max_rel = 0, max_cos_diff = 0, lse_max_abs = 0;
  double max_tightness = 0;          // over finite elements
  int64_t nonfinite_mismatches = 0;  // outcomes with a non-finite position mismatch
  LogHistogram tightness;            // applicable outcomes only
  std::vector<WorstCase> worst;
  std::vector<Sample> samples;

  int64_t applicable() const { return cases - not_applicable; }
  double mean_abs() const { return applicable() > 0 ? sum_mean_abs / applicable() : 0; }
  // Inserts keeping the kWorst worst (failed first, then non-finite mismatches, then tightness,
  // then smaller index).
  void add_worst(const WorstCase& w);
  // Whether add_worst would keep w (judged on failed, tightness, max_abs, seed, case_index).
  bool would_keep(const WorstCase& w) const;
  void add_sample(const Sample& s);
  void merge(const PropertyStats& o);
};

// What one shard (one `mlafuzz fuzz` process) ran.
struct ShardRun {
  int32_t index = 0, count = 1;
  std::string host, commit, start, end, stop_reason;
  double duration_s = 0;
  int64_t cases = 0;
  // Completed case numbers of this shard as half-open ranges [lo, hi); global case index of
  // case number n is n * count + index.
  std::vector<std::pair<uint64_t, uint64_t>> case_ranges;
};

// A device that evaluated cases: "cpu" (in-process backends) or "cuda:N" (a worker pinned to
// GPU N), with the cases that went through it.
struct DeviceCount {
  std::string label, name;
  int64_t cases = 0;
};

struct Report {
  int version = kReportVersion;  // of the file it was read from (kReportVersion when made here)
  bool complete = false;         // false: a periodic snapshot of a campaign still running
  uint64_t seed = 0;
  std::string profile = "default";
  std::vector<std::string> backends, properties;
  std::string commit, host;
  std::string gpu_name = "none", driver_version = "none", cuda_version = "none";
  std::string start, end, stop_reason;
  double duration_s = 0;
  int64_t cases = 0;
  double cases_per_s = 0;
  double eval_seconds = 0, oracle_seconds = 0;  // summed over cases (CPU time of evaluation)
  TimeBreakdown time_breakdown;  // worker calls per backend and where their time went
  CaseBreakdown case_breakdown;  // the cases' evaluation steps and where their time went
  std::vector<ShardRun> shards;
  std::vector<DeviceCount> devices;
  std::map<std::string, int64_t> tags;
  std::vector<PropertyStats> results;  // sorted by (backend, property)
  std::vector<Finding> findings;       // one per group, sorted by signature
  // What the reader must know about how the run went ("0 case(s) completed in 20 s: the
  // backends were too slow or hung"); merged: every shard's.
  std::vector<std::string> warnings;

  PropertyStats& stats(const std::string& backend, const std::string& property);
  const PropertyStats* find_stats(const std::string& backend, const std::string& property) const;
  int64_t total_failures() const;
};

// Command that regenerates one case of a campaign and reruns it:
// "<this mlafuzz> fuzz --seed S --replay-index K [--profile P] --backends B --properties P"
// (command_to_run_again, core/command.h).
std::string replay_command(uint64_t seed, uint64_t case_index, const std::string& profile,
                           const std::string& backend, const std::string& property);

// Sampling key of a case (bottom-k sampling is order-independent, hence mergeable).
uint64_t sample_key(uint64_t seed, uint64_t case_index);

nlohmann::ordered_json report_to_json(const Report& r);
// Strict: unknown format or version, missing or mistyped fields raise ReportError naming them.
Report report_from_json(const nlohmann::ordered_json& j, const std::string& source);
Report load_report(const std::string& path);
// Writes report.json atomically.
void save_report(const Report& r, const std::string& path);

// Combines shard reports (sums, merged histograms, worst lists, samples, findings, tags,
// devices, shard lists). Findings merge by group signature: the same bug found by two shards is
// one finding whose counts and raw failure classes add, represented by its earliest case.
// Raises ReportError when the reports cannot be combined (different profiles, overlapping shards
// of one seed).
Report merge_reports(const std::vector<Report>& reports);

// Equality of everything that describes the cases (results, tags, findings' signatures and
// counts), ignoring metadata (times, hosts, shard lists, devices). Sums of floating values are
// compared with a relative tolerance of 1e-9 (they are added in a different order). Returns a
// description of the first difference, or "" when equal.
std::string statistics_difference(const Report& a, const Report& b);

// ---- Comparison of two nights ----
struct CompareOptions {
  double factor = 2.0;         // worst tightness up by more than this factor is a regression
  double min_tightness = 0.1;  // ...when the new worst tightness is at least this
};
struct Comparison {
  bool regression = false;
  std::string text;  // human-readable, one change per line
};
// Findings compare by group signature: a group of NEW that OLD lacks is a regression ("new"), one
// both hold is "still open", one only OLD holds is "gone". Against a version-1 OLD report (its
// findings ungrouped), a NEW group is still open when OLD has a finding of its backend and one
// of its properties.
Comparison compare_reports(const Report& old_r, const Report& new_r, const CompareOptions& opt);

// ---- Renderings ----
// Every rendering leads with the findings, one per bug: signature, causes, where it fails, the
// properties that fail on its minimal case, the raw failures it folds, its first case and the
// command that reproduces it. JUnit: one failing test case per finding; the per-property test
// cases carry the statistics and fail only for failures no finding holds.
std::string render_junit(const Report& r);
// Self-contained HTML: inline CSS and SVG drawn here; no script, no external reference.
std::string render_html(const Report& r);
// Short plain-text summary for the terminal.
std::string render_summary(const Report& r);

// The tag list grouped for reading: one family per tag prefix before '=' ("page_size=61" is value
// "61" of family "page_size"); tags without '=' ("has_invalid", "sink") are values of the family
// "flags". Families in name order; each family's values most frequent first (ties by name), the
// first `top` kept and the rest counted in `others`/`other_count`.
struct TagFamily {
  std::string family;
  std::vector<std::pair<std::string, int64_t>> values;  // the top values and their counts
  int64_t others = 0;                                   // values left out
  int64_t other_count = 0;                              // their counts summed
};
std::vector<TagFamily> group_tags(const std::map<std::string, int64_t>& tags, size_t top);

}  // namespace mlafuzz::campaign
