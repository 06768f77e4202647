#include "harness/campaign/ledger.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <filesystem>
#include <sstream>

#include "core/command.h"
#include "core/fileio.h"
#include "core/json_fields.h"

extern char** environ;

namespace mlafuzz::campaign {
namespace {

namespace fs = std::filesystem;
using fields::FieldError;
using fields::Json;

const fields::Table<KnownEntry>& entry_fields() {
  static const fields::Table<KnownEntry> t = {
      fields::field("id", &KnownEntry::id),
      fields::field("note", &KnownEntry::note),
      fields::optional_field("backend", &KnownEntry::backend),
      fields::optional_field("signature", &KnownEntry::signature),
      fields::optional_field("property", &KnownEntry::property),
      fields::optional_field("causes", &KnownEntry::causes),
      fields::optional_field("case", &KnownEntry::case_path),
      fields::optional_field("expires", &KnownEntry::expires),
  };
  return t;
}

bool is_date(const std::string& s) {
  if (s.size() != 10 || s[4] != '-' || s[7] != '-') return false;
  for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9}) {
    if (s[i] < '0' || s[i] > '9') return false;
  }
  const int month = std::stoi(s.substr(5, 2)), day = std::stoi(s.substr(8, 2));
  return month >= 1 && month <= 12 && day >= 1 && day <= 31;
}

void check_entry(const KnownEntry& e, const std::string& path) {
  if (e.id.empty()) throw FieldError(path + ".id", "empty: give the issue URL or ticket ID");
  if (e.note.empty()) throw FieldError(path + ".note", "empty: say what the known bug is");
  if (e.backend.empty()) throw FieldError(path + ".backend", "empty (\"*\" for every backend)");
  if (e.signature.empty() && e.property.empty() && e.causes.empty()) {
    throw FieldError(path,
                     "give at least one of signature, property or causes (a backend "
                     "alone would hide every bug of the kernel)");
  }
  if (!e.expires.empty() && !is_date(e.expires)) {
    throw FieldError(path + ".expires", "expected a date YYYY-MM-DD, found \"" + e.expires + "\"");
  }
}

}  // namespace

bool glob_match(const std::string& pattern, const std::string& text) {
  return fnmatch(pattern.c_str(), text.c_str(), 0) == 0;
}

Ledger load_ledger(const std::string& path) {
  Ledger l;
  l.path = path;
  std::string text;
  try {
    text = read_file(path);
  } catch (const std::exception& e) {
    throw LedgerError("known-failure ledger " + path + ": " + e.what());
  }
  try {
    const Json j = Json::parse(text);
    if (!j.is_object()) throw FieldError("(top)", "expected an object");
    if (!j.contains("format") || j["format"] != kLedgerFormat) {
      throw FieldError("format", std::string("expected \"") + kLedgerFormat + "\"");
    }
    if (!j.contains("version") || !j["version"].is_number_integer()) {
      throw FieldError("version", "expected an integer");
    }
    const int version = j["version"].get<int>();
    if (version != kLedgerVersion) {
      throw FieldError("version", "this mlafuzz reads version " + std::to_string(kLedgerVersion) +
                                      ", the file is version " + std::to_string(version));
    }
    for (const auto& [key, value] : j.items()) {
      (void)value;
      if (key != "format" && key != "version" && key != "known") {
        throw FieldError(key, "unknown field (expected format, version, known)");
      }
    }
    if (!j.contains("known") || !j["known"].is_array()) {
      throw FieldError("known", "expected an array of entries");
    }
    const fs::path dir = fs::path(path).parent_path();
    for (size_t i = 0; i < j["known"].size(); ++i) {
      const std::string where = "known[" + std::to_string(i) + "]";
      KnownEntry e;
      fields::read(j["known"][i], e, entry_fields(),
                   {.path = where, .missing_is_error = true, .unknown_is_error = true});
      check_entry(e, where);
      if (!e.case_path.empty() && fs::path(e.case_path).is_relative()) {
        e.case_path = (dir / e.case_path).lexically_normal().string();
      }
      l.entries.push_back(std::move(e));
    }
  } catch (const Json::exception& e) {
    throw LedgerError("known-failure ledger " + path + ": not JSON: " + e.what());
  } catch (const FieldError& e) {
    throw LedgerError("known-failure ledger " + path + ": " + e.what());
  }
  return l;
}

