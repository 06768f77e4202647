// Report model: statistics and merging (the JSON form is report_json.cc).
#include "harness/campaign/report.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/case.h"
#include "core/command.h"
#include "core/fileio.h"
#include "core/rng.h"
#include "properties/property_table.h"

namespace mlafuzz::campaign {

using Json = nlohmann::ordered_json;

// ---------------------------------------------------------------------------------------------
// LogHistogram
// ---------------------------------------------------------------------------------------------

int LogHistogram::bin_of(double x) {
  if (std::isnan(x) || x >= kHi) return kBins - 1;
  if (!(x >= kLo)) return 0;
  // Decades above kLo, kPerDecade bins each. log10 is monotone; a value exactly on an edge may
  // land on either side of it, the same way in every report of one build.
  const int b = 1 + static_cast<int>(std::floor(std::log10(x / kLo) * kPerDecade));
  return std::clamp(b, 1, kBins - 2);
}

double LogHistogram::lower_edge(int bin) {
  if (bin <= 0) return 0;
  return kLo * std::pow(10.0, static_cast<double>(bin - 1) / kPerDecade);
}

double LogHistogram::upper_edge(int bin) {
  if (bin >= kBins - 1) return std::numeric_limits<double>::infinity();
  return kLo * std::pow(10.0, static_cast<double>(bin) / kPerDecade);
}

void LogHistogram::merge(const LogHistogram& o) {
  for (int i = 0; i < kBins; ++i) counts[i] += o.counts[i];
}

int64_t LogHistogram::total() const {
  int64_t t = 0;
  for (int64_t c : counts) t += c;
  return t;
}

double LogHistogram::quantile(double q, double max) const {
  const int64_t n = total();
  if (n == 0) return 0;
  const int64_t rank = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(q * n)));
  int64_t seen = 0;
  double v = kHi;
  for (int i = 0; i < kBins; ++i) {
    if (seen + counts[i] >= rank) {
      if (i == 0) {
        v = 0;
      } else if (i < kBins - 1) {
        // The rank's place among the bin's values, spread evenly on the log scale.
        const double f = static_cast<double>(rank - seen) / static_cast<double>(counts[i]);
        v = lower_edge(i) * std::pow(upper_edge(i) / lower_edge(i), f);
      }
      break;
    }
    seen += counts[i];
  }
  return std::min(v, max);
}

// ---------------------------------------------------------------------------------------------
// PropertyStats
// ---------------------------------------------------------------------------------------------

namespace {

// Total order of worst cases: failed first, non-finite mismatches, larger tightness, larger
// error, smaller seed/index.
bool worse(const WorstCase& a, const WorstCase& b) {
  if (a.failed != b.failed) return a.failed;
  if (a.nonfinite_mismatch != b.nonfinite_mismatch) return a.nonfinite_mismatch;
  if (a.tightness != b.tightness) return a.tightness > b.tightness;
  if (a.max_abs != b.max_abs) return a.max_abs > b.max_abs;
  if (a.seed != b.seed) return a.seed < b.seed;
  if (a.case_index != b.case_index) return a.case_index < b.case_index;
  return std::tie(a.detail, a.shape, a.repro) < std::tie(b.detail, b.shape, b.repro);
}

// Total orders (ties broken on every field), so that merged lists never depend on the merge
// order, even when two reports hold the same case.
bool sample_before(const Sample& a, const Sample& b) {
  return std::tie(a.key, a.seed, a.case_index, a.max_abs, a.tightness, a.out_max_ref, a.topk,
                  a.page_size, a.failed) < std::tie(b.key, b.seed, b.case_index, b.max_abs,
                                                    b.tightness, b.out_max_ref, b.topk, b.page_size,
                                                    b.failed);
}

// NaN-proof max (a NaN error counts as the largest possible value).
double max_of(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::infinity();
  return std::max(a, b);
}

}  // namespace

