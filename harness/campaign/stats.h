// The campaign's statistics: per (backend, property) figures, tags, which case numbers are done,
// cases per device and evaluation time. Thread-safe; record() is called once per case.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "harness/campaign/plan.h"
#include "harness/campaign/report.h"
#include "properties/evaluate.h"

namespace mlafuzz::campaign {

class CampaignStats {
 public:
  CampaignStats(uint64_t seed, std::string profile) : seed_(seed), profile_(std::move(profile)) {}

  // Case number `case_number` (global index `index`) was evaluated on `device` (-1: in process).
  void record(uint64_t case_number, uint64_t index, const Case& c,
              const std::vector<std::string>& tags, const CaseEvaluation& ev, const Faults& faults,
              int device);
  // Case number `case_number` could not be evaluated (a generator or evaluation bug).
  void record_error(uint64_t case_number);
  // Starts from the statistics of an earlier run of this shard (--resume): `r` is its report,
  // `shard` its ShardRun, whose case ranges are done. Throws ReportError when they disagree
  // with its case count.
  void restore(const Report& r, const ShardRun& shard);
  // Whether case number `case_number` is done (recorded, or restored).
  bool done(uint64_t case_number) const;

  struct Totals {
    int64_t cases = 0, failing_outcomes = 0, case_errors = 0;
    double worst_tightness = 0;       // over the properties with error figures
    bool nonfinite_mismatch = false;  // any of them had a non-finite position mismatch
  };
  Totals totals() const;

  // Fills the report's statistics (results, tags, cases, times) and the shard's case figures.
  void fill(Report& r, ShardRun& shard) const;
  int64_t device_cases(int device) const;

 private:
  void mark_done(uint64_t case_number);  // caller holds mu_
  void add_outcome(const PropertyOutcome& o, uint64_t index, const Case& c, const Faults& faults,
                   std::string& shape);  // caller holds mu_

  const uint64_t seed_;
  const std::string profile_;
  mutable std::mutex mu_;  // guards everything below
  Report acc_;             // results, tags
  std::map<int, int64_t> device_cases_;
  uint64_t done_prefix_ = 0;      // case numbers [0, done_prefix_) are done
  std::set<uint64_t> done_rest_;  // and these
  int64_t done_ = 0;
  double eval_seconds_ = 0, oracle_seconds_ = 0;
  CaseBreakdown case_breakdown_;
  int64_t failing_outcomes_ = 0, case_errors_ = 0;
};

}  // namespace mlafuzz::campaign
