// Mutation score (`mlafuzz mutants`): how good is mlafuzz at catching real bugs?
//
// Every planted bug of mla/mutants.h is built as a variant of the MMA kernel (GPU)
// or of its host model cpu-mma (CPU). For each, a campaign of generated cases runs every
// property on the mutant until the first failure or the budget; the failure is shrunk to a
// minimal case. A mutant is KILLED when some property fails on it, SURVIVED when the budget runs
// out first. Each kill is checked against a control: the unmutated backend must pass the same
// property on the same case: a failure the control shares (a tolerance-model gap or a bug of the
// base kernel) is reported apart and never counts as a kill. Shrinking keeps a smaller case when
// the mutant fails an enabled property on it that the control passes: the killing property as
// far as it goes, then any (a race between rows fails determinism only from three rows up, but
// its stray stores may still show through poison on one row).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/case.h"
#include "mla/mutants.h"
#include "properties/evaluate.h"
#include "properties/generate.h"
#include "properties/shrink.h"

namespace mlafuzz {

enum class MutantKind {
  kCpu,  // cpu-mma~<mutant> (kernels/host/host_mutants.h), in process
  kGpu,  // cuda-mma~<mutant> (kernels/cuda/cuda_mutants.h), in an isolated worker process
};

struct MutationOptions {
  MutantKind kind = MutantKind::kCpu;
  uint64_t seed = 1;
  double budget_seconds = 60;           // per mutant: wall time to the first failure
  uint64_t max_cases = 100000;          // per mutant: cases to the first failure
  ShrinkLimits shrink{1000, 30};        // per killed mutant (both phases of shrink_kill)
  std::vector<mla::Mutant> only;        // empty: the whole catalogue
  GenConfig gen;                        // the generator's default distribution unless changed
  std::vector<std::string> properties;  // empty: all
  std::string save_dir;              // when set, each shrunk case is saved there as <mutant>.json
  double case_timeout_seconds = 60;  // GPU: a case running longer is a hang (a kill)
  std::string worker_exe;            // GPU: the mlafuzz executable (default: this one)
  // Non-empty: score the planted bugs these python: kernels declare instead of the catalogue
  // ("python:<file>:<func>", "triton-mma", "triton-simt"; their modules' MUTANTS, each run as
  // the backend <kernel>~<name>). Every kernel and mutant runs in its own Python worker process
  // (isolation.h): a crash, os._exit or a hang past case_timeout_seconds is a fault outcome of
  // the "run" property (a kill when the control runs that case), never the end of mutants.
  // Cases are drawn inside the kernel's declared envelope and shrinking stays in it.
  std::vector<std::string> python_backends;
  std::vector<std::string> only_names;  // python_backends: mutant names to score (empty: all)
};

enum class MutantStatus { kKilled, kSurvived, kSkipped };

struct MutantResult {
  mla::Mutant mutant = mla::Mutant::kNone;
  std::string name;     // mutant_name(), or the name a python: kernel's MUTANTS declares
  std::string base;     // the unmutated backend (the control): "cpu-mma", "python:/x/k.py:decode"
  std::string backend;  // "cpu-mma~no-rescale", "python:/x/k.py:decode~sink-ignored"
  std::string description;  // python: kernels: MUTANTS' description of the planted bug
  MutantStatus status = MutantStatus::kSkipped;
  std::string skip_reason;

  // Killed: the first failure and the failure on the shrunk case.
  std::string property;        // the property the mutant fails on the shrunk case
  std::string first_property;  // the property it failed on the first failing case (the one
                               // generated at failing_index); differs when shrinking moved on
  std::string detail;          // format_outcome of the failure on the shrunk case
  uint64_t cases = 0;          // cases run up to and including the first failure (or all, survived)
  double seconds = 0;          // to the first failure (or the whole budget)
  uint64_t failing_index = 0;  // case index of the first failure (seed, index regenerate it)

  // The shrunk case and its size.
  std::optional<Case> shrunk;
  int batch = 0, heads = 0, topk = 0, valid_tokens = 0;  // valid: over all rows
  int shrink_steps = 0;
  int shrink_evaluations = 0;
  double shrink_seconds = 0;
  ShrinkStop shrink_stopped_by = ShrinkStop::kFixedPoint;  // which limit, if any, stopped it
  std::string saved_path;  // where the shrunk case was saved, if save_dir was set

  // Control: the unmutated backend on the shrunk case, same property. Kills and shrinking
  // require it to pass, so false means the control is not deterministic: a suspect kill.
  bool control_passed = true;
  std::string control_detail;
  // Failures on the way that the unmutated backend shares (not kills): a gap of the tolerance
  // model or a bug of the base kernel, reported for a person to look at.
  uint64_t control_failures = 0;
  std::string control_failure_example;  // the first: seed, case index and the outcome
};

// Catalogue entries for a kind: every mutant except kNone/kCount. Mutants a kind cannot build
// come back kSkipped with the reason (e.g. kMissingBarrier on the CPU: a GPU race).
std::vector<mla::Mutant> all_mutants();
std::optional<mla::Mutant> mutant_from_name(const std::string& name);
const char* mutant_kind_name(MutantKind k);

// Runs the mutation campaign. `progress` (may be empty) is called after each mutant.
// Throws std::runtime_error when the kind cannot run in this build (GPU without CUDA), or a
// python: kernel cannot be loaded, is unavailable, or does not declare a mutant of only_names.
std::vector<MutantResult> run_mutants(const MutationOptions& o,
                                      const std::function<void(const MutantResult&)>& progress);

// A kill shrunk to a minimal case (run_mutants does it for each killed mutant).
struct ShrunkKill {
  Case minimal;             // explicit index lists
  PropertyOutcome failure;  // the mutant's failure on `minimal`; the control passes its property
  int steps = 0;            // accepted simplifications
  int evaluations = 0;      // calls of the shrink predicate, both phases
  ShrinkStop stopped_by = ShrinkStop::kFixedPoint;
};

// Shrinks `failing`, on which `mutant` fails `first` and `control` passes first.property, to a
// minimal case on which the mutant still fails some property of `properties` (empty: all; "run"
// always) that the control passes on the same case. Two greedy phases (shrink_case's steps,
// then entries invalidated in place) within one `limits` for both: first.property alone, then any
// property from where that stopped. In the second, each candidate is checked with first.property
// first and with the others only when it does not fail (every evaluation runs the kernels).
ShrunkKill shrink_kill(const Case& failing, const PropertyOutcome& first, Backend& mutant,
                       Backend& control, const std::vector<std::string>& properties,
                       const ShrinkLimits& limits, const Envelope& envelope = {});

// Summary figures: killed/survived/skipped counts and the median cases to the first failure.
struct MutationSummary {
  int killed = 0, survived = 0, skipped = 0, suspect = 0;
  double median_cases = 0;           // over killed mutants
  int max_batch = 0, max_heads = 0;  // over shrunk cases
  int control_failures = 0;          // over all mutants
};
MutationSummary summarize(const std::vector<MutantResult>& results);

// The human-readable table and the versioned JSON report ("mlafuzz-mutants", version 1).
std::string format_mutant_table(const std::vector<MutantResult>& results);
nlohmann::ordered_json mutants_to_json(const MutationOptions& o,
                                       const std::vector<MutantResult>& results);

}  // namespace mlafuzz
