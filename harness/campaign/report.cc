// Report model: statistics, JSON (schema "mlafuzz-report" v1), merging.
#include "harness/campaign/report.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "harness/core/case.h"
#include "harness/core/fileio.h"
#include "harness/core/rng.h"

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

double LogHistogram::quantile(double q) const {
  const int64_t n = total();
  if (n == 0) return 0;
  const int64_t rank = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(q * n)));
  int64_t seen = 0;
  for (int i = 0; i < kBins; ++i) {
    seen += counts[i];
    if (seen >= rank) return i == 0 ? 0 : upper_edge(i);
  }
  return upper_edge(kBins - 1);
}

// ---------------------------------------------------------------------------------------------
// PropertyStats
// ---------------------------------------------------------------------------------------------

namespace {

// Total order of worst cases: failed first, larger tightness, larger error, smaller seed/index.
bool worse(const WorstCase& a, const WorstCase& b) {
  if (a.failed != b.failed) return a.failed;
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
  os << "mlafuzz fuzz --seed " << seed << " --replay-index " << case_index;
  if (profile != "default") os << " --profile " << profile;
  // A pair "cuda-mma|cuda-simt" runs both backends.
  std::string b = backend;
  std::replace(b.begin(), b.end(), '|', ',');
  os << " --backends " << b << " --properties " << property;
  return os.str();
}

uint64_t sample_key(uint64_t seed, uint64_t case_index) {
  return splitmix64(splitmix64(seed) ^ splitmix64(case_index ^ 0x5a17e5a17e5a17e5ull));
}

// ---------------------------------------------------------------------------------------------
// JSON
// ---------------------------------------------------------------------------------------------

namespace {

// JSON has no infinities or NaN: write them as strings, read them back.
Json num(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;
}

Json hist_json(const LogHistogram& h) {
  Json j;
  j["lo"] = LogHistogram::kLo;
  j["hi"] = LogHistogram::kHi;
  j["bins_per_decade"] = LogHistogram::kPerDecade;
  j["counts"] = h.counts;
  return j;
}

Json stats_json(const PropertyStats& s) {
  Json j;
  j["backend"] = s.backend;
  j["property"] = s.property;
  j["cases"] = s.cases;
  j["not_applicable"] = s.not_applicable;
  j["failures"] = s.failures;
  j["flashmla_failures"] = s.flashmla_failures;
  j["max_abs"] = num(s.max_abs);
  j["mean_abs"] = num(s.mean_abs());
  j["sum_mean_abs"] = num(s.sum_mean_abs);
  j["max_rel"] = num(s.max_rel);
  j["cos_diff_max"] = num(s.max_cos_diff);
  j["lse_max_abs"] = num(s.lse_max_abs);
  Json t;
  t["max"] = num(s.max_tightness);
  t["p50"] = num(s.tightness.quantile(0.50));
  t["p90"] = num(s.tightness.quantile(0.90));
  t["p99"] = num(s.tightness.quantile(0.99));
  t["histogram"] = hist_json(s.tightness);
  j["tightness"] = t;
  Json worst = Json::array();
  for (const auto& w : s.worst) {
    Json e;
    e["seed"] = w.seed;
    e["case_index"] = w.case_index;
    e["failed"] = w.failed;
    e["tightness"] = num(w.tightness);
    e["max_abs"] = num(w.max_abs);
    e["shape"] = w.shape;
    e["detail"] = w.detail;
    e["repro"] = w.repro;
    worst.push_back(e);
  }
  j["worst"] = worst;
  Json samples = Json::array();
  // Compact rows: [key, seed, case_index, out_max_ref, max_abs, tightness, topk, page_size,
  // failed]; the order is given in "sample_columns" at the top level.
  for (const auto& p : s.samples) {
    samples.push_back(
        Json::array({std::to_string(p.key), p.seed, p.case_index, num(p.out_max_ref),
                     num(p.max_abs), num(p.tightness), p.topk, p.page_size, p.failed ? 1 : 0}));
  }
  j["samples"] = samples;
  return j;
}

// Strict reader: every access names the JSON path of the field on error.
class Reader {
 public:
  Reader(const Json& j, std::string path) : j_(j), path_(std::move(path)) {}

  const Json& at(const std::string& key) const {
    if (!j_.is_object()) throw ReportError(path_ + ": expected an object");
    auto it = j_.find(key);
    if (it == j_.end()) throw ReportError(child(key) + ": missing");
    return *it;
  }
  Reader sub(const std::string& key) const { return Reader(at(key), child(key)); }
  bool has(const std::string& key) const { return j_.is_object() && j_.contains(key); }
  std::string child(const std::string& key) const {
    return path_.empty() ? key : path_ + "." + key;
  }

