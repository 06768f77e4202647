// Findings across nights: which bugs are new, still open, fixed, verified or regressed.
//
// A nights folder holds one folder per night whose names sort in time order (for example
// 2026-12-05), each with the night's (merged) report.json. `mlafuzz nights DIR` takes the last
// night (or a named one), reads the previous night's lifecycle.json, and gives every group a
// state:
//
//   new        first seen tonight
//   open       seen tonight and before, or not met tonight but its minimal case still fails
//   fixed      not met tonight and its minimal case passes on tonight's kernels
//   verified   fixed on two nights running (passes again the night after it was fixed)
//   regressed  fixed or verified before, failing again tonight
//
// `since` is the night the group entered its state (open keeps the night the bug was found).
// A group not met by tonight's campaign has its minimal case (the corpus entry its finding
// recorded) replayed through `mlafuzz repro`; every new group is replayed `flaky_runs` times,
// and one that does not fail every time is marked flaky with its rate. The night's
// lifecycle.json records the states; report.json, report.html and junit.xml of the night are
// rewritten with each finding's state (docs/nightly.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "harness/campaign/ledger.h"
#include "harness/campaign/report.h"

namespace mlafuzz::campaign {

inline constexpr const char* kLifecycleFormat = "mlafuzz-lifecycle";
inline constexpr int kLifecycleVersion = 1;

struct GroupState {
  std::string signature, backend;
  std::string state;                           // new, open, fixed, verified, regressed
  std::string since;                           // night the group entered `state`
  std::string found;                           // night the group was first seen
  std::string last_seen;                       // last night a campaign met it
  std::string case_path;                       // its minimal case (corpus entry)
  std::string known;                           // the ledger entry's id, when one knows it
  int64_t flaky_runs = 0, flaky_failures = 0;  // replays of a new group and how many failed
};

struct Lifecycle {
  std::string night, previous;
  std::vector<GroupState> groups;  // sorted by signature
};

// new, open or regressed: the bug is there.
bool is_open(const std::string& state);

Lifecycle load_lifecycle(const std::string& path);  // ReportError naming the field
void save_lifecycle(const Lifecycle& l, const std::string& path);

// Replays a corpus entry: 1 when its failure no longer occurs, 0 while it fails, -1 when it
// could not be replayed. A function so that tests can stand in for `mlafuzz repro`.
using ReplayFn = std::function<int(const std::string& case_path)>;

struct NightOptions {
  int flaky_runs = 3;
  ReplayFn replay;                // default: replay_corpus_entry
  const Ledger* known = nullptr;  // marks groups a ledger entry knows
};

// Tonight's states from the previous night's (`prev`, empty for the first night) and tonight's
// report; marks the report's findings (Finding::state, state_since, flaky_*).
Lifecycle advance_night(const std::string& night, const Lifecycle& prev, Report& tonight,
                        const NightOptions& opts);

// One line per group: state, since, signature, flakiness, known.
std::string render_lifecycle(const Lifecycle& l);

}  // namespace mlafuzz::campaign
