// Mutation score: one small campaign per planted bug (see mutation.h).
#include "harness/mutation/mutation.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/fileio.h"
#include "harness/backends/registry.h"
#include "harness/campaign/isolation.h"
#include "harness/campaign/worker.h"
#include "kernels/host/host_mutants.h"
#include "properties/corpus.h"
#include "properties/shrink.h"

namespace mlafuzz {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Why a kind cannot build a mutant, or "" when it can.
std::string skip_reason(MutantKind kind, mla::Mutant m) {
  if (kind == MutantKind::kCpu && !host_mutant_supported(m)) {
    return m == mla::Mutant::kMissingBarrier
               ? "GPU only: a missing __syncthreads is a shared-memory race, the host model has "
                 "no threads to race"
               : "the host model has no variant of this mutant";
  }
  return "";
}

// The base backend a mutant varies ("cpu-mma" or "cuda-mma"): the control.
std::string base_backend(MutantKind kind) {
  return kind == MutantKind::kCpu ? "cpu-mma" : "cuda-mma";
}

std::string mutant_backend_name(MutantKind kind, mla::Mutant m) {
  return base_backend(kind) + "~" + mla::mutant_name(m);
}

// A backend of this kind: CPU backends in process; GPU backends in a worker process, so that a
// device fault or a hang is a kill (RunStatus::kFault) and the next mutant gets a fresh context.
std::unique_ptr<Backend> make_kind_backend(const MutationOptions& o, const std::string& name) {
  if (o.kind == MutantKind::kCpu) return make_backend(name);
  campaign::WorkerSpec spec;
  spec.exe = o.worker_exe.empty() ? campaign::self_executable() : o.worker_exe;
  spec.backend = name;
  auto slot = std::make_shared<campaign::WorkerSlot>(std::move(spec));
  return std::make_unique<campaign::ProxyBackend>(std::move(slot), o.case_timeout_seconds);
}

// Does the unmutated backend pass `property` on c? A failure the control shares is not the
// mutant's doing (a tolerance-model gap or a bug of the base kernel): it never counts as a kill,
// and shrinking never drifts into such a case.
bool control_passes(Backend& control, const Case& c, const std::string& property) {
  return !evaluate_case(c, {&control}, {property}).failed();
}

// A python: kernel or one of its planted bugs, in its own Python worker process (isolation.h).
std::unique_ptr<Backend> make_python_kind_backend(const MutationOptions& o,
                                                  const std::string& name) {
  campaign::IsolationOptions iso;
  iso.case_timeout_s = o.case_timeout_seconds;
  iso.worker_exe = o.worker_exe;
  return campaign::make_isolated_backend(name, iso);
}

// One mutant's campaign: `r` names it (name, base, backend); `make` builds the mutant backend;
// `gen` is the generator's configuration (with the envelope cases are drawn in).
MutantResult run_one(const MutationOptions& o, MutantResult r,
                     const std::function<std::unique_ptr<Backend>()>& make, Backend& control,
                     const GenConfig& gen) {
  if (!r.skip_reason.empty()) return r;

  const std::unique_ptr<Backend> mutant = make();
  const std::vector<Backend*> backends{mutant.get()};
  const Clock::time_point t0 = Clock::now();
  std::optional<Case> failing;
  PropertyOutcome failure;
  while (!failing && r.cases < o.max_cases && since(t0) < o.budget_seconds) {
    const uint64_t index = r.cases++;
    Case c = generate_case(o.seed, index, gen, nullptr);
    const CaseEvaluation ev = evaluate_case(c, backends, o.properties);
    for (const PropertyOutcome* f : ev.failures()) {  // worst first
      if (control_passes(control, c, f->property)) {
        failure = *f;
        failing = std::move(c);
        r.failing_index = index;
        break;
      }
      if (r.control_failures++ == 0) {
        r.control_failure_example =
            fmt::format("seed {} case {}: {}", o.seed, index, format_outcome(*f));
      }
    }
  }
  r.seconds = since(t0);
  if (!failing) {
    r.status = MutantStatus::kSurvived;
    return r;
  }
  r.status = MutantStatus::kKilled;
  r.first_property = failure.property;

  // Shrink to a minimal case on which the mutant fails a property that the control passes.
  const Clock::time_point shrink_start = Clock::now();
  ShrunkKill s =
      shrink_kill(*failing, failure, *mutant, control, o.properties, o.shrink, gen.envelope);
  r.shrink_seconds = since(shrink_start);
  r.shrink_steps = s.steps;
  r.shrink_evaluations = s.evaluations;
  r.shrink_stopped_by = s.stopped_by;
  r.property = s.failure.property;
  r.detail = format_outcome(s.failure);
  Case minimal = std::move(s.minimal);
  minimal.name = "mutant-" + r.name;
  minimal.description = fmt::format(
      "{} fails '{}' (mlafuzz mutants, seed {}, case {}{})", r.backend, r.property, o.seed,
      r.failing_index,
      r.property == r.first_property ? ""
                                     : fmt::format(", which failed '{}' first", r.first_property));
  r.batch = minimal.batch;
  r.heads = minimal.heads;
  r.topk = minimal.topk;
  r.valid_tokens = case_size(minimal).valid_tokens;

  const std::vector<std::string> property{r.property};
  // Control: the unmutated backend must pass the same property on the same case.
  const CaseEvaluation ctl = evaluate_case(minimal, {&control}, property);
  r.control_passed = !ctl.failed();
  if (!r.control_passed) r.control_detail = format_outcome(*ctl.failures().front());

  if (!o.save_dir.empty()) {
    make_dirs(o.save_dir);
    // A python: backend's name holds its path: the file is named after the kernel's base name.
    std::string file = r.backend;
    if (const size_t slash = file.rfind('/'); slash != std::string::npos) {
      file = file.substr(slash + 1);
    }
    std::replace(file.begin(), file.end(), ':', '.');
    r.saved_path = o.save_dir + "/" + file + ".json";
    save_case(minimal, r.saved_path);
  }
  r.shrunk = std::move(minimal);
  return r;
}

const char* status_name(MutantStatus s) {
  switch (s) {
    case MutantStatus::kKilled:
      return "killed";
    case MutantStatus::kSurvived:
      return "SURVIVED";
    case MutantStatus::kSkipped:
      return "skipped";
  }
  return "?";
}

// The planted bugs the python: kernels of o.python_backends declare (their MUTANTS), each
// against its own kernel as the control; every backend in its own Python worker.
std::vector<MutantResult> run_python_mutants(
    const MutationOptions& o, const std::function<void(const MutantResult&)>& progress) {
  // What each kernel declares, asked first: a bad --only name is refused before anything runs.
  using Declared = std::vector<std::pair<std::string, std::string>>;
  std::vector<std::pair<std::string, Declared>> kernels;  // absolute name, its mutants
  for (const std::string& given : o.python_backends) {
    const std::string base = absolute_backend_name(given);
    Declared declared = declared_python_mutants(base);
    if (declared.empty()) {
      throw std::runtime_error(
          given +
          " declares no planted bugs: give its module a MUTANTS = {name: description} dict and "
          "one decorated function mutant_<name> per entry (docs/mutation.md)");
    }
    kernels.emplace_back(base, std::move(declared));
  }
  for (const std::string& want : o.only_names) {
    std::string known;
    bool found = false;
    for (const auto& [base, declared] : kernels) {
      for (const auto& d : declared) {
        found = found || d.first == want;
        known += " " + d.first;
      }
    }
    if (!found) throw std::runtime_error("unknown mutant '" + want + "'; declared:" + known);
  }
  std::vector<MutantResult> results;
  for (const auto& [base, declared] : kernels) {
    Declared chosen;
    for (const auto& d : declared) {
      if (o.only_names.empty() ||
          std::find(o.only_names.begin(), o.only_names.end(), d.first) != o.only_names.end()) {
        chosen.push_back(d);
      }
    }
    if (chosen.empty()) continue;
    const std::unique_ptr<Backend> control = make_python_kind_backend(o, base);
    if (const Availability a = control->traits().availability; !a.available) {
      throw std::runtime_error(base + " is not available: " + a.reason);
    }
    GenConfig gen = o.gen;
    gen.envelope = intersect(gen.envelope, control->traits().envelope);
    for (const auto& [name, description] : chosen) {
      MutantResult r;
      r.name = name;
      r.description = description;
      r.base = base;
      r.backend = base + "~" + name;
      const std::string backend = r.backend;
      results.push_back(run_one(
          o, std::move(r),
          [&o, backend] {
            std::unique_ptr<Backend> b = make_python_kind_backend(o, backend);
            if (const Availability a = b->traits().availability; !a.available) {
              throw std::runtime_error(backend + " is not available: " + a.reason);
            }
            return b;
          },
          *control, gen));
      if (progress) progress(results.back());
    }
  }
  return results;
}

}  // namespace

