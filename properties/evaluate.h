// Evaluating a case: every property on every backend, against the float64 oracle and the
// tolerance model. The property layer's public API is four headers, one per job:
//   properties/generate.h  (seed, case_index) -> Case recipe
//   properties/evaluate.h  Case -> MaterializedCase -> backends -> PropertyOutcome (this one)
//   properties/shrink.h    a failing Case -> a minimal one
//   properties/corpus.h    findings and corpus entries
// Everything is deterministic: the same (seed, case_index, GenConfig) gives the same Case on
// every machine and compiler, and the same Case gives the same outcomes for deterministic
// backends.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/case.h"
#include "core/envelope.h"
#include "properties/property_table.h"

namespace mlafuzz {

struct OracleResult;  // oracle/oracle.h

// The properties (what each checks, its kind, where it applies) are the table in
// properties/property_table.h: all_properties(), property_info(), has_error_figures().
//   "run" is always evaluated; a failed run skips the backend's other properties for this case.
//   "tolerance" compares against the float64 oracle (properties/tolerance.h), +inf/-inf/NaN
//   positions identical; "permute" and "insert-invalid" compare a transformed run with the clean
//   one within the tolerance model (summation order changes); "mma-vs-simt" an MMA backend with
//   its SIMT partner (Backend::simt_partner(), e.g. cpu-mma|cpu-simt) within the sum of both
//   bounds; the bitwise ones (poison, relocate, batch-alone, head-alone, determinism) compare
//   bit for bit.

// Which outputs a failed comparison found wrong (filled when EvalOptions::locus is set): elements
// beyond their bound (the tolerance model's rule, element by element) or, for the bitwise
// properties, whose bits differ (NaNs of any sign or payload equal). Rows are query rows
// r = b * s_q + s of the case the property checked.
struct WrongOutputs {
  std::vector<std::pair<int32_t, int32_t>> out_rows;  // (query row, head) with a wrong out element
  std::vector<int32_t> out_columns;                   // columns wrong in some row, sorted
  std::vector<std::pair<int32_t, int32_t>> lse_rows;  // (query row, head) with a wrong lse
  int64_t guard_written = 0;                          // output guard or gap elements overwritten
  bool empty() const { return out_rows.empty() && lse_rows.empty() && guard_written == 0; }
};

struct PropertyOutcome {
  std::string property;    // one of all_properties()
  std::string backend;     // "cpu-mma", ...; "cuda-mma|cuda-simt" for mma-vs-simt pairs
  bool applicable = true;  // false: switched off for this backend/case by design (why: detail)
  bool passed = true;
  std::string detail;  // worst element: coordinates (b, h, d), value, reference, error, bound,
                       // error/bound; or the reason it is not applicable / the run error
  // Worst element (d = -1 for an lse element; all -1 when not element-wise).
  int worst_b = -1, worst_h = -1, worst_d = -1;
  double error = 0, bound = 0;  // of the worst element (error/bound = tightness)
  double max_abs = 0, mean_abs = 0, max_rel = 0, cos_diff = 0, lse_max_abs = 0;
  double tightness = 0;  // max over finite elements of error / bound (out and lse); 0 for bitwise
  // +inf/-inf/NaN at a position where the reference has another class (or a finite value):
  // failed whatever the finite elements' tightness; ranked above every finite excess.
  bool nonfinite_mismatch = false;
  // The run itself (the clean run, or the run of a transformed case) failed: error or fault.
  // No figures; ranked with the bitwise failures.
  bool run_failed = false;
  // poison: the kernel wrote output guard or gap elements (canaries).
  bool guard_written = false;
  double out_max_ref = 0;  // max |reference out|, for error-vs-magnitude plots
  // Reported, never asserted (tolerance only): FlashMLA's check_is_allclose verdict for out and
  // lse with its published tolerances, and the original test's figures are max_abs, mean_abs,
  // max_rel, lse_max_abs above.
  bool flashmla_pass = true;
  double seconds = 0;  // backend time spent on this property
  WrongOutputs wrong;  // failed outcomes with EvalOptions::locus only
};

// Where one case's evaluation spent its (wall) time, step by step (the campaign side
// of a case; the report's "campaign.case_breakdown" sums them over cases). The steps follow
// each other on the case's thread, so they add up to about `wall`; `thread_cpu` is that
// thread's CPU time over the same span: wall minus thread_cpu is time spent waiting (for a
// worker's reply, for the device: a CUDA synchronization may also spin, which counts as CPU).
enum class CaseStep : int {
  kGenerate,     // the recipe (generate_case; the campaign times it)
  kMaterialize,  // recipe -> buffers (values drawn, the cache written)
  kCleanRuns,    // every backend's clean run, widening included
  kOracle,       // the float64 oracle
  kBounds,       // tolerance bounds: the clean case's pipelines and the transformed cases'
  kVariants,     // building the transformed cases (poison, relocation, rows alone, ...)
  kVariantRuns,  // the backends' runs of the transformed cases (one batch each)
  kChecks,       // the property checks: comparisons, bound checks, widening of variants
  kCount,
};
inline constexpr int kCaseStepCount = static_cast<int>(CaseStep::kCount);
const char* case_step_name(CaseStep s);

struct CaseSteps {
  std::array<double, kCaseStepCount> seconds{};
  double wall = 0;        // the whole span timed (generation, when timed, included)
  double thread_cpu = 0;  // CPU time of the evaluating thread over that span
  double& operator[](CaseStep s) { return seconds[static_cast<int>(s)]; }
  double operator[](CaseStep s) const { return seconds[static_cast<int>(s)]; }
  CaseSteps& operator+=(const CaseSteps& o) {
    for (int i = 0; i < kCaseStepCount; ++i) seconds[i] += o.seconds[i];
    wall += o.wall;
    thread_cpu += o.thread_cpu;
    return *this;
  }
};

// CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID), in seconds.
double thread_cpu_seconds();

struct CaseEvaluation {
  std::vector<PropertyOutcome> outcomes;
  double seconds = 0;         // wall time of the whole evaluation
  double oracle_seconds = 0;  // of which the oracle (run once per case and reused)
  CaseSteps steps;            // where `seconds` went (kGenerate: 0 here; the campaign adds it)
  bool failed() const;        // any applicable outcome that did not pass
  // The failed outcomes, worst first (failure_worse).
  std::vector<const PropertyOutcome*> failures() const;
};

// Order of failed outcomes, worst first: exact failures (failed runs, properties without error
// figures such as the bitwise ones, an excess over a bound of 0), then non-finite mismatches,
// then by tightness; ties keep evaluation order.
bool failure_worse(const PropertyOutcome& a, const PropertyOutcome& b);

struct EvalOptions {
  // Poison variants per case (each one a different fill: NaN encodings, infinities, garbage).
  int poison_variants = 2;
  // Report FlashMLA's and the original test's metrics (cheap; on by default).
  bool reference_metrics = true;
  // Fill PropertyOutcome::wrong of every failed outcome (where a finding fails: its locus).
  bool locus = false;
};

// Runs every selected property (empty = all) on every backend. Backends receive
// MaterializedCases that differ from the recipe's materialization (poisoned bytes, relocated
// pages, single rows/heads): a Backend proxy to a worker process must ship the buffers, not the
// recipe. The float64 oracle runs once per case on the calling thread. Throws CaseError when the
// recipe is invalid (a generator or corpus bug, never a backend failure).
CaseEvaluation evaluate_case(const Case& c, const std::vector<Backend*>& backends,
                             const std::vector<std::string>& properties);
CaseEvaluation evaluate_case(const Case& c, const std::vector<Backend*>& backends,
                             const std::vector<std::string>& properties,
                             const EvalOptions& options);

// The verdict of clean runs already made (`mlafuzz run`): for each (backend, its run of
// materialize(c)), the "run" outcome and, when the run succeeded, the "tolerance" outcome, each
// computed by the same code as in evaluate_case (the oracle run here once, its own error added
// to every bound, the bf16 rounding rule of the backend's precision). One verdict for a case,
// whichever command judges it.
std::vector<PropertyOutcome> judge_runs(
    const MaterializedCase& m, const std::vector<std::pair<Backend*, const RunResult*>>& runs,
    const EvalOptions& options = {});

// The per-element bound the `tolerance` property applies to backend `be` on case m, against
// ref = run_oracle_eigen(m): the backend's own (its pipeline's, or its declared abs/rel
// tolerances) plus the float64 oracle's; absolute, out [B * s_q, H, d_v] and lse [B * s_q, H].
// An lse element passes when |lse - ref| <= bound; a bf16 out element when the distance from
// the reference to its rounding interval is <= bound (tolerance.h). `mlafuzz run --dump` writes
// it, so that a kernel replayed elsewhere (mlafuzz.replay) is judged by the same numbers.
struct ElementBounds {
  std::vector<double> out, lse;
};
ElementBounds tolerance_bounds(const MaterializedCase& m, const OracleResult& ref,
                               const Backend& be);

// One-paragraph human-readable form of an outcome: property, backend, worst element with its
// coordinates and error/bound (no repro command: the caller knows the path).
std::string format_outcome(const PropertyOutcome& o);

}  // namespace mlafuzz
