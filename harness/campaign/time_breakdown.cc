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

// An optional field for a number of seconds that `at(t)` refers to (a generic lambda, so that the
// writer reads through a const T and the reader writes through a T); absent from reports written
// before that figure was measured.
template <class T, class At>
Field<T> seconds_field(std::string key, At at) {
  return {
      std::move(key), fields::kAllViews,
      [at](const T& t, const fields::WriteStyle& s) { return fields::number(at(t), s); },
      [at](T& t, const Json& v, const std::string& path) { at(t) = fields::read_double(v, path); },
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
      t.push_back(seconds_field<BackendTime>(
          phase_name(static_cast<Phase>(i)), [i](auto& b) -> auto& {
            return b.phases.seconds[i];
          }));
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
      t.push_back(seconds_field<CaseBreakdown>(
          case_step_name(static_cast<CaseStep>(i)), [i](auto& c) -> auto& {
            return c.steps.seconds[i];
          }));
    }
    t.push_back(seconds_field<CaseBreakdown>(
        "wall", [](auto& c) -> auto& { return c.steps.wall; }));
    t.push_back(seconds_field<CaseBreakdown>(
        "thread_cpu", [](auto& c) -> auto& { return c.steps.thread_cpu; }));
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
