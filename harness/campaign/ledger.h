// The known-failure ledger: findings a team already knows about, each tied to a ticket.
//
// A ledger is a JSON file (docs/nightly.md, "The ledger file"):
//
//   {"format": "mlafuzz-known", "version": 1,
//    "known": [{"id": "https://github.com/org/kernels/issues/212",
//               "note": "row alone differs from the row in its batch by 1-2 bf16 ulp",
//               "backend": "python:*flashmla*", "property": "row-alone",
//               "expires": "2027-03-01"}]}
//
// An entry matches a finding when every pattern it gives matches: `backend` (default "*") the
// finding's backend, `signature` its group signature, `property` one of the properties it
// fails, and each pattern of `causes` one of its causes. Patterns are shell globs (`*`, `?`,
// `[...]`). `id` (an issue URL or ticket) and `note` are required, and an entry must give at
// least one of signature, property or causes (a backend alone would hide every bug of a
// kernel). `case` names the finding's minimal case (a corpus entry; relative paths are relative
// to the ledger file): when no finding of a run matches the entry, the case is replayed, and a
// case that now passes is reported as "fixed? remove the entry". `expires` (YYYY-MM-DD) makes
// the entry fail every run from that day on, so that known bugs are looked at again.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "properties/corpus.h"

namespace mlafuzz::campaign {

inline constexpr const char* kLedgerFormat = "mlafuzz-known";
inline constexpr int kLedgerVersion = 1;

// A malformed ledger; `what()` names the file and the JSON path of the bad field.
class LedgerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct KnownEntry {
  std::string id, note;
  std::string backend = "*";
  std::string signature, property;
  std::vector<std::string> causes;
  std::string case_path;  // "" : no minimal case recorded (absolute once loaded)
  std::string expires;    // "" : never
};

struct Ledger {
  std::string path;
  std::vector<KnownEntry> entries;
};

// Reads and checks a ledger (LedgerError on any problem, naming the file and field).
Ledger load_ledger(const std::string& path);

// Shell-glob match of a whole string (fnmatch without flags).
bool glob_match(const std::string& pattern, const std::string& text);

// Whether `e` matches the finding: backend, signature, one of the properties it fails, and
// every cause pattern against one of the finding's causes (its cause set).
bool entry_matches(const KnownEntry& e, const Finding& f);

// The ledger applied to a run's findings.
struct LedgerResult {
  int known = 0;                // findings matched by an entry
  int unknown = 0;              // findings no entry matches: they fail the run
  std::vector<size_t> expired;  // entries whose expiry date has come
  std::vector<size_t> unseen;   // entries no finding of the run matched
};

// Marks every finding that an entry matches (Finding::known = the entry's id, known_note = its
// note; the first matching entry wins) and lists expired and unseen entries. `today` is
// YYYY-MM-DD (UTC).
LedgerResult apply_ledger(const Ledger& ledger, std::vector<Finding>& findings,
                          const std::string& today);

// Replays the case of every unseen entry whose backend pattern matches one of `backends` (the
// run's), by running `EXE repro CASE` (EXE: this executable) with its output discarded: per
// unseen entry, 1 when the case now passes (fixed?), 0 while it fails, -1 when there is no
// case, no backend of the run matches, or the replay could not run.
std::vector<int> replay_unseen(const Ledger& ledger, const LedgerResult& res,
                               const std::vector<std::string>& backends);

// Replays a corpus entry by running `EXE repro PATH` (EXE: this executable) with its output
// discarded: 1 when its failure no longer occurs, 0 while it fails, -1 when it could not run.
int replay_corpus_entry(const std::string& path);

// Today's date in UTC as YYYY-MM-DD.
std::string utc_today();

// What the ledger did, for the terminal and the report's warnings: one line per expired entry,
// per unseen entry (with its replay verdict when `fixed` says, index by index, that its case
// now passes), and a count of the known findings.
std::string render_ledger(const Ledger& ledger, const LedgerResult& res,
                          const std::vector<int>& fixed);

}  // namespace mlafuzz::campaign