ShrunkKill shrink_kill(const Case& failing, const PropertyOutcome& first, Backend& mutant,
                       Backend& control, const std::vector<std::string>& properties,
                       const ShrinkLimits& limits, const Envelope& envelope) {
  const Clock::time_point start = Clock::now();
  const std::vector<Backend*> backends{&mutant};
  std::vector<std::string> others;
  for (const std::string& p : properties.empty() ? all_properties() : properties) {
    if (p != first.property && p != "run") others.push_back(p);
  }
  // The mutant's failure on c that the control does not share, if any: first.property alone,
  // or (`any`) that first, then "run" (always evaluated: a failed run skips the rest), then the
  // others, evaluated only when neither fails.
  const auto kill = [&](const Case& c, bool any) -> std::optional<PropertyOutcome> {
    const CaseEvaluation ev = evaluate_case(c, backends, {first.property});
    bool ran = true;
    for (const PropertyOutcome* f : ev.failures()) {
      ran = ran && f->property != "run";
      if ((any || f->property == first.property) && control_passes(control, c, f->property)) {
        return *f;
      }
    }
    if (!any || !ran) return std::nullopt;
    const CaseEvaluation more = evaluate_case(c, backends, others);
    for (const PropertyOutcome* f : more.failures()) {
      if (control_passes(control, c, f->property)) return *f;
    }
    return std::nullopt;
  };
  // Two greedy phases within one set of limits: the killing property alone (cases it no longer
  // fails on are never kept while it can still shrink), then any property from where it stopped.
  ShrunkKill k;
  k.minimal = with_explicit_indices(failing);
  k.failure = first;  // on the current minimal case: the last one accepted
  for (const bool any : {false, true}) {
    if (any && others.empty()) break;
    const auto still_fails = [&](const Case& c) {
      std::optional<PropertyOutcome> f = kill(c, any);
      if (f) k.failure = std::move(*f);
      return f.has_value();
    };
    const ShrinkLimits left{limits.max_evaluations - k.evaluations,
                            limits.max_seconds - since(start)};
    const ShrinkResult s = shrink_case(k.minimal, still_fails, left, envelope);
    k.steps += s.steps;
    k.evaluations += s.evaluations;
    k.minimal = s.minimal;
    if (s.budget_exhausted()) {
      k.stopped_by = s.stopped_by;
      break;  // nothing left for the second phase
    }
  }
  return k;
}

