// Corpus entries: save, load, list; finding metadata; dedup signatures.
#include "properties/corpus.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "core/command.h"
#include "core/fileio.h"
#include "core/materialize.h"
#include "mla/tiling.h"
#include "mlafuzz_build_commit.h"  // MLAFUZZ_GIT_COMMIT, generated at build time
#include "properties/triage.h"

namespace mlafuzz {
namespace {

// Before nonfinite_mismatch was a field, the tightness 1e300 stood for it.
constexpr double kLegacyNonfiniteTightness = 1e300;

using json = nlohmann::ordered_json;
constexpr const char* kFormat = "mlafuzz-corpus";

std::string sanitize(const std::string& s) {
  std::string r;
  for (char ch : s) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.';
    r += ok ? ch : '_';
  }
  return r;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

const char* bucket(int v, std::initializer_list<std::pair<int, const char*>> upper) {
  for (const auto& [limit, name] : upper) {
    if (v <= limit) return name;
  }
  return "large";
}

}  // namespace

const char* build_commit() { return MLAFUZZ_GIT_COMMIT; }

const fields::Table<RawFailure>& raw_failure_fields() {
  using fields::field;
  static const fields::Table<RawFailure> table = {
      field("property", &RawFailure::property),     field("shape_class", &RawFailure::shape_class),
      field("count", &RawFailure::count),           field("seed", &RawFailure::seed),
      field("case_index", &RawFailure::case_index), field("repro", &RawFailure::repro),
  };
  return table;
}

const fields::Table<Finding>& finding_fields() {
  using fields::field;
  using fields::optional_field;
  constexpr unsigned kCorpus = kFindingInCorpus, kReport = kFindingInReport;
  constexpr unsigned kBoth = kCorpus | kReport;
  // Each document keeps the key order it always had, so a member both hold is listed twice, once
  // per document.
  static const fields::Table<Finding> table = {
      field("signature", &Finding::signature, kReport),
      field("property", &Finding::property, kBoth),
      field("backend", &Finding::backend, kBoth),
      field("backend_source", &Finding::backend_source, kBoth),
      optional_field("kind", &Finding::kind, kReport),
      optional_field("causes", &Finding::causes, kReport),
      optional_field("properties", &Finding::properties, kReport),
      optional_field("locus", &Finding::locus, kReport),
      optional_field("inputs", &Finding::inputs, kReport),
      field("shape_class", &Finding::shape_class, kReport),
      field("count", &Finding::count, kReport),
      field("seed", &Finding::seed, kReport),
      field("case_index", &Finding::case_index, kReport),
      field("tightness", &Finding::tightness, kReport),
      field("nonfinite_mismatch", &Finding::nonfinite_mismatch, kReport),
      field("shrunk", &Finding::shrunk, kReport),
      fields::optional_field("shrink_note", &Finding::shrink_note, kReport),
      fields::optional_field("known", &Finding::known, kReport),
      fields::optional_field("known_note", &Finding::known_note, kReport),
      fields::optional_field("state", &Finding::state, kReport),
      fields::optional_field("state_since", &Finding::state_since, kReport),
      fields::optional_field("flaky_runs", &Finding::flaky_runs, kReport),
      fields::optional_field("flaky_failures", &Finding::flaky_failures, kReport),
      field("detail", &Finding::summary, kReport),
      field("corpus", &Finding::corpus_path, kReport),
      field("corpus_entries", &Finding::corpus_entries, kReport),
      field("repro", &Finding::repro, kReport),
      [] {
        auto f =
            fields::array_of("raw", &Finding::raw, raw_failure_fields, fields::kAllViews, kReport);
        f.optional = true;
        return f;
      }(),
      field("expect", &Finding::expect, kCorpus),
      field("detail", &Finding::detail, kCorpus),
      field("signature", &Finding::signature, kCorpus),
      optional_field("kind", &Finding::kind, kCorpus),
      optional_field("causes", &Finding::causes, kCorpus),
      optional_field("properties", &Finding::properties, kCorpus),
      optional_field("locus", &Finding::locus, kCorpus),
      optional_field("inputs", &Finding::inputs, kCorpus),
      field("error", &Finding::error, kCorpus),
      field("bound", &Finding::bound, kCorpus),
      field("tightness", &Finding::tightness, kCorpus),
      field("nonfinite_mismatch", &Finding::nonfinite_mismatch, kCorpus),
      field("commit", &Finding::commit, kCorpus),
      field("gpu_name", &Finding::gpu_name, kCorpus),
      field("driver_version", &Finding::driver_version, kCorpus),
      field("cuda_version", &Finding::cuda_version, kCorpus),
      field("host", &Finding::host, kCorpus),
      field("found_at", &Finding::found_at, kCorpus),
      field("seed", &Finding::seed, kCorpus),
      field("case_index", &Finding::case_index, kCorpus),
      field("count", &Finding::count, kCorpus),
      fields::optional_field("shrink_note", &Finding::shrink_note, kCorpus),
  };
  return table;
}

json finding_to_json(const Finding& f) {
  json j = fields::write(f, finding_fields(), kFindingInCorpus);
  // JSON has no infinity: an infinite tightness (an excess over a bound of 0) is "inf".
  j["tightness"] = fields::number(f.tightness, {.nonfinite_as_string = true});
  return j;
}

Finding finding_from_json(const json& j) {
  if (!j.is_object()) throw CaseError("finding", "must be an object");
  Finding f;
  try {
    fields::read(j, f, finding_fields(),
                 {.path = "finding",
                  .view = kFindingInCorpus,
                  .missing_is_error = false,
                  .unknown_is_error = true});
  } catch (const fields::FieldError& e) {
    throw CaseError(e.path(), e.reason());
  }
  // Entries written before the flag existed scored a non-finite mismatch (and an infinite
  // tightness) as tightness 1e300.
  if (!j.contains("nonfinite_mismatch") && f.tightness >= kLegacyNonfiniteTightness) {
    f.nonfinite_mismatch = true;
    f.tightness = 0;
  }
  if (f.expect != "pass" && f.expect != "fail") {
    throw CaseError("finding.expect", "must be \"pass\" or \"fail\", not \"" + f.expect + "\"");
  }
  return f;
}

std::string shape_class(const Case& c) {
  const auto& g = c.geom;
  std::string s = std::string(layout_name(g.layout));
  s += std::string(" B") + bucket(c.batch, {{1, "1"}, {2, "2"}, {4, "3-4"}, {16, "5-16"}});
  s += std::string(" H") + bucket(c.heads, {{1, "1"}, {2, "2"}, {32, "3-32"}, {64, "33-64"}});
  s += std::string(" T") +
       bucket(c.topk, {{2, "1-2"}, {8, "3-8"}, {64, "9-64"}, {256, "65-256"}, {512, "257-512"}});
  s += g.page_size == 1 ? " P=1" : (g.page_size & (g.page_size - 1)) == 0 ? " P=pow2" : " P=odd";
  if (mla::padded_nope(g.nope_dim) != g.nope_dim) s += " padded-nope";
  bool invalid = !c.indices.empty() ? false : c.index_spec.invalid_fraction > 0;
  for (const auto& row : c.indices) {
    for (int32_t v : row) invalid = invalid || v < 0;
  }
  if (invalid) s += " invalid";
  if (c.topk_length) s += " topk_length";
  if (c.sink) {
    bool pinf = false, ninf = false;
    for (double v : *c.sink) {
      pinf = pinf || v == HUGE_VAL;
      ninf = ninf || v == -HUGE_VAL;
    }
    s += pinf ? " sink+inf" : ninf ? " sink-inf" : " sink";
  }
  if (c.conventions.sink_in_lse) s += " sink-in-lse";
  if (c.conventions.empty_lse != mla::EmptyRowLse::kPosInf) s += " empty-lse-neg";
  return s;
}

Finding make_finding(const PropertyOutcome& o, const Case& minimal, uint64_t seed,
                     uint64_t case_index) {
  Finding f;
  f.property = o.property;
  f.backend = o.backend;
  f.detail = o.detail;
  f.error = o.error;
  f.bound = o.bound;
  f.tightness = o.tightness;
  f.nonfinite_mismatch = o.nonfinite_mismatch;
  const FailureKind kind = failure_kind(o);
  f.kind = failure_kind_name(kind);
  f.causes = group_causes(minimal, o, {});
  f.properties = {o.property};
  f.signature = group_signature(o.backend, kind, f.causes);
  f.shape_class = shape_class(minimal);
  f.commit = build_commit();
  f.host = host_name();
  f.found_at = utc_now_iso8601();
  f.seed = seed;
  f.case_index = case_index;
  f.expect = "fail";  // a new finding fails until it is fixed
  return f;
}

std::string corpus_file_name(const Finding& f) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, fnv1a(f.signature));
  // The backend's own name, without a python: kernel's or a plugin's folders.
  std::string backend = f.backend.empty() ? "any" : f.backend;
  if (const size_t slash = backend.rfind('/'); slash != std::string::npos) {
    backend = backend.substr(slash + 1);
  }
  return sanitize(backend) + "-" + hex + ".json";
}

