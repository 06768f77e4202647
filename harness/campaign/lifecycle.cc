#include "harness/campaign/lifecycle.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "core/fileio.h"
#include "core/json_fields.h"

namespace mlafuzz::campaign {
namespace {

using fields::FieldError;
using fields::Json;

const fields::Table<GroupState>& group_fields() {
  static const fields::Table<GroupState> t = {
      fields::field("signature", &GroupState::signature),
      fields::field("backend", &GroupState::backend),
      fields::field("state", &GroupState::state),
      fields::field("since", &GroupState::since),
      fields::field("found", &GroupState::found),
      fields::field("last_seen", &GroupState::last_seen),
      fields::field("case", &GroupState::case_path),
      fields::optional_field("known", &GroupState::known),
      fields::optional_field("flaky_runs", &GroupState::flaky_runs),
      fields::optional_field("flaky_failures", &GroupState::flaky_failures),
  };
  return t;
}

const std::vector<std::string>& state_names() {
  static const std::vector<std::string> names = {"new", "open", "fixed", "verified", "regressed"};
  return names;
}

}  // namespace

bool is_open(const std::string& state) {
  return state == "new" || state == "open" || state == "regressed";
}

Lifecycle load_lifecycle(const std::string& path) {
  Lifecycle l;
  try {
    const Json j = Json::parse(read_file(path));
    if (!j.is_object()) throw FieldError("(top)", "expected an object");
    if (j.value("format", "") != kLifecycleFormat) {
      throw FieldError("format", std::string("expected \"") + kLifecycleFormat + "\"");
    }
    if (j.value("version", 0) != kLifecycleVersion) {
      throw FieldError("version", "expected " + std::to_string(kLifecycleVersion));
    }
    if (!j.contains("night") || !j["night"].is_string()) {
      throw FieldError("night", "expected a string");
    }
    l.night = j["night"].get<std::string>();
    l.previous = j.value("previous", "");
    if (!j.contains("groups") || !j["groups"].is_array()) {
      throw FieldError("groups", "expected an array");
    }
    for (size_t i = 0; i < j["groups"].size(); ++i) {
      const std::string where = "groups[" + std::to_string(i) + "]";
      GroupState g;
      fields::read(j["groups"][i], g, group_fields(), {.path = where});
      const auto& names = state_names();
      if (std::find(names.begin(), names.end(), g.state) == names.end()) {
        throw FieldError(where + ".state", "unknown state \"" + g.state + "\"");
      }
      l.groups.push_back(std::move(g));
    }
  } catch (const Json::exception& e) {
    throw ReportError(path + ": not JSON: " + e.what());
  } catch (const FieldError& e) {
    throw ReportError(path + ": " + e.what());
  } catch (const std::runtime_error& e) {
    throw ReportError(path + ": " + e.what());
  }
  return l;
}

void save_lifecycle(const Lifecycle& l, const std::string& path) {
  Json j = {{"format", kLifecycleFormat},
            {"version", kLifecycleVersion},
            {"night", l.night},
            {"previous", l.previous}};
  j["groups"] = Json::array();
  for (const auto& g : l.groups) j["groups"].push_back(fields::write(g, group_fields()));
  write_file_atomic(path, j.dump(2) + "\n");
}

Lifecycle advance_night(const std::string& night, const Lifecycle& prev, Report& tonight,
                        const NightOptions& opts) {
  const ReplayFn replay = opts.replay ? opts.replay : ReplayFn(replay_corpus_entry);
  if (opts.known) apply_ledger(*opts.known, tonight.findings, utc_today());
  Lifecycle l;
  l.night = night;
  l.previous = prev.night;
  std::map<std::string, GroupState> groups;
  for (const auto& g : prev.groups) groups[g.signature] = g;
  std::map<std::string, Finding*> seen;
  for (auto& f : tonight.findings) seen[f.signature] = &f;

  for (auto& [sig, f] : seen) {
    auto it = groups.find(sig);
    GroupState g;
    if (it == groups.end()) {
      g.signature = sig;
      g.backend = f->backend;
      g.state = "new";
      g.since = g.found = night;
      // A new group replayed from its minimal case: flaky when it does not fail every time.
      for (int i = 0; i < opts.flaky_runs && !f->corpus_path.empty(); ++i) {
        const int r = replay(f->corpus_path);
        if (r < 0) continue;
        ++g.flaky_runs;
        g.flaky_failures += r == 0;
      }
    } else {
      g = it->second;
      if (!is_open(g.state)) {
        g.state = "regressed";
        g.since = night;
      } else if (g.state == "new") {
        g.state = "open";  // still open: `since` stays the night it was found
      } else if (g.state == "regressed") {
        g.state = "open";
      }
    }
    g.last_seen = night;
    if (!f->corpus_path.empty()) g.case_path = f->corpus_path;
    g.known = f->known;
    groups[sig] = g;
  }
  for (auto& [sig, g] : groups) {
    if (seen.count(sig)) continue;
    // Not met by tonight's campaign: its minimal case decides, on tonight's kernels.
    const int r = g.case_path.empty() ? -1 : replay(g.case_path);
    if (r == 1) {
      if (g.state == "fixed") {
        g.state = "verified";
        g.since = night;
      } else if (g.state != "verified") {
        g.state = "fixed";
        g.since = night;
      }
    } else if (r == 0) {
      if (!is_open(g.state)) {
        g.state = "regressed";
        g.since = night;
      } else if (g.state == "new") {
        g.state = "open";
      }
    }
    // r < 0: could not be replayed; the state stays.
  }
  for (auto& [sig, g] : groups) l.groups.push_back(g);
  for (auto& f : tonight.findings) {
    const GroupState& g = groups.at(f.signature);
    f.state = g.state;
    f.state_since = g.since;
    f.flaky_runs = g.flaky_runs;
    f.flaky_failures = g.flaky_failures;
  }
  return l;
}

std::string render_lifecycle(const Lifecycle& l) {
  std::ostringstream os;
  std::map<std::string, int> counts;
  for (const auto& g : l.groups) ++counts[g.state];
  os << "night " << l.night << (l.previous.empty() ? " (first night)" : " after " + l.previous)
     << ": " << l.groups.size() << " group(s):";
  for (const auto& s : state_names()) {
    if (counts.count(s)) os << " " << counts[s] << " " << s;
  }
  os << "\n";
  for (const auto& g : l.groups) {
    os << "  " << g.state << std::string(g.state.size() < 10 ? 10 - g.state.size() : 1, ' ')
       << "since " << g.since << "  " << g.signature;
    if (g.flaky_runs > 0 && g.flaky_failures < g.flaky_runs) {
      os << "  [flaky: failed " << g.flaky_failures << " of " << g.flaky_runs << " replays]";
    }
    if (!g.known.empty()) os << "  [known: " << g.known << "]";
    os << "\n";
  }
  return os.str();
}

}  // namespace mlafuzz::campaign