  std::string str(const std::string& key) const {
    const Json& v = at(key);
    if (!v.is_string()) throw ReportError(child(key) + ": expected a string");
    return v.get<std::string>();
  }
  int64_t i64(const std::string& key) const {
    const Json& v = at(key);
    if (!v.is_number_integer()) throw ReportError(child(key) + ": expected an integer");
    return v.get<int64_t>();
  }
  uint64_t u64(const std::string& key) const {
    const Json& v = at(key);
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
      throw ReportError(child(key) + ": expected a non-negative integer");
    }
    return v.get<uint64_t>();
  }
  double dbl(const std::string& key) const { return to_double(at(key), child(key)); }
  bool boolean(const std::string& key) const {
    const Json& v = at(key);
    if (!v.is_boolean()) throw ReportError(child(key) + ": expected true or false");
    return v.get<bool>();
  }
  const Json& array(const std::string& key) const {
    const Json& v = at(key);
    if (!v.is_array()) throw ReportError(child(key) + ": expected an array");
    return v;
  }
  std::vector<std::string> strings(const std::string& key) const {
    std::vector<std::string> out;
    const Json& a = array(key);
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].is_string()) {
        throw ReportError(child(key) + "[" + std::to_string(i) + "]: expected a string");
      }
      out.push_back(a[i].get<std::string>());
    }
    return out;
  }

  static double to_double(const Json& v, const std::string& where) {
    if (v.is_number()) return v.get<double>();
    if (v.is_string()) {
      const std::string s = v.get<std::string>();
      if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
      if (s == "inf") return std::numeric_limits<double>::infinity();
      if (s == "-inf") return -std::numeric_limits<double>::infinity();
    }
    throw ReportError(where + ": expected a number (or \"inf\", \"-inf\", \"nan\")");
  }

  const Json& json() const { return j_; }
  const std::string& path() const { return path_; }

 private:
  const Json& j_;
  std::string path_;
};

LogHistogram hist_from(const Reader& r) {
  if (r.dbl("lo") != LogHistogram::kLo || r.dbl("hi") != LogHistogram::kHi ||
      r.i64("bins_per_decade") != LogHistogram::kPerDecade) {
    throw ReportError(r.path() + ": histogram bins differ from this version's fixed bins");
  }
  const Json& c = r.array("counts");
  if (c.size() != static_cast<size_t>(LogHistogram::kBins)) {
    throw ReportError(r.child("counts") + ": expected " + std::to_string(LogHistogram::kBins) +
                      " bins, found " + std::to_string(c.size()));
  }
  LogHistogram h;
  for (int i = 0; i < LogHistogram::kBins; ++i) {
    if (!c[i].is_number_integer() || c[i].get<int64_t>() < 0) {
      throw ReportError(r.child("counts") + "[" + std::to_string(i) +
                        "]: expected a non-negative integer");
    }
    h.counts[i] = c[i].get<int64_t>();
  }
  return h;
}

