// Where a campaign's backend calls spent their time (issue 13): per backend, the number of calls
// and the seconds of each Phase (harness/core/backend.h), summed over the calls. The report's
// "campaign.time_breakdown" and the summary's "time per call" table come from here.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "harness/core/backend.h"

namespace mlafuzz::campaign {

struct BackendTime {
  int64_t calls = 0;
  int64_t requests = 0;  // round trips to the workers that carried the calls (a batch: one)
  CallPhases phases;     // summed over the calls
};
using TimeBreakdown = std::map<std::string, BackendTime>;  // by backend name

// {"cuda-mma": {"calls": 123, "requests": 24, "queue": 0.5, "encode": 0.01, ...}, ...}
nlohmann::ordered_json time_breakdown_to_json(const TimeBreakdown& t);
// Reads what time_breakdown_to_json wrote; throws std::runtime_error naming `path` and the key.
TimeBreakdown time_breakdown_from_json(const nlohmann::ordered_json& j, const std::string& path);
// Adds b into a (merging shards' reports).
void merge_time_breakdown(TimeBreakdown& a, const TimeBreakdown& b);
// A table: per backend, calls and microseconds per call of each measured phase.
std::string render_time_breakdown(const TimeBreakdown& t);

}  // namespace mlafuzz::campaign