bool PropertyStats::would_keep(const WorstCase& w) const {
  return worst.size() < kWorst || worse(w, worst.back());
}

void PropertyStats::add_worst(const WorstCase& w) {
  auto it = std::lower_bound(worst.begin(), worst.end(), w, worse);
  if (static_cast<size_t>(it - worst.begin()) >= kWorst) return;
  worst.insert(it, w);
  if (worst.size() > kWorst) worst.pop_back();
}

void PropertyStats::add_sample(const Sample& s) {
  auto it = std::lower_bound(samples.begin(), samples.end(), s, sample_before);
  if (static_cast<size_t>(it - samples.begin()) >= kSamples) return;
  samples.insert(it, s);
  if (samples.size() > kSamples) samples.pop_back();
}

void PropertyStats::merge(const PropertyStats& o) {
  cases += o.cases;
  not_applicable += o.not_applicable;
  failures += o.failures;
  flashmla_failures += o.flashmla_failures;
  max_abs = max_of(max_abs, o.max_abs);
  sum_mean_abs += o.sum_mean_abs;
  max_rel = max_of(max_rel, o.max_rel);
  max_cos_diff = max_of(max_cos_diff, o.max_cos_diff);
  lse_max_abs = max_of(lse_max_abs, o.lse_max_abs);
  max_tightness = max_of(max_tightness, o.max_tightness);
  nonfinite_mismatches += o.nonfinite_mismatches;
  tightness.merge(o.tightness);
  for (const auto& w : o.worst) add_worst(w);
  for (const auto& s : o.samples) add_sample(s);
}

// ---------------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------------

PropertyStats& Report::stats(const std::string& backend, const std::string& property) {
  auto it =
      std::lower_bound(results.begin(), results.end(), std::pair(backend, property),
                       [](const PropertyStats& s, const std::pair<std::string, std::string>& k) {
                         return std::tie(s.backend, s.property) < std::tie(k.first, k.second);
                       });
  if (it != results.end() && it->backend == backend && it->property == property) return *it;
  PropertyStats s;
  s.backend = backend;
  s.property = property;
  return *results.insert(it, std::move(s));
}

const PropertyStats* Report::find_stats(const std::string& backend,
                                        const std::string& property) const {
  for (const auto& s : results) {
    if (s.backend == backend && s.property == property) return &s;
  }
  return nullptr;
}

int64_t Report::total_failures() const {
  int64_t n = 0;
  for (const auto& s : results) n += s.failures;
  return n;
}

std::string replay_command(uint64_t seed, uint64_t case_index, const std::string& profile,
                           const std::string& backend, const std::string& property) {
  std::ostringstream os;
  os << command_to_run_again() << " fuzz --seed " << seed << " --replay-index " << case_index;
  if (profile != "default") os << " --profile " << profile;
  // A pair "cuda-mma|cuda-simt" runs both backends.
  std::string b = backend;
  std::replace(b.begin(), b.end(), '|', ',');
  os << " --backends " << shell_word(b) << " --properties " << property;
  return os.str();
}

uint64_t sample_key(uint64_t seed, uint64_t case_index) {
  return splitmix64(splitmix64(seed) ^ splitmix64(case_index ^ 0x5a17e5a17e5a17e5ull));
}

// ---------------------------------------------------------------------------------------------
// Merge
// ---------------------------------------------------------------------------------------------