PropertyStats stats_from(const Reader& r) {
  PropertyStats s;
  s.backend = r.str("backend");
  s.property = r.str("property");
  s.cases = r.i64("cases");
  s.not_applicable = r.i64("not_applicable");
  s.failures = r.i64("failures");
  s.flashmla_failures = r.i64("flashmla_failures");
  s.max_abs = r.dbl("max_abs");
  s.sum_mean_abs = r.dbl("sum_mean_abs");
  s.max_rel = r.dbl("max_rel");
  s.max_cos_diff = r.dbl("cos_diff_max");
  s.lse_max_abs = r.dbl("lse_max_abs");
  const Reader t = r.sub("tightness");
  s.max_tightness = t.dbl("max");
  s.tightness = hist_from(t.sub("histogram"));
  const Json& worst = r.array("worst");
  for (size_t i = 0; i < worst.size(); ++i) {
    const Reader w(worst[i], r.child("worst") + "[" + std::to_string(i) + "]");
    WorstCase c;
    c.seed = w.u64("seed");
    c.case_index = w.u64("case_index");
    c.failed = w.boolean("failed");
    c.tightness = w.dbl("tightness");
    c.max_abs = w.dbl("max_abs");
    c.shape = w.str("shape");
    c.detail = w.str("detail");
    c.repro = w.str("repro");
    s.add_worst(c);
  }
  const Json& samples = r.array("samples");
  for (size_t i = 0; i < samples.size(); ++i) {
    const std::string where = r.child("samples") + "[" + std::to_string(i) + "]";
    const Json& row = samples[i];
    if (!row.is_array() || row.size() != 9 || !row[0].is_string() || !row[1].is_number_unsigned() ||
        !row[2].is_number_unsigned() || !row[6].is_number_integer() ||
        !row[7].is_number_integer() || !row[8].is_number_integer()) {
      throw ReportError(where +
                        ": expected [key, seed, case_index, out_max_ref, max_abs, "
                        "tightness, topk, page_size, failed]");
    }
    Sample p;
    try {
      p.key = std::stoull(row[0].get<std::string>());
    } catch (const std::exception&) {
      throw ReportError(where + "[0]: expected a decimal key");
    }
    p.seed = row[1].get<uint64_t>();
    p.case_index = row[2].get<uint64_t>();
    p.out_max_ref = Reader::to_double(row[3], where + "[3]");
    p.max_abs = Reader::to_double(row[4], where + "[4]");
    p.tightness = Reader::to_double(row[5], where + "[5]");
    p.topk = row[6].get<int32_t>();
    p.page_size = row[7].get<int32_t>();
    p.failed = row[8].get<int>() != 0;
    s.add_sample(p);
  }
  if (s.cases < 0 || s.not_applicable < 0 || s.failures < 0 || s.not_applicable > s.cases ||
      s.failures > s.cases) {
    throw ReportError(r.path() + ": inconsistent counts (cases " + std::to_string(s.cases) +
                      ", not_applicable " + std::to_string(s.not_applicable) + ", failures " +
                      std::to_string(s.failures) + ")");
  }
  return s;
}

}  // namespace

Json report_to_json(const Report& r) {
  Json j;
  j["format"] = kReportFormat;
  j["version"] = kReportVersion;
  j["complete"] = r.complete;
  Json c;
  c["seed"] = r.seed;
  c["profile"] = r.profile;
  c["backends"] = r.backends;
  c["properties"] = r.properties;
  c["commit"] = r.commit;
  c["host"] = r.host;
  c["gpu"] = Json{{"name", r.gpu_name}, {"driver", r.driver_version}, {"cuda", r.cuda_version}};
  c["start"] = r.start;
  c["end"] = r.end;
  c["duration_s"] = num(r.duration_s);
  c["stop_reason"] = r.stop_reason;
  c["cases"] = r.cases;
  c["cases_per_s"] = num(r.cases_per_s);
  c["eval_seconds"] = num(r.eval_seconds);
  c["oracle_seconds"] = num(r.oracle_seconds);
  Json shards = Json::array();
  for (const auto& s : r.shards) {
    Json e;
    e["index"] = s.index;
    e["count"] = s.count;
    e["host"] = s.host;
    e["commit"] = s.commit;
    e["start"] = s.start;
    e["end"] = s.end;
    e["duration_s"] = num(s.duration_s);
    e["stop_reason"] = s.stop_reason;
    e["cases"] = s.cases;
    Json ranges = Json::array();
    for (const auto& [lo, hi] : s.case_ranges) ranges.push_back(Json::array({lo, hi}));
    e["case_ranges"] = ranges;
    shards.push_back(e);
  }
  c["shards"] = shards;
  Json devices = Json::array();
  for (const auto& d : r.devices) {
    devices.push_back(Json{{"label", d.label}, {"name", d.name}, {"cases", d.cases}});
  }
  c["devices"] = devices;
  j["campaign"] = c;
  Json tags = Json::object();
  for (const auto& [k, v] : r.tags) tags[k] = v;
  j["tags"] = tags;
  j["sample_columns"] = Json::array({"key", "seed", "case_index", "out_max_ref", "max_abs",
                                     "tightness", "topk", "page_size", "failed"});
  Json results = Json::array();
  for (const auto& s : r.results) results.push_back(stats_json(s));
  j["results"] = results;
  Json findings = Json::array();
  for (const auto& f : r.findings) {
    Json e;
    e["signature"] = f.signature;
    e["property"] = f.property;
    e["backend"] = f.backend;
    e["shape_class"] = f.shape_class;
    e["count"] = f.count;
    e["seed"] = f.seed;
    e["case_index"] = f.case_index;
    e["tightness"] = num(f.tightness);
    e["shrunk"] = f.shrunk;
    e["detail"] = f.detail;
    e["corpus"] = f.corpus_path;
    e["corpus_entries"] = f.corpus_entries;
    e["repro"] = f.repro;
    findings.push_back(e);
  }
  j["findings"] = findings;
  return j;
}

