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
// The API lives in evaluate.h (save_corpus_entry, load_corpus_entry, list_corpus,
// make_finding, shape_class, repro_command); this header adds the JSON conversions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/json_fields.h"
#include "properties/evaluate.h"

namespace mlafuzz {

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
