// Where a campaign's backend calls spent their time: per backend, the number of calls
// and the seconds of each Phase (core/backend.h), summed over the calls. The report's
// "campaign.time_breakdown" and the summary's "time per call" table come from here.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "core/backend.h"
#include "properties/evaluate.h"

namespace mlafuzz::campaign {

struct BackendTime {
  int64_t calls = 0;
  int64_t requests = 0;  // round trips to the workers that carried the calls (a batch: one)
  CallPhases phases;     // summed over the calls
};
using TimeBreakdown = std::map<std::string, BackendTime>;  // by backend name

// {"cuda-mma": {"calls": 123, "requests": 24, "queue": 0.5, "encode": 0.01, ...}, ...}
nlohmann::ordered_json time_breakdown_to_json(const TimeBreakdown& t);
// Reads what time_breakdown_to_json wrote; throws fields::FieldError naming the key's JSON path.
TimeBreakdown time_breakdown_from_json(const nlohmann::ordered_json& j, const std::string& path);
// Adds b into a (merging shards' reports).
void merge_time_breakdown(TimeBreakdown& a, const TimeBreakdown& b);
// A table: per backend, calls and microseconds per call of each measured phase.
std::string render_time_breakdown(const TimeBreakdown& t);

// The campaign side of the cases: every evaluated case's CaseSteps, summed, and how
// many cases they cover. The report's "campaign.case_breakdown" and the summary's "time per
// case" line come from here.
struct CaseBreakdown {
  int64_t cases = 0;
  CaseSteps steps;
};
// {"cases": 123, "generate": 0.1, "materialize": 1.2, ..., "wall": 9.8, "thread_cpu": 7.7}
nlohmann::ordered_json case_breakdown_to_json(const CaseBreakdown& c);
// Reads what case_breakdown_to_json wrote; throws fields::FieldError naming the key's JSON path.
CaseBreakdown case_breakdown_from_json(const nlohmann::ordered_json& j, const std::string& path);
// One line: milliseconds per case of each step, of the wall time and of the thread's CPU time.
std::string render_case_breakdown(const CaseBreakdown& c);

}  // namespace mlafuzz::campaign