Report report_from_json(const Json& j, const std::string& source) {
  try {
    const Reader top(j, "");
    if (!j.is_object()) throw ReportError("expected a JSON object");
    if (top.str("format") != kReportFormat) {
      throw ReportError("format: expected \"" + std::string(kReportFormat) + "\", found \"" +
                        top.str("format") + "\"");
    }
    if (top.i64("version") != kReportVersion) {
      throw ReportError("version: " + std::to_string(top.i64("version")) +
                        " is not supported (this build reads version " +
                        std::to_string(kReportVersion) + ")");
    }
    Report r;
    r.complete = top.boolean("complete");
    const Reader c = top.sub("campaign");
    r.seed = c.u64("seed");
    r.profile = c.str("profile");
    r.backends = c.strings("backends");
    r.properties = c.strings("properties");
    r.commit = c.str("commit");
    r.host = c.str("host");
    const Reader g = c.sub("gpu");
    r.gpu_name = g.str("name");
    r.driver_version = g.str("driver");
    r.cuda_version = g.str("cuda");
    r.start = c.str("start");
    r.end = c.str("end");
    r.duration_s = c.dbl("duration_s");
    r.stop_reason = c.str("stop_reason");
    r.cases = c.i64("cases");
    r.cases_per_s = c.dbl("cases_per_s");
    r.eval_seconds = c.dbl("eval_seconds");
    r.oracle_seconds = c.dbl("oracle_seconds");
    const Json& shards = c.array("shards");
    for (size_t i = 0; i < shards.size(); ++i) {
      const Reader s(shards[i], "campaign.shards[" + std::to_string(i) + "]");
      ShardRun sr;
      sr.index = static_cast<int32_t>(s.i64("index"));
      sr.count = static_cast<int32_t>(s.i64("count"));
      if (sr.count < 1 || sr.index < 0 || sr.index >= sr.count) {
        throw ReportError(s.path() + ": shard " + std::to_string(sr.index) + "/" +
                          std::to_string(sr.count) + " is out of range");
      }
      sr.host = s.str("host");
      sr.commit = s.str("commit");
      sr.start = s.str("start");
      sr.end = s.str("end");
      sr.duration_s = s.dbl("duration_s");
      sr.stop_reason = s.str("stop_reason");
      sr.cases = s.i64("cases");
      const Json& ranges = s.array("case_ranges");
      for (size_t k = 0; k < ranges.size(); ++k) {
        const Json& p = ranges[k];
        if (!p.is_array() || p.size() != 2 || !p[0].is_number_unsigned() ||
            !p[1].is_number_unsigned() || p[0].get<uint64_t>() > p[1].get<uint64_t>()) {
          throw ReportError(s.child("case_ranges") + "[" + std::to_string(k) +
                            "]: expected [lo, hi] with lo <= hi");
        }
        sr.case_ranges.emplace_back(p[0].get<uint64_t>(), p[1].get<uint64_t>());
      }
      r.shards.push_back(sr);
    }
    const Json& devices = c.array("devices");
    for (size_t i = 0; i < devices.size(); ++i) {
      const Reader d(devices[i], "campaign.devices[" + std::to_string(i) + "]");
      r.devices.push_back({d.str("label"), d.str("name"), d.i64("cases")});
    }
    const Json& tags = top.at("tags");
    if (!tags.is_object()) throw ReportError("tags: expected an object");
    for (const auto& [k, v] : tags.items()) {
      if (!v.is_number_integer()) throw ReportError("tags." + k + ": expected an integer");
      r.tags[k] = v.get<int64_t>();
    }
    const Json& results = top.array("results");
    for (size_t i = 0; i < results.size(); ++i) {
      PropertyStats s = stats_from(Reader(results[i], "results[" + std::to_string(i) + "]"));
      r.stats(s.backend, s.property) = std::move(s);
    }
    const Json& findings = top.array("findings");
    for (size_t i = 0; i < findings.size(); ++i) {
      const Reader f(findings[i], "findings[" + std::to_string(i) + "]");
      FindingRecord fr;
      fr.signature = f.str("signature");
      fr.property = f.str("property");
      fr.backend = f.str("backend");
      fr.shape_class = f.str("shape_class");
      fr.count = f.i64("count");
      fr.seed = f.u64("seed");
      fr.case_index = f.u64("case_index");
      fr.tightness = f.dbl("tightness");
      fr.shrunk = f.boolean("shrunk");
      fr.detail = f.str("detail");
      fr.corpus_path = f.str("corpus");
      fr.corpus_entries = f.strings("corpus_entries");
      fr.repro = f.str("repro");
      r.findings.push_back(std::move(fr));
    }
    std::sort(
        r.findings.begin(), r.findings.end(),
        [](const FindingRecord& a, const FindingRecord& b) { return a.signature < b.signature; });
    return r;
  } catch (const ReportError& e) {
    throw ReportError(source + ": " + e.what());
  } catch (const nlohmann::json::exception& e) {
    throw ReportError(source + ": " + e.what());
  }
}

