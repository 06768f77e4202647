// The public face of the property layer: generate a case, evaluate every property on every
// backend, shrink a failure, save and load corpus entries. `mlafuzz fuzz`, `mlafuzz repro`,
// `mlafuzz mutants` and the tests use only this header.
//
// Data flows one way: (seed, case_index) -> Case recipe -> MaterializedCase -> backends ->
// PropertyOutcome -> shrink -> corpus entry. Everything here is deterministic: the same
// (seed, case_index, GenConfig) gives the same Case on every machine and compiler, and the
// same Case gives the same outcomes for deterministic backends.
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

// ---------------------------------------------------------------------------------------------
// Generation
// ---------------------------------------------------------------------------------------------

// The envelope of generated cases. Defaults: everything on, production sizes reachable but rare.
// Every generated case stays inside every built-in backend's envelope (nope <= 512, rope <= 64
// and a multiple of 16, nope a multiple of the scale tile), so `unsupported` only fires for
// plugins with a narrower envelope.
struct GenConfig {
  int max_batch = 32;   // B in [1, max_batch]; small (<= 4) most of the time
  int max_heads = 128;  // H in [1, max_heads]; small most of the time, 32/64/128 sometimes
  int max_topk = 512;   // topk in [1, max_topk]
  int max_pages = 64;   // logical pages in the cache
  int max_page_size = 256;
  // The production decode (docs/SPEC.md section 8): query tokens per batch row in [1, max_s_q]
  // (1 most of the time) and an extra cache (about a quarter of the cases) when extra_cache.
  int max_s_q = 4;
  bool extra_cache = true;
  int max_extra_topk = 1024;
  // Work budget of one case, B * s_q * H * (topk + extra_topk): production shapes shrink B to
  // stay within it (a case stays a fraction of a second on the CPU backends).
  int64_t max_work = int64_t{1} << 20;
  // Probability that a case uses a production shape: FlashMLA's MODEL1 decode configurations
  // (H 64 or 128, s_q 1-4, main topk 128 over P = 256, with an extra cache of topk 512 over
  // P = 64 or 1024 over P = 2, or without one; B up to max_batch, a few B = 74, within
  // max_work; MODEL1 448 + 64); clipped to the envelope above.
  double production_probability = 0.05;
  bool model1 = true;  // layouts allowed (at least one must be true)
  bool v32 = true;
  bool other_dims = true;      // nope/rope dims other than the layout's production ones
  bool sinks = true;           // attention sinks (finite, +inf, -inf)
  bool special_values = true;  // special values (0, -0, largest finite, subnormals) in q, K, rope
  bool non_default_conventions = true;  // SGLang/vLLM conventions as well as FlashMLA's
  bool poison_fills = true;             // pad_fill NaN/garbage (q/out head padding, stride padding)
  // Batch-row gaps: index rows longer than topk, LSE rows longer than H, q and out rows beyond
  // H * head stride (every stride of the plugin ABI varied, not only the head strides).
  bool row_pads = true;
  // What the selected backends accept, intersected with `mlafuzz fuzz --envelope` (envelope.h).
  // Each drawn dimension is constrained to it (snapped to the nearest admissible value, so that
  // the edge classes stay reachable inside it), never rejection-sampled; generate_case throws
  // std::invalid_argument when it admits no case (Envelope::empty_reason).
  Envelope envelope;
  // Generator families to draw from (weights fixed in generators.cc); empty = all. Names as
  // all_generator_families() lists them: "general" (dependent random recipe), "edge" (one
  // targeted edge class per case: empty rows, all invalid, topk_length 0, +-inf sinks, page
  // boundaries, large logits, ties, extreme scales, and the extra cache's: an extra list all
  // invalid, extra_topk_length 0, one token in both lists, one cache empty and the other not,
  // extra pages of 1-3 tokens), "production" (production shapes only).
  std::vector<std::string> families;
};

std::vector<std::string> all_generator_families();

// Deterministic: the same (seed, case_index, cfg) gives the same Case on every machine.
// `tags` (may be null) receives classification strings, RC_TAG-like, for distribution reports:
// "layout=model1", "page_size=61", "page_size=pow2", "stride=padded", "page_order=shuffled",
// "has_invalid", "all_invalid", "topk_length=0", "topk%64!=0", "duplicates", "sink=+inf",
// "values=large", "scales=random", "family=edge", "shape=production", ...
Case generate_case(uint64_t seed, uint64_t case_index, const GenConfig& cfg,
                   std::vector<std::string>* tags);