bool entry_matches(const KnownEntry& e, const Finding& f) {
  if (!glob_match(e.backend, f.backend)) return false;
  if (!e.signature.empty() && !glob_match(e.signature, f.signature)) return false;
  if (!e.property.empty()) {
    bool any = glob_match(e.property, f.property);
    for (const auto& p : f.properties) any = any || glob_match(e.property, p);
    if (!any) return false;
  }
  for (const auto& pattern : e.causes) {
    bool any = false;
    for (const auto& c : f.causes) any = any || glob_match(pattern, c);
    if (!any) return false;
  }
  return true;
}

LedgerResult apply_ledger(const Ledger& ledger, std::vector<Finding>& findings,
                          const std::string& today) {
  LedgerResult res;
  std::vector<bool> seen(ledger.entries.size(), false);
  for (auto& f : findings) {
    f.known.clear();
    f.known_note.clear();
    for (size_t i = 0; i < ledger.entries.size(); ++i) {
      if (!entry_matches(ledger.entries[i], f)) continue;
      f.known = ledger.entries[i].id;
      f.known_note = ledger.entries[i].note;
      seen[i] = true;
      break;
    }
    ++(f.known.empty() ? res.unknown : res.known);
  }
  for (size_t i = 0; i < ledger.entries.size(); ++i) {
    const auto& e = ledger.entries[i];
    if (!e.expires.empty() && e.expires <= today) res.expired.push_back(i);
    if (!seen[i]) res.unseen.push_back(i);
  }
  return res;
}

namespace {

// Exit status of `exe repro case` with stdin, stdout and stderr on /dev/null; -1 when it could
// not run or did not exit.
int run_repro(const std::string& exe, const std::string& case_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  std::vector<std::string> args = {exe, "repro", case_path};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

int replay_corpus_entry(const std::string& path) {
  const std::string exe = executable_path();
  if (exe.empty()) return -1;
  const int rc = run_repro(exe, path);
  return rc == 0 ? 1 : rc == 1 ? 0 : -1;
}

std::vector<int> replay_unseen(const Ledger& ledger, const LedgerResult& res,
                               const std::vector<std::string>& backends) {
  std::vector<int> out;
  for (size_t i : res.unseen) {
    const KnownEntry& e = ledger.entries[i];
    bool ran_here = false;
    for (const auto& b : backends) ran_here = ran_here || glob_match(e.backend, b);
    out.push_back(e.case_path.empty() || !ran_here ? -1 : replay_corpus_entry(e.case_path));
  }
  return out;
}

std::string utc_today() { return utc_now_iso8601().substr(0, 10); }  // YYYY-MM-DD

std::string render_ledger(const Ledger& ledger, const LedgerResult& res,
                          const std::vector<int>& fixed) {
  std::ostringstream os;
  os << "known-failure ledger " << ledger.path << ": " << res.known << " known finding(s), "
     << res.unknown << " new\n";
  for (size_t i : res.expired) {
    const auto& e = ledger.entries[i];
    os << "  expired: entry " << i << " (" << e.id << ") expired on " << e.expires
       << ": look at the bug again, then renew the date or remove the entry\n";
  }
  for (size_t k = 0; k < res.unseen.size(); ++k) {
    const auto& e = ledger.entries[res.unseen[k]];
    const int verdict = k < fixed.size() ? fixed[k] : -1;
    os << "  not seen: entry " << res.unseen[k] << " (" << e.id << ")";
    if (verdict == 1) {
      os << ": its case " << e.case_path << " now passes: fixed? remove the entry\n";
    } else if (verdict == 0) {
      os << ": its case " << e.case_path << " still fails (this run did not meet it)\n";
    } else if (e.case_path.empty()) {
      os << ": no case recorded, so whether it is fixed is not known\n";
    } else {
      os << ": its case " << e.case_path << " could not be replayed\n";
    }
  }
  return os.str();
}

}  // namespace mlafuzz::campaign