Report load_report(const std::string& path) {
  const std::string text = read_file(path);
  Json j;
  try {
    j = Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw ReportError(path + ": not valid JSON: " + e.what());
  }
  return report_from_json(j, path);
}

void save_report(const Report& r, const std::string& path) {
  write_file_atomic(path, json_to_text(report_to_json(r)));
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

}  // namespace

Report merge_reports(const std::vector<Report>& reports) {
  if (reports.empty()) throw ReportError("nothing to merge");
  Report m;
  const Report& first = reports.front();
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
  std::set<std::string> backends, properties, hosts, commits, reasons;
  std::map<std::string, DeviceCount> devices;
  std::map<std::string, FindingRecord> findings;
  // (seed, shard) of each report, to refuse merging a shard's cases twice.
  std::vector<std::pair<uint64_t, const ShardRun*>> seen_shards;
  bool many_hosts = false;
  for (const auto& r : reports) many_hosts = many_hosts || r.host != first.host;
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
    m.complete = m.complete && r.complete;
    backends.insert(r.backends.begin(), r.backends.end());
    properties.insert(r.properties.begin(), r.properties.end());
    hosts.insert(r.host);
    commits.insert(r.commit);
    reasons.insert(r.stop_reason);
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
    for (const auto& s : r.shards) m.shards.push_back(s);
    for (const auto& d : r.devices) {
      // Devices of different hosts are different devices.
      const std::string key = many_hosts ? r.host + "/" + d.label : d.label;
      auto& dc = devices[key];
      dc.label = key;
      dc.name = d.name;
      dc.cases += d.cases;
    }
    for (const auto& [k, v] : r.tags) m.tags[k] += v;
    for (const auto& s : r.results) m.stats(s.backend, s.property).merge(s);
    for (const auto& f : r.findings) {
      auto it = findings.find(f.signature);
      if (it == findings.end()) {
        FindingRecord nf = f;
        if (nf.corpus_entries.empty() && !nf.corpus_path.empty()) {
          nf.corpus_entries.push_back(nf.corpus_path);
        }
        findings.emplace(f.signature, std::move(nf));
        continue;
      }
      FindingRecord& e = it->second;
      e.count += f.count;
      for (const auto& p : f.corpus_entries) e.corpus_entries.push_back(p);
      if (f.corpus_entries.empty() && !f.corpus_path.empty()) {
        e.corpus_entries.push_back(f.corpus_path);
      }
      // The representative is the earliest case (deterministic whatever the merge order).
      if (std::tie(f.seed, f.case_index) < std::tie(e.seed, e.case_index)) {
        e.seed = f.seed;
        e.case_index = f.case_index;
        e.tightness = f.tightness;
        e.shrunk = f.shrunk;
        e.detail = f.detail;
        e.corpus_path = f.corpus_path;
        e.repro = f.repro;
      }
    }
  }
  m.backends.assign(backends.begin(), backends.end());
  m.properties.assign(properties.begin(), properties.end());
  if (hosts.size() > 1) m.host = std::to_string(hosts.size()) + " hosts";
  if (commits.size() > 1) {
    m.commit.clear();
    for (const auto& c : commits) m.commit += (m.commit.empty() ? "" : ",") + c;
  }
  m.stop_reason.clear();
  for (const auto& s : reasons) m.stop_reason += (m.stop_reason.empty() ? "" : ",") + s;
  for (auto& [k, d] : devices) m.devices.push_back(d);
  for (auto& [k, f] : findings) {
    std::sort(f.corpus_entries.begin(), f.corpus_entries.end());
    f.corpus_entries.erase(std::unique(f.corpus_entries.begin(), f.corpus_entries.end()),
                           f.corpus_entries.end());
    m.findings.push_back(std::move(f));
  }
  std::sort(m.shards.begin(), m.shards.end(), [](const ShardRun& a, const ShardRun& b) {
    return std::tie(a.count, a.index, a.start) < std::tie(b.count, b.index, b.start);
  });
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
        x.flashmla_failures != y.flashmla_failures) {
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
          x.worst[k].tightness != y.worst[k].tightness) {
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