namespace {

// Global case indices covered by a shard, as a set of (count, index, range) for overlap checks.
bool shards_overlap(const ShardRun& a, const ShardRun& b) {
  // Global index g = n * count + index. Two shards of the same count overlap only if they are
  // the same shard and their case-number ranges intersect; shards of different counts may
  // overlap in general: check the ranges exhaustively when small, else conservatively by
  // comparing index residues with gcd.
  if (a.count == b.count) {
    if (a.index != b.index) return false;
    for (const auto& [alo, ahi] : a.case_ranges) {
      for (const auto& [blo, bhi] : b.case_ranges) {
        if (std::max(alo, blo) < std::min(ahi, bhi)) return true;
      }
    }
    return false;
  }
  std::set<uint64_t> seen;
  uint64_t budget = 1u << 20;
  for (const auto& [lo, hi] : a.case_ranges) {
    for (uint64_t n = lo; n < hi && budget > 0; ++n, --budget) seen.insert(n * a.count + a.index);
  }
  for (const auto& [lo, hi] : b.case_ranges) {
    for (uint64_t n = lo; n < hi && budget > 0; ++n, --budget) {
      if (seen.count(n * b.count + b.index)) return true;
    }
  }
  return false;
}

// Refuses to merge two reports that hold the same cases (they would be counted twice).
void check_no_repeated_shards(const std::vector<Report>& reports) {
  const Report& first = reports.front();
  std::vector<std::pair<uint64_t, const ShardRun*>> seen_shards;  // (seed, shard) seen so far
  for (size_t i = 0; i < reports.size(); ++i) {
    const Report& r = reports[i];
    if (r.profile != first.profile) {
      throw ReportError("report " + std::to_string(i + 1) + " uses profile '" + r.profile +
                        "' but report 1 uses '" + first.profile + "'");
    }
    for (const auto& s : r.shards) {
      for (const auto& [seed, other] : seen_shards) {
        if (seed == r.seed && shards_overlap(s, *other)) {
          throw ReportError("report " + std::to_string(i + 1) + " (seed " + std::to_string(r.seed) +
                            ", shard " + std::to_string(s.index) + "/" + std::to_string(s.count) +
                            ") repeats cases of an earlier report; merging would count them twice");
        }
      }
      seen_shards.emplace_back(r.seed, &s);
    }
  }
}

// One group over every report: counts add, raw failure classes and corpus entries gather, the
// failing properties unite, and the representative is the earliest case (deterministic whatever
// the merge order).
void merge_finding(std::map<std::string, Finding>& findings, const Finding& f) {
  auto it = findings.find(f.signature);
  if (it == findings.end()) {
    Finding nf = f;
    if (nf.corpus_entries.empty() && !nf.corpus_path.empty()) {
      nf.corpus_entries.push_back(nf.corpus_path);
    }
    findings.emplace(f.signature, std::move(nf));
    return;
  }
  Finding& e = it->second;
  e.count += f.count;
  for (const auto& p : f.corpus_entries) e.corpus_entries.push_back(p);
  if (f.corpus_entries.empty() && !f.corpus_path.empty()) e.corpus_entries.push_back(f.corpus_path);
  for (const auto& p : f.properties) {
    if (std::find(e.properties.begin(), e.properties.end(), p) == e.properties.end()) {
      e.properties.push_back(p);
    }
  }
  for (const RawFailure& r : f.raw) {
    auto same = std::find_if(e.raw.begin(), e.raw.end(), [&](const RawFailure& x) {
      return x.property == r.property && x.shape_class == r.shape_class;
    });
    if (same == e.raw.end()) {
      e.raw.push_back(r);
      continue;
    }
    same->count += r.count;
    if (std::tie(r.seed, r.case_index) < std::tie(same->seed, same->case_index)) {
      same->seed = r.seed;
      same->case_index = r.case_index;
      same->repro = r.repro;
    }
  }
  if (std::tie(f.seed, f.case_index) < std::tie(e.seed, e.case_index)) {
    e.seed = f.seed;
    e.case_index = f.case_index;
    e.property = f.property;
    e.tightness = f.tightness;
    e.nonfinite_mismatch = f.nonfinite_mismatch;
    e.shrunk = f.shrunk;
    e.summary = f.summary;
    e.locus = f.locus;
    e.inputs = f.inputs;
    e.shape_class = f.shape_class;
    e.corpus_path = f.corpus_path;
    e.repro = f.repro;
  }
}

// The values of a set joined by `sep`.
std::string joined(const std::set<std::string>& values, const char* sep) {
  std::string out;
  for (const auto& v : values) out += (out.empty() ? "" : sep) + v;
  return out;
}

// What differs between the merged reports' metadata, gathered as the reports go by.
struct MergeSets {
  std::set<std::string> backends, properties, hosts, commits, reasons;
  std::map<std::string, DeviceCount> devices;  // devices of different hosts are different
  std::map<std::string, Finding> findings;
};

// Adds one report's campaign figures (times, counts, devices) to `m` and `sets`.
void merge_campaign(Report& m, MergeSets& sets, const Report& r, bool many_hosts) {
  m.complete = m.complete && r.complete;
  sets.backends.insert(r.backends.begin(), r.backends.end());
  sets.properties.insert(r.properties.begin(), r.properties.end());
  sets.hosts.insert(r.host);
  sets.commits.insert(r.commit);
  sets.reasons.insert(r.stop_reason);
  if (r.gpu_name != "none") {
    m.gpu_name = r.gpu_name;
    m.driver_version = r.driver_version;
    m.cuda_version = r.cuda_version;
  }
  m.start = std::min(m.start, r.start);
  m.end = std::max(m.end, r.end);
  m.duration_s = std::max(m.duration_s, r.duration_s);
  m.cases += r.cases;
  m.cases_per_s += r.cases_per_s;  // shards run side by side: throughputs add
  m.eval_seconds += r.eval_seconds;
  m.oracle_seconds += r.oracle_seconds;
  merge_time_breakdown(m.time_breakdown, r.time_breakdown);
  m.case_breakdown.cases += r.case_breakdown.cases;
  m.case_breakdown.steps += r.case_breakdown.steps;
  m.warnings.insert(m.warnings.end(), r.warnings.begin(), r.warnings.end());
  for (const auto& s : r.shards) m.shards.push_back(s);
  for (const auto& d : r.devices) {
    const std::string key = many_hosts ? r.host + "/" + d.label : d.label;
    auto& dc = sets.devices[key];
    dc.label = key;
    dc.name = d.name;
    dc.cases += d.cases;
  }
}

// Writes the gathered sets into the merged report.
void finish_merge(Report& m, MergeSets& sets) {
  m.backends.assign(sets.backends.begin(), sets.backends.end());
  m.properties.assign(sets.properties.begin(), sets.properties.end());
  if (sets.hosts.size() > 1) m.host = std::to_string(sets.hosts.size()) + " hosts";
  if (sets.commits.size() > 1) m.commit = joined(sets.commits, ",");
  m.stop_reason = joined(sets.reasons, ",");
  for (auto& [k, d] : sets.devices) m.devices.push_back(d);
  for (auto& [k, f] : sets.findings) {
    std::sort(f.corpus_entries.begin(), f.corpus_entries.end());
    f.corpus_entries.erase(std::unique(f.corpus_entries.begin(), f.corpus_entries.end()),
                           f.corpus_entries.end());
    // The properties in table order, the raw classes by their first case: the same lists
    // whatever the merge order.
    sort_properties(f.properties);
    std::sort(f.raw.begin(), f.raw.end(), [](const RawFailure& a, const RawFailure& b) {
      return std::tie(a.seed, a.case_index, a.property, a.shape_class) <
             std::tie(b.seed, b.case_index, b.property, b.shape_class);
    });
    m.findings.push_back(std::move(f));
  }
  std::sort(m.shards.begin(), m.shards.end(), [](const ShardRun& a, const ShardRun& b) {
    return std::tie(a.count, a.index, a.start) < std::tie(b.count, b.index, b.start);
  });
}

}  // namespace