std::vector<mla::Mutant> all_mutants() {
  std::vector<mla::Mutant> v;
  for (int i = 1; i < static_cast<int>(mla::Mutant::kCount); ++i) {
    v.push_back(static_cast<mla::Mutant>(i));
  }
  return v;
}

std::optional<mla::Mutant> mutant_from_name(const std::string& name) {
  for (const mla::Mutant m : all_mutants()) {
    if (name == mla::mutant_name(m)) return m;
  }
  return std::nullopt;
}

const char* mutant_kind_name(MutantKind k) { return k == MutantKind::kCpu ? "cpu" : "gpu"; }

std::vector<MutantResult> run_mutants(const MutationOptions& o,
                                      const std::function<void(const MutantResult&)>& progress) {
#if !MLAFUZZ_HAVE_CUDA
  if (o.kind == MutantKind::kGpu) {
    throw std::runtime_error(
        "GPU mutants need a CUDA build (configure with nvcc and MLAFUZZ_MUTANTS=ON); "
        "use --backend-kind cpu here");
  }
#endif
  if (!o.python_backends.empty()) return run_python_mutants(o, progress);
  const std::vector<mla::Mutant> mutants = o.only.empty() ? all_mutants() : o.only;
  const std::unique_ptr<Backend> control = make_kind_backend(o, base_backend(o.kind));
  if (const Availability a = control->traits().availability; !a.available) {
    throw std::runtime_error(base_backend(o.kind) + " is not available: " + a.reason);
  }
  // The combine's mutants run the split pipeline with one split per tile: their control is the
  // unmutated split pipeline with the same setting (made when one of them is scored).
  std::unique_ptr<Backend> split_control;
  std::vector<MutantResult> results;
  for (const mla::Mutant m : mutants) {
    MutantResult r;
    r.mutant = m;
    r.name = mla::mutant_name(m);
    r.base = base_backend(o.kind);
    Backend* ctl = control.get();
    if (mla::is_combine_mutant(m)) {
      r.base += "-split-max";
      if (!split_control) split_control = make_kind_backend(o, r.base);
      ctl = split_control.get();
    }
    r.backend = mutant_backend_name(o.kind, m);
    r.skip_reason = skip_reason(o.kind, m);
    const std::string name = r.backend;
    results.push_back(run_one(
        o, std::move(r), [&o, name] { return make_kind_backend(o, name); }, *ctl, o.gen));
    if (progress) progress(results.back());
  }
  return results;
}

