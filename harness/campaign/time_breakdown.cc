#include "harness/campaign/time_breakdown.h"

#include <fmt/format.h>

#include <stdexcept>

namespace mlafuzz::campaign {

using Json = nlohmann::ordered_json;

Json time_breakdown_to_json(const TimeBreakdown& t) {
  Json j = Json::object();
  for (const auto& [backend, bt] : t) {
    Json e;
    e["calls"] = bt.calls;
    e["requests"] = bt.requests;
    for (int i = 0; i < kPhaseCount; ++i)
      e[phase_name(static_cast<Phase>(i))] = bt.phases.seconds[i];
    j[backend] = e;
  }
  return j;
}

TimeBreakdown time_breakdown_from_json(const Json& j, const std::string& path) {
  if (!j.is_object()) throw std::runtime_error(path + ": expected an object");
  TimeBreakdown t;
  for (const auto& [backend, e] : j.items()) {
    const std::string where = path + "." + backend;
    if (!e.is_object() || !e.contains("calls") || !e["calls"].is_number_integer()) {
      throw std::runtime_error(where + ".calls: expected an integer");
    }
    BackendTime bt;
    bt.calls = e["calls"].get<int64_t>();
    if (e.contains("requests")) {  // absent in reports from before batched requests
      if (!e["requests"].is_number_integer())
        throw std::runtime_error(where + ".requests: expected an integer");
      bt.requests = e["requests"].get<int64_t>();
    }
    for (int i = 0; i < kPhaseCount; ++i) {
      const char* name = phase_name(static_cast<Phase>(i));
      if (!e.contains(name)) continue;  // a phase added later: absent in older reports
      if (!e[name].is_number())
        throw std::runtime_error(where + "." + name + ": expected a number");
      bt.phases.seconds[i] = e[name].get<double>();
    }
    t[backend] = bt;
  }
  return t;
}

void merge_time_breakdown(TimeBreakdown& a, const TimeBreakdown& b) {
  for (const auto& [backend, bt] : b) {
    a[backend].calls += bt.calls;
    a[backend].requests += bt.requests;
    a[backend].phases += bt.phases;
  }
}

std::string render_time_breakdown(const TimeBreakdown& t) {
  if (t.empty()) return "";
  std::string s = "time per worker call (us): where the backends' calls spent their time\n";
  s += fmt::format("  {:<22} {:>9} {:>9}", "backend", "calls", "requests");
  for (int i = 0; i < kPhaseCount; ++i)
    s += fmt::format(" {:>9}", phase_name(static_cast<Phase>(i)));
  s += "\n";
  for (const auto& [backend, bt] : t) {
    s += fmt::format("  {:<22} {:>9} {:>9}", backend, bt.calls, bt.requests);
    for (int i = 0; i < kPhaseCount; ++i) {
      const double us = bt.calls > 0 ? 1e6 * bt.phases.seconds[i] / bt.calls : 0;
      s += fmt::format(" {:>9.1f}", us);
    }
    s += "\n";
  }
  return s;
}

}  // namespace mlafuzz::campaign