Report merge_reports(const std::vector<Report>& reports) {
  if (reports.empty()) throw ReportError("nothing to merge");
  check_no_repeated_shards(reports);
  const Report& first = reports.front();
  Report m;
  m.complete = true;
  m.seed = first.seed;
  m.profile = first.profile;
  m.commit = first.commit;
  m.host = first.host;
  m.gpu_name = first.gpu_name;
  m.driver_version = first.driver_version;
  m.cuda_version = first.cuda_version;
  m.start = first.start;
  m.end = first.end;
  bool many_hosts = false;
  for (const auto& r : reports) many_hosts = many_hosts || r.host != first.host;
  MergeSets sets;
  for (const Report& r : reports) {
    merge_campaign(m, sets, r, many_hosts);
    for (const auto& [k, v] : r.tags) m.tags[k] += v;
    for (const auto& s : r.results) m.stats(s.backend, s.property).merge(s);
    for (const auto& f : r.findings) merge_finding(sets.findings, f);
  }
  finish_merge(m, sets);
  return m;
}

std::string statistics_difference(const Report& a, const Report& b) {
  auto close = [](double x, double y) {
    if (x == y || (std::isnan(x) && std::isnan(y))) return true;
    return std::fabs(x - y) <= 1e-9 * std::max(std::fabs(x), std::fabs(y));
  };
  if (a.cases != b.cases) {
    return "cases " + std::to_string(a.cases) + " vs " + std::to_string(b.cases);
  }
  if (a.tags != b.tags) return "tag counts differ";
  if (a.results.size() != b.results.size()) return "different (backend, property) sets";
  for (size_t i = 0; i < a.results.size(); ++i) {
    const PropertyStats& x = a.results[i];
    const PropertyStats& y = b.results[i];
    const std::string who = x.backend + "/" + x.property + ": ";
    if (x.backend != y.backend || x.property != y.property) {
      return "results[" + std::to_string(i) + "]: " + x.backend + "/" + x.property + " vs " +
             y.backend + "/" + y.property;
    }
    if (x.cases != y.cases || x.not_applicable != y.not_applicable || x.failures != y.failures ||
        x.flashmla_failures != y.flashmla_failures ||
        x.nonfinite_mismatches != y.nonfinite_mismatches) {
      return who + "counts differ";
    }
    if (!(x.max_abs == y.max_abs || (std::isnan(x.max_abs) && std::isnan(y.max_abs))) ||
        x.max_rel != y.max_rel || x.max_cos_diff != y.max_cos_diff ||
        x.lse_max_abs != y.lse_max_abs || x.max_tightness != y.max_tightness) {
      return who + "maxima differ";
    }
    if (!close(x.sum_mean_abs, y.sum_mean_abs)) return who + "mean_abs differs";
    if (!(x.tightness == y.tightness)) return who + "tightness histograms differ";
    if (x.worst.size() != y.worst.size()) return who + "worst lists differ in length";
    for (size_t k = 0; k < x.worst.size(); ++k) {
      if (x.worst[k].case_index != y.worst[k].case_index || x.worst[k].seed != y.worst[k].seed ||
          x.worst[k].tightness != y.worst[k].tightness ||
          x.worst[k].nonfinite_mismatch != y.worst[k].nonfinite_mismatch) {
        return who + "worst[" + std::to_string(k) + "] differs (case " +
               std::to_string(x.worst[k].case_index) + " vs " +
               std::to_string(y.worst[k].case_index) + ")";
      }
    }
    if (!(x.samples == y.samples)) return who + "samples differ";
  }
  if (a.findings.size() != b.findings.size()) {
    return "findings: " + std::to_string(a.findings.size()) + " vs " +
           std::to_string(b.findings.size()) + " signatures";
  }
  for (size_t i = 0; i < a.findings.size(); ++i) {
    if (a.findings[i].signature != b.findings[i].signature ||
        a.findings[i].count != b.findings[i].count) {
      return "finding " + a.findings[i].signature + " (count " +
             std::to_string(a.findings[i].count) + ") vs " + b.findings[i].signature + " (count " +
             std::to_string(b.findings[i].count) + ")";
    }
  }
  return "";
}

}  // namespace mlafuzz::campaign
