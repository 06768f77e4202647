#include "harness/campaign/stats.h"

#include <algorithm>
#include <cmath>

namespace mlafuzz::campaign {

void CampaignStats::mark_done(uint64_t case_number) {
  ++done_;
  if (case_number == done_prefix_) {
    ++done_prefix_;
    while (!done_rest_.empty() && *done_rest_.begin() == done_prefix_) {
      done_rest_.erase(done_rest_.begin());
      ++done_prefix_;
    }
  } else {
    done_rest_.insert(case_number);
  }
}

void CampaignStats::record(uint64_t case_number, uint64_t index, const Case& c,
                           const std::vector<std::string>& tags, const CaseEvaluation& ev,
                           const Faults& faults, int device) {
  std::lock_guard<std::mutex> lock(mu_);
  mark_done(case_number);
  ++device_cases_[device];
  eval_seconds_ += ev.seconds;
  oracle_seconds_ += ev.oracle_seconds;
  ++case_breakdown_.cases;
  case_breakdown_.steps += ev.steps;
  for (const auto& tag : tags) ++acc_.tags[tag];
  std::string shape;  // computed once, only if a worst list takes it
  for (const auto& o : ev.outcomes) add_outcome(o, index, c, faults, shape);
}

void CampaignStats::add_outcome(const PropertyOutcome& o, uint64_t index, const Case& c,
                                const Faults& faults, std::string& shape) {
  PropertyStats& s = acc_.stats(o.backend, o.property);
  ++s.cases;
  if (!o.applicable) {
    ++s.not_applicable;
    return;
  }
  const bool failed = !o.passed;
  if (failed) {
    ++s.failures;
    ++failing_outcomes_;
  }
  if (o.property == "tolerance" && !o.flashmla_pass) ++s.flashmla_failures;
  s.max_abs = std::isnan(o.max_abs) ? INFINITY : std::max(s.max_abs, o.max_abs);
  s.sum_mean_abs += std::isfinite(o.mean_abs) ? o.mean_abs : 0;
  s.max_rel = std::isnan(o.max_rel) ? INFINITY : std::max(s.max_rel, o.max_rel);
  s.max_cos_diff = std::isnan(o.cos_diff) ? INFINITY : std::max(s.max_cos_diff, o.cos_diff);
  s.lse_max_abs = std::isnan(o.lse_max_abs) ? INFINITY : std::max(s.lse_max_abs, o.lse_max_abs);
  s.max_tightness = std::isnan(o.tightness) ? INFINITY : std::max(s.max_tightness, o.tightness);
  s.tightness.add(o.tightness);
  if (o.nonfinite_mismatch) ++s.nonfinite_mismatches;
  WorstCase w;
  w.seed = seed_;
  w.case_index = index;
  w.failed = failed;
  w.nonfinite_mismatch = o.nonfinite_mismatch;
  w.tightness = o.tightness;
  w.max_abs = o.max_abs;
  if (s.would_keep(w)) {
    if (shape.empty()) shape = shape_class(c);
    w.shape = shape;
    w.detail = o.detail;
    if (o.property == "run" && faults.count(o.backend)) w.detail = faults.at(o.backend);
    w.repro = replay_command(seed_, index, profile_, o.backend, o.property);
    s.add_worst(w);
  }
  if (has_error_figures(o.property)) {
    s.add_sample(Sample{.key = sample_key(seed_, index),
                        .seed = seed_,
                        .case_index = index,
                        .out_max_ref = o.out_max_ref,
                        .max_abs = o.max_abs,
                        .tightness = o.tightness,
                        .topk = c.topk,
                        .page_size = c.geom.page_size,
                        .failed = failed});
  }
}

void CampaignStats::record_error(uint64_t case_number) {
  std::lock_guard<std::mutex> lock(mu_);
  mark_done(case_number);
  ++case_errors_;
}

void CampaignStats::restore(const Report& r, const ShardRun& shard) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t in_ranges = 0;
  for (const auto& [lo, hi] : shard.case_ranges) {
    in_ranges += static_cast<int64_t>(hi - lo);
    for (uint64_t n = lo; n < hi; ++n) mark_done(n);
  }
  if (in_ranges != r.cases || done_ != r.cases) {
    throw ReportError("its case ranges hold " + std::to_string(in_ranges) +
                      " case(s) but it counts " + std::to_string(r.cases));
  }
  acc_.results = r.results;
  acc_.tags = r.tags;
  eval_seconds_ = r.eval_seconds;
  oracle_seconds_ = r.oracle_seconds;
  case_breakdown_ = r.case_breakdown;
  failing_outcomes_ = r.total_failures();
  case_errors_ = std::max<int64_t>(0, r.cases - r.case_breakdown.cases);
  for (const auto& d : r.devices) {
    if (d.label == "cpu") {
      device_cases_[-1] += d.cases;
    } else if (d.label.rfind("cuda:", 0) == 0) {
      device_cases_[std::stoi(d.label.substr(5))] += d.cases;
    }
  }
}

bool CampaignStats::done(uint64_t case_number) const {
  std::lock_guard<std::mutex> lock(mu_);
  return case_number < done_prefix_ || done_rest_.count(case_number) > 0;
}

CampaignStats::Totals CampaignStats::totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  Totals t{.cases = done_, .failing_outcomes = failing_outcomes_, .case_errors = case_errors_};
  for (const auto& s : acc_.results) {
    if (!has_error_figures(s.property)) continue;
    t.worst_tightness = std::max(t.worst_tightness, s.max_tightness);
    t.nonfinite_mismatch = t.nonfinite_mismatch || s.nonfinite_mismatches > 0;
  }
  return t;
}

void CampaignStats::fill(Report& r, ShardRun& shard) const {
  std::lock_guard<std::mutex> lock(mu_);
  r.results = acc_.results;
  r.tags = acc_.tags;
  r.cases = done_;
  r.eval_seconds = eval_seconds_;
  r.oracle_seconds = oracle_seconds_;
  r.case_breakdown = case_breakdown_;
  shard.cases = done_;
  shard.case_ranges.clear();
  if (done_prefix_ > 0) shard.case_ranges.emplace_back(0, done_prefix_);
  for (uint64_t n : done_rest_) {
    if (!shard.case_ranges.empty() && shard.case_ranges.back().second == n) {
      ++shard.case_ranges.back().second;
    } else {
      shard.case_ranges.emplace_back(n, n + 1);
    }
  }
}

int64_t CampaignStats::device_cases(int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = device_cases_.find(device);
  return it == device_cases_.end() ? 0 : it->second;
}

}  // namespace mlafuzz::campaign
