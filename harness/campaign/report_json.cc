// report.json (schema "mlafuzz-report" v1): every struct written and read from one field table.
//
// The reader is strict about what it reads (missing or mistyped fields raise ReportError naming
// their JSON path) and ignores keys it does not know. Key order is the order of the tables.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/fileio.h"
#include "core/json_fields.h"
#include "harness/campaign/report.h"
#include "properties/corpus.h"

namespace mlafuzz::campaign {
namespace {

using Json = nlohmann::ordered_json;
using fields::Field;
using fields::FieldError;
using fields::Table;
using fields::WriteStyle;

// JSON has no infinities or NaN: the report writes them as strings.
// Before the non-finite flag existed, the tightness 1e300 stood for it.
constexpr double kLegacyNonfiniteTightness = 1e300;

constexpr WriteStyle kStyle{.nonfinite_as_string = true};

const Table<WorstCase>& worst_fields() {
  using fields::field;
  static const Table<WorstCase> t = {
      field("seed", &WorstCase::seed),
      field("case_index", &WorstCase::case_index),
      field("failed", &WorstCase::failed),
      field("nonfinite_mismatch", &WorstCase::nonfinite_mismatch),
      field("tightness", &WorstCase::tightness),
      field("max_abs", &WorstCase::max_abs),
      field("shape", &WorstCase::shape),
      field("detail", &WorstCase::detail),
      field("repro", &WorstCase::repro),
  };
  return t;
}

const Table<DeviceCount>& device_fields() {
  using fields::field;
  static const Table<DeviceCount> t = {field("label", &DeviceCount::label),
                                       field("name", &DeviceCount::name),
                                       field("cases", &DeviceCount::cases)};
  return t;
}

const Table<Finding>& report_finding_fields() { return finding_fields(); }

// ---- Histograms and samples (fixed bins, compact rows) ----

Json hist_json(const LogHistogram& h) {
  Json j;
  j["lo"] = LogHistogram::kLo;
  j["hi"] = LogHistogram::kHi;
  j["bins_per_decade"] = LogHistogram::kPerDecade;
  j["counts"] = h.counts;
  return j;
}

struct HistogramHeader {
  double lo = 0, hi = 0;
  int64_t bins_per_decade = 0;
};

LogHistogram hist_from(const Json& j, const std::string& path) {
  using fields::field;
  static const Table<HistogramHeader> header = {
      field("lo", &HistogramHeader::lo), field("hi", &HistogramHeader::hi),
      field("bins_per_decade", &HistogramHeader::bins_per_decade)};
  HistogramHeader hh;
  fields::read(j, hh, header, {.path = path});
  if (hh.lo != LogHistogram::kLo || hh.hi != LogHistogram::kHi ||
      hh.bins_per_decade != LogHistogram::kPerDecade) {
    throw FieldError(path, "histogram bins differ from this version's fixed bins");
  }
  const std::string where = fields::child(path, "counts");
  if (!j.contains("counts")) throw FieldError(where, "missing");
  const Json& c = j.at("counts");
  if (!c.is_array()) throw FieldError(where, "expected an array");
  if (c.size() != static_cast<size_t>(LogHistogram::kBins)) {
    throw FieldError(where, "expected " + std::to_string(LogHistogram::kBins) + " bins, found " +
                                std::to_string(c.size()));
  }
  LogHistogram h;
  for (int i = 0; i < LogHistogram::kBins; ++i) {
    if (!c[i].is_number_integer() || c[i].get<int64_t>() < 0) {
      throw FieldError(where + "[" + std::to_string(i) + "]", "expected a non-negative integer");
    }
    h.counts[i] = c[i].get<int64_t>();
  }
  return h;
}

// Compact rows: [key, seed, case_index, out_max_ref, max_abs, tightness, topk, page_size,
// failed]; the order is given in "sample_columns" at the top level.
Json sample_row(const Sample& p) {
  return Json::array({std::to_string(p.key), p.seed, p.case_index,
                      fields::number(p.out_max_ref, kStyle), fields::number(p.max_abs, kStyle),
                      fields::number(p.tightness, kStyle), p.topk, p.page_size, p.failed ? 1 : 0});
}

Sample sample_from(const Json& row, const std::string& where) {
  if (!row.is_array() || row.size() != 9 || !row[0].is_string() || !row[1].is_number_unsigned() ||
      !row[2].is_number_unsigned() || !row[6].is_number_integer() || !row[7].is_number_integer() ||
      !row[8].is_number_integer()) {
    throw FieldError(where,
                     "expected [key, seed, case_index, out_max_ref, max_abs, tightness, topk, "
                     "page_size, failed]");
  }
  Sample p;
  try {
    p.key = std::stoull(row[0].get<std::string>());
  } catch (const std::exception&) {
    throw FieldError(where + "[0]", "expected a decimal key");
  }
  p.seed = row[1].get<uint64_t>();
  p.case_index = row[2].get<uint64_t>();
  p.out_max_ref = fields::read_double(row[3], where + "[3]");
  p.max_abs = fields::read_double(row[4], where + "[4]");
  p.tightness = fields::read_double(row[5], where + "[5]");
  p.topk = row[6].get<int32_t>();
  p.page_size = row[7].get<int32_t>();
  p.failed = row[8].get<int>() != 0;
  return p;
}

const Json& array_at(const Json& v, const std::string& path) {
  if (!v.is_array()) throw FieldError(path, "expected an array");
  return v;
}

// ---- PropertyStats ----

Json tightness_json(const PropertyStats& s) {
  Json t;
  t["max"] = fields::number(s.max_tightness, kStyle);
  t["nonfinite_mismatches"] = s.nonfinite_mismatches;
  t["p50"] = fields::number(s.tightness.quantile(0.50, s.max_tightness), kStyle);
  t["p90"] = fields::number(s.tightness.quantile(0.90, s.max_tightness), kStyle);
  t["p99"] = fields::number(s.tightness.quantile(0.99, s.max_tightness), kStyle);
  t["histogram"] = hist_json(s.tightness);
  return t;
}

void tightness_from(PropertyStats& s, const Json& t, const std::string& path) {
  if (!t.is_object()) throw FieldError(path, "expected an object");
  if (!t.contains("max")) throw FieldError(path + ".max", "missing");
  s.max_tightness = fields::read_double(t.at("max"), path + ".max");
  if (t.contains("nonfinite_mismatches")) {
    fields::read_value(s.nonfinite_mismatches, t.at("nonfinite_mismatches"),
                       path + ".nonfinite_mismatches");
  } else if (s.max_tightness >= kLegacyNonfiniteTightness) {
    s.nonfinite_mismatches = 1;  // at least one: older reports did not count them
    s.max_tightness = 0;
  }
  if (!t.contains("histogram")) throw FieldError(path + ".histogram", "missing");
  s.tightness = hist_from(t.at("histogram"), path + ".histogram");
}

Field<PropertyStats> stats_tightness_field() {
  return {"tightness", fields::kAllViews,
          [](const PropertyStats& s, const WriteStyle&) { return tightness_json(s); },
          tightness_from};
}

// Worst lists and samples are read through add_worst/add_sample, which keep their order and size.
Field<PropertyStats> stats_worst_field() {
  return {"worst", fields::kAllViews,
          [](const PropertyStats& s, const WriteStyle& st) {
            return fields::write_array(s.worst, worst_fields(), fields::kAllViews, st);
          },
          [](PropertyStats& s, const Json& v, const std::string& path) {
            for (const auto& w : fields::read_array(v, worst_fields(), {.path = path})) {
              s.add_worst(w);
            }
          }};
}

Field<PropertyStats> stats_samples_field() {
  return {"samples", fields::kAllViews,
          [](const PropertyStats& s, const WriteStyle&) {
            Json a = Json::array();
            for (const auto& p : s.samples) a.push_back(sample_row(p));
            return a;
          },
          [](PropertyStats& s, const Json& v, const std::string& path) {
            const Json& a = array_at(v, path);
            for (size_t i = 0; i < a.size(); ++i) {
              s.add_sample(sample_from(a[i], path + "[" + std::to_string(i) + "]"));
            }
          }};
}

const Table<PropertyStats>& stats_fields() {
  using fields::field;
  static const Table<PropertyStats> t = {
      field("backend", &PropertyStats::backend),
      field("property", &PropertyStats::property),
      field("cases", &PropertyStats::cases),
      field("not_applicable", &PropertyStats::not_applicable),
      field("failures", &PropertyStats::failures),
      field("flashmla_failures", &PropertyStats::flashmla_failures),
      field("max_abs", &PropertyStats::max_abs),
      // Derived from sum_mean_abs and the counts: written for readers, never read back.
      {"mean_abs", fields::kAllViews,
       [](const PropertyStats& s, const WriteStyle& st) {
         return fields::number(s.mean_abs(), st);
       },
       nullptr},
      field("sum_mean_abs", &PropertyStats::sum_mean_abs),
      field("max_rel", &PropertyStats::max_rel),
      field("cos_diff_max", &PropertyStats::max_cos_diff),
      field("lse_max_abs", &PropertyStats::lse_max_abs),
      stats_tightness_field(),
      stats_worst_field(),
      stats_samples_field(),
  };
  return t;
}

PropertyStats stats_from(const Json& j, const std::string& path) {
  PropertyStats s;
  fields::read(j, s, stats_fields(), {.path = path});
  if (s.cases < 0 || s.not_applicable < 0 || s.failures < 0 || s.not_applicable > s.cases ||
      s.failures > s.cases) {
    throw FieldError(path, "inconsistent counts (cases " + std::to_string(s.cases) +
                               ", not_applicable " + std::to_string(s.not_applicable) +
                               ", failures " + std::to_string(s.failures) + ")");
  }
  return s;
}

// ---- ShardRun ----

Field<ShardRun> case_ranges_field() {
  return {"case_ranges", fields::kAllViews,
          [](const ShardRun& s, const WriteStyle&) {
            Json ranges = Json::array();
            for (const auto& [lo, hi] : s.case_ranges) ranges.push_back(Json::array({lo, hi}));
            return ranges;
          },
          [](ShardRun& s, const Json& v, const std::string& path) {
            const Json& a = array_at(v, path);
            for (size_t k = 0; k < a.size(); ++k) {
              const Json& p = a[k];
              if (!p.is_array() || p.size() != 2 || !p[0].is_number_unsigned() ||
                  !p[1].is_number_unsigned() || p[0].get<uint64_t>() > p[1].get<uint64_t>()) {
                throw FieldError(path + "[" + std::to_string(k) + "]",
                                 "expected [lo, hi] with lo <= hi");
              }
              s.case_ranges.emplace_back(p[0].get<uint64_t>(), p[1].get<uint64_t>());
            }
          }};
}

const Table<ShardRun>& shard_fields() {
  using fields::field;
  static const Table<ShardRun> t = {
      field("index", &ShardRun::index),
      field("count", &ShardRun::count),
      field("host", &ShardRun::host),
      field("commit", &ShardRun::commit),
      field("start", &ShardRun::start),
      field("end", &ShardRun::end),
      field("duration_s", &ShardRun::duration_s),
      field("stop_reason", &ShardRun::stop_reason),
      field("cases", &ShardRun::cases),
      case_ranges_field(),
  };
  return t;
}

Field<Report> shards_field() {
  return {"shards", fields::kAllViews,
          [](const Report& r, const WriteStyle& st) {
            return fields::write_array(r.shards, shard_fields(), fields::kAllViews, st);
          },
          [](Report& r, const Json& v, const std::string& path) {
            r.shards = fields::read_array(v, shard_fields(), {.path = path});
            for (size_t i = 0; i < r.shards.size(); ++i) {
              const ShardRun& s = r.shards[i];
              if (s.count < 1 || s.index < 0 || s.index >= s.count) {
                throw FieldError(path + "[" + std::to_string(i) + "]",
                                 "shard " + std::to_string(s.index) + "/" +
                                     std::to_string(s.count) + " is out of range");
              }
            }
          }};
}

// ---- Report ----

struct GpuIds {
  std::string Report::*member;
  const char* key;
};
constexpr GpuIds kGpuIds[] = {{&Report::gpu_name, "name"},
                              {&Report::driver_version, "driver"},
                              {&Report::cuda_version, "cuda"}};

Field<Report> gpu_field() {
  return {"gpu", fields::kAllViews,
          [](const Report& r, const WriteStyle&) {
            Json g;
            for (const auto& id : kGpuIds) g[id.key] = r.*id.member;
            return g;
          },
          [](Report& r, const Json& v, const std::string& path) {
            if (!v.is_object()) throw FieldError(path, "expected an object");
            for (const auto& id : kGpuIds) {
              const std::string where = path + "." + id.key;
              if (!v.contains(id.key)) throw FieldError(where, "missing");
              fields::read_value(r.*id.member, v.at(id.key), where);
            }
          }};
}

// An optional object of the campaign (the time breakdowns: absent in older reports) written
// and read by its own functions, whose errors name the field.
template <typename V>
Field<Report> breakdown_field(const char* key, V Report::*member, Json (*to)(const V&),
                              V (*from)(const Json&, const std::string&)) {
  return {key, fields::kAllViews,
          [member, to](const Report& r, const WriteStyle&) { return to(r.*member); },
          [member, from](Report& r, const Json& v, const std::string& path) {
            r.*member = from(v, path);
          },
          /*optional=*/true};
}

// The "campaign" object: what ran, where and how long.
const Table<Report>& campaign_fields() {
  using fields::field;
  static const Table<Report> t = {
      field("seed", &Report::seed),
      field("profile", &Report::profile),
      field("backends", &Report::backends),
      field("properties", &Report::properties),
      field("commit", &Report::commit),
      field("host", &Report::host),
      gpu_field(),
      field("start", &Report::start),
      field("end", &Report::end),
      field("duration_s", &Report::duration_s),
      field("stop_reason", &Report::stop_reason),
      fields::optional_field("warnings", &Report::warnings),
      field("cases", &Report::cases),
      field("cases_per_s", &Report::cases_per_s),
      field("eval_seconds", &Report::eval_seconds),
      field("oracle_seconds", &Report::oracle_seconds),
      breakdown_field("time_breakdown", &Report::time_breakdown, time_breakdown_to_json,
                      time_breakdown_from_json),
      breakdown_field("case_breakdown", &Report::case_breakdown, case_breakdown_to_json,
                      case_breakdown_from_json),
      shards_field(),
      fields::array_of("devices", &Report::devices, device_fields),
  };
  return t;
}

Field<Report> constant(const char* key, Json value) {
  return {key, fields::kAllViews, [value](const Report&, const WriteStyle&) { return value; },
          nullptr};
}

Field<Report> tags_field() {
  return {"tags", fields::kAllViews,
          [](const Report& r, const WriteStyle&) {
            Json tags = Json::object();
            for (const auto& [k, v] : r.tags) tags[k] = v;
            return tags;
          },
          [](Report& r, const Json& v, const std::string& path) {
            if (!v.is_object()) throw FieldError(path, "expected an object");
            for (const auto& [k, n] : v.items()) fields::read_value(r.tags[k], n, path + "." + k);
          }};
}

Field<Report> results_field() {
  return {"results", fields::kAllViews,
          [](const Report& r, const WriteStyle& st) {
            return fields::write_array(r.results, stats_fields(), fields::kAllViews, st);
          },
          [](Report& r, const Json& v, const std::string& path) {
            const Json& a = array_at(v, path);
            for (size_t i = 0; i < a.size(); ++i) {
              PropertyStats s = stats_from(a[i], path + "[" + std::to_string(i) + "]");
              r.stats(s.backend, s.property) = std::move(s);
            }
          }};
}

const Table<Report>& report_fields() {
  using fields::field;
  static const Table<Report> t = {
      constant("format", kReportFormat),
      constant("version", kReportVersion),
      field("complete", &Report::complete),
      {"campaign", fields::kAllViews,
       [](const Report& r, const WriteStyle& st) {
         return fields::write(r, campaign_fields(), fields::kAllViews, st);
       },
       [](Report& r, const Json& v, const std::string& path) {
         fields::read(v, r, campaign_fields(), {.path = path});
       }},
      tags_field(),
      constant("sample_columns", Json::array({"key", "seed", "case_index", "out_max_ref", "max_abs",
                                              "tightness", "topk", "page_size", "failed"})),
      results_field(),
      fields::array_of("findings", &Report::findings, report_finding_fields, kFindingInReport),
  };
  return t;
}

// Reports written before the non-finite flag existed scored a non-finite mismatch as tightness
// 1e300 and have no "nonfinite_mismatch" field in worst cases and findings: give them the flag.
Json with_nonfinite_flags(Json j) {
  auto upgrade = [](Json& e) {
    if (!e.is_object() || e.contains("nonfinite_mismatch") || !e.contains("tightness")) return;
    const bool legacy =
        e["tightness"].is_number() && e["tightness"].get<double>() >= kLegacyNonfiniteTightness;
    e["nonfinite_mismatch"] = legacy;
    if (legacy) e["tightness"] = 0.0;
  };
  if (j.contains("results") && j["results"].is_array()) {
    for (auto& s : j["results"]) {
      if (s.is_object() && s.contains("worst") && s["worst"].is_array()) {
        for (auto& w : s["worst"]) upgrade(w);
      }
    }
  }
  if (j.contains("findings") && j["findings"].is_array()) {
    for (auto& f : j["findings"]) upgrade(f);
  }
  return j;
}

void check_format(const Json& j) {
  if (!j.is_object()) throw ReportError("expected a JSON object");
  std::string format;
  int64_t version = 0;
  if (!j.contains("format")) throw FieldError("format", "missing");
  fields::read_value(format, j.at("format"), "format");
  if (format != kReportFormat) {
    throw ReportError("format: expected \"" + std::string(kReportFormat) + "\", found \"" + format +
                      "\"");
  }
  if (!j.contains("version")) throw FieldError("version", "missing");
  fields::read_value(version, j.at("version"), "version");
  if (version < kOldestReportVersion || version > kReportVersion) {
    throw ReportError(
        "version: " + std::to_string(version) + " is not supported (this build reads versions " +
        std::to_string(kOldestReportVersion) + " to " + std::to_string(kReportVersion) + ")");
  }
}

}  // namespace

Json report_to_json(const Report& r) {
  return fields::write(r, report_fields(), fields::kAllViews, kStyle);
}

Report report_from_json(const Json& j, const std::string& source) {
  try {
    check_format(j);
    Report r;
    fields::read(with_nonfinite_flags(j), r, report_fields());
    r.version = j.at("version").get<int>();
    std::sort(r.findings.begin(), r.findings.end(),
              [](const Finding& a, const Finding& b) { return a.signature < b.signature; });
    return r;
  } catch (const ReportError& e) {
    throw ReportError(source + ": " + e.what());
  } catch (const FieldError& e) {
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

}  // namespace mlafuzz::campaign
