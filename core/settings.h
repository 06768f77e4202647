// The MLAFUZZ_* environment variables: one table (python/mlafuzz/settings.json, compiled in),
// read through these accessors only. An accessor refuses a name the table does not list, and a
// value that is not of the variable's type is an error naming the variable.
// `mlafuzz --help-env` prints the table (help_env_text); docs/settings.md is rendered from it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mlafuzz::settings {

struct Setting {
  std::string name;
  std::string type;          // path, path list, string, bool, int, seconds, bytes
  std::string default_text;  // what applies when it is unset ("" where nothing does)
  std::string scope;         // run, device, internal, test, script
  std::string reader;        // the files that read it
  std::string description;
  std::string kept;  // for a switch of an earlier path: why it is kept
};

// Every variable, in the table's order.
const std::vector<Setting>& all();
// The table's entry for `name`; throws std::logic_error when the table does not list it.
const Setting& find(std::string_view name);

// The variable's value when it is set and not empty (the name must be in the table).
std::optional<std::string> text(std::string_view name);
// A bool variable: 1 or 0 (true, false, yes, no, on, off too); `fallback` when unset.
// Throws std::invalid_argument naming the variable on any other value.
bool flag(std::string_view name, bool fallback);
// An int variable; `fallback` when unset; throws std::invalid_argument on a non-integer.
int64_t integer(std::string_view name, int64_t fallback);
// A seconds variable (a positive number); `fallback` when unset; throws on anything else.
double seconds(std::string_view name, double fallback);

// The table as `mlafuzz --help-env` prints it (Markdown: docs/settings.md is this text).
std::string help_env_text();

}  // namespace mlafuzz::settings