// ---------------------------------------------------------------------------------------------
// Evaluation
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Shrinking
// ---------------------------------------------------------------------------------------------

// How long a shrink may go on. The count of evaluations decides where a shrink stops, so a
// failure shrinks to the same case on any machine and under any load; the wall-clock cap is a
// safety net against a slow predicate (a production-size case, a hanging worker), and a shrink
// it stops depends on the machine's speed.
// (The CLI's caps, `fuzz --shrink-time` and `mutants --shrink-budget`, default to 30 s.)
struct ShrinkLimits {
  int max_evaluations = 1000;  // calls of still_fails; the CPU mutants of seeds 1-5 need <= 88
  double max_seconds = 300;    // safety net
};

// Why a shrink stopped.
enum class ShrinkStop {
  kFixedPoint,   // no step simplifies the case any further: the result is minimal
  kEvaluations,  // ShrinkLimits::max_evaluations spent (deterministic)
  kSeconds,      // ShrinkLimits::max_seconds spent (depends on the machine's speed)
  kStopped,      // ShrinkHooks::stop said so
};
// "fixed point", "evaluations", "seconds" or "stopped".
const char* shrink_stop_name(ShrinkStop s);

struct ShrinkResult {
  Case minimal;         // explicit index lists; still fails `still_fails`
  int steps = 0;        // accepted simplifications
  int evaluations = 0;  // calls of still_fails
  double seconds = 0;
  ShrinkStop stopped_by = ShrinkStop::kFixedPoint;
  bool budget_exhausted() const { return stopped_by != ShrinkStop::kFixedPoint; }
};

// Greedy recipe shrinking within `limits`: fewer rows (keeping a failing one), fewer heads,
// fewer tokens, fewer pages, identity page order, minimum stride, scale 1, small integer values,
// no sink, zero pad fill, no padding, no topk_length (properties/shrink.h lists the steps in
// their fixed order). Each step is kept only if `still_fails` says the candidate still fails. A
// candidate that throws CaseError is rejected without an evaluation.
// Candidates outside `envelope` (the one the case was generated in, GenConfig::envelope) are
// never tried: the shrink never leaves it.
struct ShrinkHooks {
  // Each accepted simplification, as it is accepted: a caller keeps the case so far, whatever
  // cuts the shrink short.
  std::function<void(const Case&)> on_step;
  // Asked before each evaluation: true ends the shrink with the case so far
  // (ShrinkStop::kStopped): a campaign that stops, a failure whose every step hangs.
  std::function<bool()> stop;
};
ShrinkResult shrink_case(const Case& failing, const std::function<bool(const Case&)>& still_fails,
                         const ShrinkLimits& limits, const Envelope& envelope = {},
                         const ShrinkHooks& hooks = {});

// The predicate the campaign usually wants: evaluates only `property` on the named backend (and
// its SIMT partner for mma-vs-simt, found in `backends`) and says whether it still fails.
// `last_failure` (when given, it must outlive the predicate) receives the failed outcome of
// each case the predicate says still fails.
std::function<bool(const Case&)> same_failure_predicate(const PropertyOutcome& failure,
                                                        const std::vector<Backend*>& backends,
                                                        PropertyOutcome* last_failure = nullptr);

// ---------------------------------------------------------------------------------------------
// Corpus
// ---------------------------------------------------------------------------------------------

// kCorpusFormatVersion (core/case.h) 2: the finding is a group (kind, causes,
// properties, locus, inputs) and the file is named by its signature; version-1 entries load and
// replay unchanged (their group fields empty).

// A class of raw failures a finding folds: the property and the shape class of the failing case
// as it was generated (before shrinking), how many failures of the class it saw, and the first.
struct RawFailure {
  std::string property, shape_class;
  int64_t count = 0;
  uint64_t seed = 0, case_index = 0;
  std::string repro;  // regenerates the first case and reruns the property
};

