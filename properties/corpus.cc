// Corpus entries: save, load, list; finding metadata; dedup signatures.
#include "properties/corpus.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>

#include "harness/core/fileio.h"
#include "harness/core/materialize.h"
#include "kernels/common/tiling.h"
#include "mlafuzz_build_commit.h"  // MLAFUZZ_GIT_COMMIT, generated at build time

namespace mlafuzz {
namespace {

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

json finding_to_json(const Finding& f) {
  json j;
  j["property"] = f.property;
  j["backend"] = f.backend;
  j["expect"] = f.expect;
  j["detail"] = f.detail;
  j["signature"] = f.signature;
  j["error"] = f.error;
  j["bound"] = f.bound;
  // Non-finite tightness (a bound of 0, a non-finite mismatch) is stored as a large number:
  // JSON has no infinity.
  j["tightness"] = std::isfinite(f.tightness) ? f.tightness : 1e300;
  j["commit"] = f.commit;
  j["gpu_name"] = f.gpu_name;
  j["driver_version"] = f.driver_version;
  j["cuda_version"] = f.cuda_version;
  j["host"] = f.host;
  j["found_at"] = f.found_at;
  j["seed"] = f.seed;
  j["case_index"] = f.case_index;
  j["count"] = f.count;
  return j;
}

Finding finding_from_json(const json& j) {
  if (!j.is_object()) throw CaseError("finding", "must be an object");
  Finding f;
  const std::map<std::string, std::function<void(const json&)>> fields = {
      {"property", [&](const json& v) { f.property = v.get<std::string>(); }},
      {"backend", [&](const json& v) { f.backend = v.get<std::string>(); }},
      {"expect", [&](const json& v) { f.expect = v.get<std::string>(); }},
      {"detail", [&](const json& v) { f.detail = v.get<std::string>(); }},
      {"signature", [&](const json& v) { f.signature = v.get<std::string>(); }},
      {"error", [&](const json& v) { f.error = v.get<double>(); }},
      {"bound", [&](const json& v) { f.bound = v.get<double>(); }},
      {"tightness", [&](const json& v) { f.tightness = v.get<double>(); }},
      {"commit", [&](const json& v) { f.commit = v.get<std::string>(); }},
      {"gpu_name", [&](const json& v) { f.gpu_name = v.get<std::string>(); }},
      {"driver_version", [&](const json& v) { f.driver_version = v.get<std::string>(); }},
      {"cuda_version", [&](const json& v) { f.cuda_version = v.get<std::string>(); }},
      {"host", [&](const json& v) { f.host = v.get<std::string>(); }},
      {"found_at", [&](const json& v) { f.found_at = v.get<std::string>(); }},
      {"seed", [&](const json& v) { f.seed = v.get<uint64_t>(); }},
      {"case_index", [&](const json& v) { f.case_index = v.get<uint64_t>(); }},
      {"count", [&](const json& v) { f.count = v.get<int>(); }},
  };
  for (const auto& [key, value] : j.items()) {
    auto it = fields.find(key);
    if (it == fields.end()) throw CaseError("finding." + key, "unknown field");
    try {
      it->second(value);
    } catch (const json::exception& e) {
      throw CaseError("finding." + key, std::string("wrong type: ") + e.what());
    }
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

std::string finding_signature(const std::string& property, const std::string& backend,
                              const Case& c) {
  return property + "|" + backend + "|" + shape_class(c);
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
  f.signature = finding_signature(o.property, o.backend, minimal);
  f.commit = build_commit();
  f.host = host_name();
  f.found_at = utc_now_iso8601();
  f.seed = seed;
  f.case_index = case_index;
  f.expect = "fail";  // a new finding fails until it is fixed
  return f;
}

std::string corpus_file_name(const Case& c, const Finding& f) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, fnv1a(f.signature + "\n" + to_json(c)));
  return sanitize(f.property.empty() ? "case" : f.property) + "-" +
         sanitize(f.backend.empty() ? "any" : f.backend) + "-" + hex + ".json";
}

std::string save_corpus_entry(const std::string& dir, const Case& minimal, const Finding& f) {
  validate(minimal);
  json j;
  j["format"] = kFormat;
  j["version"] = kCorpusFormatVersion;
  j["case"] = case_to_json_value(minimal);
  j["finding"] = finding_to_json(f);
  make_dirs(dir);
  const std::string path = (std::filesystem::path(dir) / corpus_file_name(minimal, f)).string();
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
      if (!j.contains("version") || j.at("version") != kCorpusFormatVersion) {
        throw CaseError("version", "unsupported corpus entry version (this build reads version " +
                                       std::to_string(kCorpusFormatVersion) + ")");
      }
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
  std::string cmd = "mlafuzz repro " + path;
  if (!backends.empty()) cmd += " --backends " + backends;
  return cmd;
}

}  // namespace mlafuzz