std::string save_corpus_entry(const std::string& dir, const Case& minimal, const Finding& f) {
  validate(minimal);
  json j;
  j["format"] = kFormat;
  j["version"] = kCorpusFormatVersion;
  j["case"] = case_to_json_value(minimal);
  j["finding"] = finding_to_json(f);
  make_dirs(dir);
  const std::string path = (std::filesystem::path(dir) / corpus_file_name(f)).string();
  write_file_atomic(path, json_to_text(j));
  return path;
}

CorpusEntry load_corpus_entry(const std::string& path) {
  CorpusEntry e;
  e.path = path;
  const std::string text = read_file(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& ex) {
    throw CaseError("(json)", std::string("not valid JSON: ") + ex.what() + " (in " + path + ")");
  }
  try {
    if (j.is_object() && j.contains("format") && j.at("format") != "mlafuzz-case") {
      if (j.at("format") != kFormat) {
        throw CaseError("format", "neither \"mlafuzz-corpus\" nor \"mlafuzz-case\"");
      }
      check_corpus_entry_version(j);
      for (const auto& [key, value] : j.items()) {
        (void)value;
        if (key != "format" && key != "version" && key != "case" && key != "finding") {
          throw CaseError(key, "unknown field of a corpus entry");
        }
      }
      if (!j.contains("case")) throw CaseError("case", "corpus entry has no \"case\" field");
      e.c = case_from_json_value(j.at("case"), "case.");
      if (j.contains("finding")) e.f = finding_from_json(j.at("finding"));
    } else {
      e.c = case_from_json_value(j, "");  // a plain case file: every property must pass
    }
  } catch (const CaseError& ex) {
    throw CaseError(ex.field(), ex.reason() + " (in " + path + ")");
  }
  return e;
}

std::vector<std::string> list_corpus(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return files;
  for (const auto& ent : std::filesystem::directory_iterator(dir, ec)) {
    if (ent.is_regular_file() && ent.path().extension() == ".json") {
      files.push_back(ent.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string repro_command(const std::string& path, const std::string& backends) {
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(path, ec);
  std::string cmd = command_to_run_again() + " repro " + shell_word(ec ? path : abs.string());
  if (!backends.empty()) cmd += " --backends " + shell_word(backends);
  return cmd;
}

}  // namespace mlafuzz
