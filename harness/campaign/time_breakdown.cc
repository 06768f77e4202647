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

Json case_breakdown_to_json(const CaseBreakdown& c) {
  Json j;
  j["cases"] = c.cases;
  for (int i = 0; i < kCaseStepCount; ++i) {
    j[case_step_name(static_cast<CaseStep>(i))] = c.steps.seconds[i];
  }
  j["wall"] = c.steps.wall;
  j["thread_cpu"] = c.steps.thread_cpu;
  return j;
}

CaseBreakdown case_breakdown_from_json(const Json& j, const std::string& path) {
  if (!j.is_object()) throw std::runtime_error(path + ": expected an object");
  if (!j.contains("cases") || !j["cases"].is_number_integer()) {
    throw std::runtime_error(path + ".cases: expected an integer");
  }
  CaseBreakdown c;
  c.cases = j["cases"].get<int64_t>();
  const auto number = [&](const char* name, double& into) {
    if (!j.contains(name)) return;  // a step added later: absent in older reports
    if (!j[name].is_number()) throw std::runtime_error(path + "." + name + ": expected a number");
    into = j[name].get<double>();
  };
  for (int i = 0; i < kCaseStepCount; ++i) {
    number(case_step_name(static_cast<CaseStep>(i)), c.steps.seconds[i]);
  }
  number("wall", c.steps.wall);
  number("thread_cpu", c.steps.thread_cpu);
  return c;
}

std::string render_case_breakdown(const CaseBreakdown& c) {
  if (c.cases <= 0) return "";
  const double n = static_cast<double>(c.cases);
  std::string s = "time per case (ms, on the case's evaluation thread):";
  for (int i = 0; i < kCaseStepCount; ++i) {
    s += fmt::format(" {} {:.2f}", case_step_name(static_cast<CaseStep>(i)),
                     1e3 * c.steps.seconds[i] / n);
  }
  s += fmt::format("; wall {:.2f}, thread CPU {:.2f}\n", 1e3 * c.steps.wall / n,
                   1e3 * c.steps.thread_cpu / n);
  return s;
}

}  // namespace mlafuzz::campaign