// One finding, one bug: the group of every failure whose minimal case walks to the same
// canonical case (properties/triage.h). The corpus entry's record and the report's, one struct
// for both (the field table in properties/corpus.cc says which document holds which field).
struct Finding {
  // Both documents. `signature` is the group's: backend | failure kind | cause set. `property`
  // is the primary failure's (the first failing property, in table order, on the minimal case).
  std::string property, backend, signature;
  // The backends as the campaign was given them, with files made absolute
  // (absolute_backend_name; "a,b" for a pair): `mlafuzz repro` runs these, from any directory.
  // Empty in entries written before it existed (repro then uses `backend`).
  std::string backend_source;
  uint64_t seed = 0, case_index = 0;  // the first case of the group (the representative)
  double tightness = 0;               // of the finite elements
  bool nonfinite_mismatch = false;    // PropertyOutcome::nonfinite_mismatch
  int64_t count = 1;                  // raw failures folded into the group
  // The group (empty in version-1 corpus entries and reports).
  std::string kind;                     // failure_kind_name of the primary failure
  std::vector<std::string> causes;      // the cause set
  std::vector<std::string> properties;  // every property failing on the minimal case
  std::string locus;                    // where: the wrong outputs and the entries needed
  std::string inputs;                   // the minimal case inline, when small
  // The corpus entry.
  std::string detail;  // the outcome's worst element (PropertyOutcome::detail)
  double error = 0, bound = 0;
  std::string commit;                                  // MLAFUZZ_GIT_COMMIT baked at build time
  std::string gpu_name, driver_version, cuda_version;  // empty when not found on a GPU
  std::string host, found_at;                          // hostname; ISO 8601 UTC time
  std::string expect = "pass";  // "pass": every property must pass (regression entries);
                                // "fail": the finding is expected to persist (known bug)
  // The report (filled by the campaign).
  std::string shape_class;  // of the minimal case
  bool shrunk = false;
  // Both documents, left out when empty: why the case is not shrunk to the end (the campaign
  // stopped while shrinking it, its shrink steps kept hanging, a shrink limit, shrinking off).
  // Empty when the shrink reached a fixed point.
  std::string shrink_note;
  // The report, left out when empty: the known-failure ledger entry that matches the finding
  // (harness/campaign/ledger.h): its id (issue URL or ticket) and note.
  std::string known, known_note;
  // The report of a night (harness/campaign/lifecycle.h), left out when empty: the group's state
  // across nights and the night it entered it; the replays of a new group and how many failed.
  std::string state, state_since;
  int64_t flaky_runs = 0, flaky_failures = 0;
  std::string summary;  // format_outcome of the minimal case ("detail" in report.json)
  std::string corpus_path, repro;
  std::vector<std::string> corpus_entries;  // every shard's entry for this group
  std::vector<RawFailure> raw;              // the raw failure classes folded, first seen first
};

// Fills property/backend/detail/error figures from an outcome, commit/host/time from this
// build and machine, and the group (kind, causes, signature) from the outcome and `minimal`
// as it is (triage_failure finds the canonical minimal case first).
Finding make_finding(const PropertyOutcome& o, const Case& minimal, uint64_t seed,
                     uint64_t case_index);

// Coarse class of a case: layout, B/H/topk buckets, page-size class, features
// ("model1 B1 H1 T1-2 P=pow2 invalid sink" style). Raw failures are classed by it before
// shrinking (a failure of a known class is not shrunk again).
std::string shape_class(const Case& c);

// Writes {"format":"mlafuzz-corpus","version":2,"case":{...},"finding":{...}} atomically into
// `dir` (created if missing) under a name derived from the signature (corpus_file_name); returns
// the path. Saving the same group again overwrites the same file.
std::string save_corpus_entry(const std::string& dir, const Case& minimal, const Finding& f);

struct CorpusEntry {
  Case c;
  Finding f;
  std::string path;
};

// Loads a corpus entry, or a bare case file (then f has expect = "pass" and nothing else).
// Throws CaseError naming the offending field.
CorpusEntry load_corpus_entry(const std::string& path);

// Sorted *.json files of a corpus folder (empty if the folder does not exist).
std::vector<std::string> list_corpus(const std::string& dir);

// "<this mlafuzz> repro /absolute/PATH --backends NAME" (backends omitted when empty), which
// runs as pasted (command_to_run_again, core/command.h).
std::string repro_command(const std::string& path, const std::string& backends);

// Build commit taken at every build (cmake/build_commit.cmake): 12 hex digits, "-dirty" when
// tracked files differed from it, "unknown" outside a git checkout.
const char* build_commit();

}  // namespace mlafuzz