MutationSummary summarize(const std::vector<MutantResult>& results) {
  MutationSummary s;
  std::vector<double> cases;
  for (const MutantResult& r : results) {
    s.control_failures += static_cast<int>(r.control_failures);
    switch (r.status) {
      case MutantStatus::kKilled:
        ++s.killed;
        if (!r.control_passed) ++s.suspect;
        cases.push_back(static_cast<double>(r.cases));
        s.max_batch = std::max(s.max_batch, r.batch);
        s.max_heads = std::max(s.max_heads, r.heads);
        break;
      case MutantStatus::kSurvived:
        ++s.survived;
        break;
      case MutantStatus::kSkipped:
        ++s.skipped;
        break;
    }
  }
  if (!cases.empty()) {
    std::sort(cases.begin(), cases.end());
    const size_t n = cases.size();
    s.median_cases = n % 2 == 1 ? cases[n / 2] : (cases[n / 2 - 1] + cases[n / 2]) / 2;
  }
  return s;
}

std::string format_mutant_table(const std::vector<MutantResult>& results) {
  std::string t =
      fmt::format("{:<24} {:<9} {:<15} {:>6} {:>8}  {:>2} {:>2} {:>5} {:>5}  {}\n", "mutant",
                  "status", "killed by", "cases", "seconds", "B", "H", "topk", "valid", "note");
  for (const MutantResult& r : results) {
    if (r.status == MutantStatus::kSkipped) {
      t += fmt::format("{:<24} {:<9} {}\n", r.name, status_name(r.status), r.skip_reason);
      continue;
    }
    std::string note;
    if (r.status == MutantStatus::kKilled) {
      const auto add = [&note](const std::string& n) { note += note.empty() ? n : "; " + n; };
      if (!r.control_passed) add("SUSPECT: control fails too");
      if (r.property != r.first_property) add("first killed by " + r.first_property);
      if (r.shrink_stopped_by != ShrinkStop::kFixedPoint) {
        add(fmt::format("shrink stopped by its {} limit", shrink_stop_name(r.shrink_stopped_by)));
      }
      t += fmt::format("{:<24} {:<9} {:<15} {:>6} {:>8.2f}  {:>2} {:>2} {:>5} {:>5}  {}\n", r.name,
                       status_name(r.status), r.property, r.cases, r.seconds, r.batch, r.heads,
                       r.topk, r.valid_tokens, note);
    } else {
      t += fmt::format("{:<24} {:<9} {:<15} {:>6} {:>8.2f}\n", r.name, status_name(r.status), "-",
                       r.cases, r.seconds);
    }
  }
  const MutationSummary s = summarize(results);
  t += fmt::format(
      "killed {} of {} ({} survived, {} skipped); median cases to the first failure {:g}; "
      "largest shrunk case B={} H={}; {} failure(s) shared with the unmutated control\n",
      s.killed, s.killed + s.survived, s.survived, s.skipped, s.median_cases, s.max_batch,
      s.max_heads, s.control_failures);
  return t;
}

