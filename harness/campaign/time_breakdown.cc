#include "harness/campaign/time_breakdown.h"

#include <fmt/format.h>

#include <array>
#include <utility>

#include "core/json_fields.h"

namespace mlafuzz::campaign {

using Json = nlohmann::ordered_json;

namespace {

using fields::Field;
using fields::Table;

// A field for the seconds at `index` of (t.*steps).seconds, the array of a case's steps or a
// call's phases; absent from reports written before the step or phase existed.
template <class T, class Steps>
Field<T> seconds_field(std::string key, Steps T::*steps, int index) {
  return {std::move(key), fields::kAllViews,
          [steps, index](const T& t, const fields::WriteStyle& s) {
            return fields::number((t.*steps).seconds[index], s);
          },
          [steps, index](T& t, const Json& v, const std::string& path) {
            (t.*steps).seconds[index] = fields::read_double(v, path);
          },
          /*optional=*/true};
}

// One backend's entry: calls, requests (absent in reports from before batched requests), then
// the seconds of each phase.
const Table<BackendTime>& backend_time_fields() {
  static const Table<BackendTime> t = [] {
    Table<BackendTime> t = {fields::field("calls", &BackendTime::calls),
                            fields::field("requests", &BackendTime::requests)};
    t.back().optional = true;
    for (int i = 0; i < kPhaseCount; ++i) {
      t.push_back(seconds_field(phase_name(static_cast<Phase>(i)), &BackendTime::phases, i));
    }
    return t;
  }();
  return t;
}

// cases, the seconds of each step, wall and thread CPU (the steps and the two totals absent in
// reports from before they were measured).
const Table<CaseBreakdown>& case_breakdown_fields() {
  static const Table<CaseBreakdown> t = [] {
    Table<CaseBreakdown> t = {fields::field("cases", &CaseBreakdown::cases)};
    for (int i = 0; i < kCaseStepCount; ++i) {
      t.push_back(
          seconds_field(case_step_name(static_cast<CaseStep>(i)), &CaseBreakdown::steps, i));
    }
    for (auto [key, member] :
         {std::pair{"wall", &CaseSteps::wall}, std::pair{"thread_cpu", &CaseSteps::thread_cpu}}) {
      t.push_back({key, fields::kAllViews,
                   [member](const CaseBreakdown& c, const fields::WriteStyle& s) {
                     return fields::number(c.steps.*member, s);
                   },
                   [member](CaseBreakdown& c, const Json& v, const std::string& path) {
                     c.steps.*member = fields::read_double(v, path);
                   },
                   /*optional=*/true});
    }
    return t;
  }();
  return t;
}

}  // namespace

Json time_breakdown_to_json(const TimeBreakdown& t) {
  Json j = Json::object();
  for (const auto& [backend, bt] : t) j[backend] = fields::write(bt, backend_time_fields());
  return j;
}

TimeBreakdown time_breakdown_from_json(const Json& j, const std::string& path) {
  if (!j.is_object()) throw fields::FieldError(path, "expected an object");
  TimeBreakdown t;
  for (const auto& [backend, e] : j.items()) {
    fields::read(e, t[backend], backend_time_fields(), {.path = fields::child(path, backend)});
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
  return fields::write(c, case_breakdown_fields());
}

CaseBreakdown case_breakdown_from_json(const Json& j, const std::string& path) {
  CaseBreakdown c;
  fields::read(j, c, case_breakdown_fields(), {.path = path});
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
