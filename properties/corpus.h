// The corpus: versioned JSON files, each a case recipe and the finding it records.
//
//   {"format": "mlafuzz-corpus", "version": 2,
//    "case": {...the case format of harness/case.h...},
//    "finding": {"property": "tolerance", "backend": "cpu-mma", "expect": "pass", "detail": ...,
//                "signature": ..., "kind": ..., "causes": [...], "properties": [...],
//                "locus": ..., "inputs": ..., "error": ..., "bound": ..., "tightness": ...,
//                "nonfinite_mismatch": false, "commit": ...,
//                "gpu_name": ..., "driver_version": ..., "cuda_version": ..., "host": ...,
//                "found_at": "2026-11-29T08:00:00Z", "seed": ..., "case_index": ..., "count": 1}}
//
// Folders: corpus/regression/ (replayed by ctest; every property must pass on every backend:
// fixed bugs and hand-picked edges, expect "pass"), corpus/findings/ (where a campaign saves
// new findings; expect "fail" until fixed, then moved to regression/ with expect "pass"), and
// corpus/cases/ (hand-written plain case files, also replayed). load_case (harness/case.h)
// reads an entry as a case, so `mlafuzz run` takes corpus files too.
//
// The finding record and the corpus API first, then the JSON conversions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/json_fields.h"
#include "properties/evaluate.h"

namespace mlafuzz {

// kCorpusFormatVersion (core/case.h) 2: the finding is a group (kind, causes,
// properties, locus, inputs) and the file is named by its signature; version-1 entries load and
// replay unchanged (their group fields empty).

// A class of raw failures a finding folds: the property and the shape class of the failing case
// as it was generated (before shrinking), how many failures of the class it saw, and the first.
struct RawFailure {
  std::string property, shape_class;
  int64_t count = 0;
  uint64_t seed = 0, case_index = 0;
  std::string repro;  // regenerates the first case and reruns the property
};

// One finding, one bug: the group of every failure whose minimal case walks to the same
// canonical case (properties/triage.h). The corpus entry's record and the report's, one struct
// for both (the field table in properties/corpus.cc says which document holds which field).
struct Finding {
  // Both documents. `signature` is the group's: backend | failure kind | cause set. `property`
  // is the primary failure's (the first failing property, in table order, on the minimal case).
  std::string property, backend, signature;
  // The backends as the campaign was given them, with files made absolute
  // (absolute_backend_name; "a,b" for a pair): `mlafuzz repro` runs these, from any directory.
  // Empty in entries written before it existed (repro then uses `backend`).
  std::string backend_source;
  uint64_t seed = 0, case_index = 0;  // the first case of the group (the representative)
  double tightness = 0;               // of the finite elements
  bool nonfinite_mismatch = false;    // PropertyOutcome::nonfinite_mismatch
  int64_t count = 1;                  // raw failures folded into the group
  // The group (empty in version-1 corpus entries and reports).
  std::string kind;                     // failure_kind_name of the primary failure
  std::vector<std::string> causes;      // the cause set
  std::vector<std::string> properties;  // every property failing on the minimal case
  std::string locus;                    // where: the wrong outputs and the entries needed
  std::string inputs;                   // the minimal case inline, when small
  // The corpus entry.
  std::string detail;  // the outcome's worst element (PropertyOutcome::detail)
  double error = 0, bound = 0;
  std::string commit;                                  // MLAFUZZ_GIT_COMMIT baked at build time
  std::string gpu_name, driver_version, cuda_version;  // empty when not found on a GPU
  std::string host, found_at;                          // hostname; ISO 8601 UTC time
  std::string expect = "pass";  // "pass": every property must pass (regression entries);
                                // "fail": the finding is expected to persist (known bug)
  // The report (filled by the campaign).
  std::string shape_class;  // of the minimal case
  bool shrunk = false;
  // Both documents, left out when empty: why the case is not shrunk to the end (the campaign
  // stopped while shrinking it, its shrink steps kept hanging, a shrink limit, shrinking off).
  // Empty when the shrink reached a fixed point.
  std::string shrink_note;
  // The report, left out when empty: the known-failure ledger entry that matches the finding
  // (harness/campaign/ledger.h): its id (issue URL or ticket) and note.
  std::string known, known_note;
  // The report of a night (harness/campaign/lifecycle.h), left out when empty: the group's state
  // across nights and the night it entered it; the replays of a new group and how many failed.
  std::string state, state_since;
  int64_t flaky_runs = 0, flaky_failures = 0;
  std::string summary;  // format_outcome of the minimal case ("detail" in report.json)
  std::string corpus_path, repro;
  std::vector<std::string> corpus_entries;  // every shard's entry for this group
  std::vector<RawFailure> raw;              // the raw failure classes folded, first seen first
};

// Fills property/backend/detail/error figures from an outcome, commit/host/time from this
// build and machine, and the group (kind, causes, signature) from the outcome and `minimal`
// as it is (triage_failure finds the canonical minimal case first).
Finding make_finding(const PropertyOutcome& o, const Case& minimal, uint64_t seed,
                     uint64_t case_index);

// Coarse class of a case: layout, B/H/topk buckets, page-size class, features
// ("model1 B1 H1 T1-2 P=pow2 invalid sink" style). Raw failures are classed by it before
// shrinking (a failure of a known class is not shrunk again).
std::string shape_class(const Case& c);

// Writes {"format":"mlafuzz-corpus","version":2,"case":{...},"finding":{...}} atomically into
// `dir` (created if missing) under a name derived from the signature (corpus_file_name); returns
// the path. Saving the same group again overwrites the same file.
std::string save_corpus_entry(const std::string& dir, const Case& minimal, const Finding& f);

struct CorpusEntry {
  Case c;
  Finding f;
  std::string path;
};

// Loads a corpus entry, or a bare case file (then f has expect = "pass" and nothing else).
// Throws CaseError naming the offending field.
CorpusEntry load_corpus_entry(const std::string& path);

// Sorted *.json files of a corpus folder (empty if the folder does not exist).
std::vector<std::string> list_corpus(const std::string& dir);

// "<this mlafuzz> repro /absolute/PATH --backends NAME" (backends omitted when empty), which
// runs as pasted (command_to_run_again, core/command.h).
std::string repro_command(const std::string& path, const std::string& backends);

// Build commit taken at every build (cmake/build_commit.cmake): 12 hex digits, "-dirty" when
// tracked files differed from it, "unknown" outside a git checkout.
const char* build_commit();

// ---- JSON ----

// The documents a Finding is written to (views of finding_fields()).
inline constexpr unsigned kFindingInCorpus = 1;  // the "finding" object of a corpus entry
inline constexpr unsigned kFindingInReport = 2;  // an element of report.json's "findings"

// Every field of a Finding, with the documents that hold it: the one list both documents are
// written and read from.
const fields::Table<Finding>& finding_fields();

nlohmann::ordered_json finding_to_json(const Finding& f);
// Strict: unknown fields and wrong types throw CaseError naming "finding.<field>".
Finding finding_from_json(const nlohmann::ordered_json& j);

// The file name save_corpus_entry uses: "<backend>-<16 hex digits>.json" (the backend's name
// without folders), the digits a hash of the group signature: one entry per group.
std::string corpus_file_name(const Finding& f);

// The fields of a raw failure class (report.json's findings[].raw[]).
const fields::Table<RawFailure>& raw_failure_fields();

}  // namespace mlafuzz