nlohmann::ordered_json mutants_to_json(const MutationOptions& o,
                                       const std::vector<MutantResult>& results) {
  nlohmann::ordered_json j;
  j["format"] = "mlafuzz-mutants";
  j["version"] = 1;
  j["commit"] = build_commit();
  j["backend_kind"] = o.python_backends.empty() ? mutant_kind_name(o.kind) : "python";
  if (!o.python_backends.empty()) j["backends"] = o.python_backends;
  j["seed"] = o.seed;
  j["budget_seconds"] = o.budget_seconds;
  j["max_cases"] = o.max_cases;
  j["shrink_evaluations"] = o.shrink.max_evaluations;
  j["shrink_seconds"] = o.shrink.max_seconds;
  const MutationSummary s = summarize(results);
  j["summary"] = {{"killed", s.killed},
                  {"survived", s.survived},
                  {"skipped", s.skipped},
                  {"suspect", s.suspect},
                  {"median_cases_to_kill", s.median_cases},
                  {"max_shrunk_batch", s.max_batch},
                  {"max_shrunk_heads", s.max_heads},
                  {"control_failures", s.control_failures}};
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const MutantResult& r : results) {
    nlohmann::ordered_json m;
    m["mutant"] = r.name;
    m["backend"] = r.backend;
    m["base"] = r.base;
    if (!r.description.empty()) m["description"] = r.description;
    m["status"] = r.status == MutantStatus::kKilled     ? "killed"
                  : r.status == MutantStatus::kSurvived ? "survived"
                                                        : "skipped";
    if (r.status == MutantStatus::kSkipped) {
      m["reason"] = r.skip_reason;
    } else {
      m["cases"] = r.cases;
      m["seconds"] = r.seconds;
      m["control_failures"] = r.control_failures;
      if (r.control_failures > 0) m["control_failure_example"] = r.control_failure_example;
    }
    if (r.status == MutantStatus::kKilled) {
      m["property"] = r.property;  // on the shrunk case
      m["first_property"] = r.first_property;
      m["case_index"] = r.failing_index;
      m["detail"] = r.detail;
      m["shrunk"] = {{"batch", r.batch},
                     {"heads", r.heads},
                     {"topk", r.topk},
                     {"valid_tokens", r.valid_tokens},
                     {"steps", r.shrink_steps},
                     {"evaluations", r.shrink_evaluations},
                     {"seconds", r.shrink_seconds},
                     {"budget_exhausted", r.shrink_stopped_by != ShrinkStop::kFixedPoint},
                     {"stopped_by", shrink_stop_name(r.shrink_stopped_by)}};
      if (!r.saved_path.empty()) m["shrunk"]["path"] = r.saved_path;
      if (r.shrunk) m["shrunk"]["case"] = case_to_json_value(*r.shrunk);
      m["control_passed"] = r.control_passed;
      if (!r.control_passed) m["control_detail"] = r.control_detail;
    }
    list.push_back(std::move(m));
  }
  j["mutants"] = std::move(list);
  return j;
}

}  // namespace mlafuzz
