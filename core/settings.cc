#include "core/settings.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>

#include "core/json_fields.h"

namespace mlafuzz::settings {

extern const char* const kSettingsJson;

namespace {

// One entry of python/mlafuzz/settings.json ("kept" only on a switch of an earlier path).
const fields::Table<Setting>& setting_fields() {
  using fields::field;
  static const fields::Table<Setting> t = {
      field("name", &Setting::name),
      field("type", &Setting::type),
      field("default", &Setting::default_text),
      field("scope", &Setting::scope),
      field("reader", &Setting::reader),
      field("description", &Setting::description),
      fields::optional_field("kept", &Setting::kept),
  };
  return t;
}

std::vector<Setting> parse_table() {
  const fields::Json j = fields::Json::parse(kSettingsJson);
  return fields::read_array(j.at("settings"), setting_fields(),
                            {.path = "settings.json: settings", .unknown_is_error = true});
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

[[noreturn]] void bad_value(const Setting& s, const std::string& v, const char* want) {
  throw std::invalid_argument(s.name + "='" + v + "': give " + want + " (" + s.description + ")");
}

}  // namespace

const std::vector<Setting>& all() {
  static const std::vector<Setting> table = parse_table();
  return table;
}

const Setting& find(std::string_view name) {
  for (const Setting& s : all()) {
    if (s.name == name) return s;
  }
  throw std::logic_error(std::string(name) +
                         " is not in the settings table (python/mlafuzz/settings.json)");
}

std::optional<std::string> text(std::string_view name) {
  const Setting& s = find(name);
  const char* v = std::getenv(s.name.c_str());
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

bool flag(std::string_view name, bool fallback) {
  const auto v = text(name);
  if (!v) return fallback;
  const std::string l = lower(*v);
  if (l == "1" || l == "true" || l == "yes" || l == "on") return true;
  if (l == "0" || l == "false" || l == "no" || l == "off") return false;
  bad_value(find(name), *v, "1 or 0");
}

int64_t integer(std::string_view name, int64_t fallback) {
  const auto v = text(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (errno != 0 || end == v->c_str() || *end != '\0') bad_value(find(name), *v, "an integer");
  return x;
}

double seconds(std::string_view name, double fallback) {
  const auto v = text(name);
  if (!v) return fallback;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  if (end == v->c_str() || *end != '\0' || !(x > 0)) bad_value(find(name), *v, "seconds > 0");
  return x;
}

std::string help_env_text() {
  static const std::vector<std::pair<std::string, std::string>> scopes = {
      {"run", "mlafuzz and its workers"},
      {"device", "device paths (CUDA, torch, Triton)"},
      {"internal", "set by mlafuzz for its workers"},
      {"test", "read by the tests"},
      {"script", "read by scripts/ and .ci/run"}};
  std::string out =
      "# mlafuzz settings\n\n"
      "Every `MLAFUZZ_*` environment variable mlafuzz, its Python package, its tests and its\n"
      "scripts read. Generated from `python/mlafuzz/settings.json` (`mlafuzz --help-env`;\n"
      "a test checks this page against it). A bool is 1 or 0; an empty value is unset.\n";
  for (const auto& [scope, title] : scopes) {
    out += "\n## " + scope + ": " + title + "\n\n";
    out += "| name | type | default | what it does |\n|---|---|---|---|\n";
    for (const Setting& s : all()) {
      if (s.scope != scope) continue;
      std::string what = s.description;
      if (!s.kept.empty()) what += " Kept: " + s.kept + ".";
      what += " Read by " + s.reader + ".";
      std::string esc;
      for (char c : what) {
        if (c == '|') esc += "\\";
        esc += c;
      }
      out += "| `" + s.name + "` | " + s.type + " | " +
             (s.default_text.empty() ? "unset" : s.default_text) + " | " + esc + " |\n";
    }
  }
  return out;
}

}  // namespace mlafuzz::settings
