// Greedy recipe shrinking: shrink_case and its limits (the API), then the steps. The steps, in the
// order they are tried, each kept only when the candidate still fails the same property on the same
// backend:
//   fewer rows (halves, then the single failing row), a simpler extra cache (none, no
//   extra_topk_length, half of each extra list, identity page order, minimum stride, own
//   values), fewer query tokens (halves, then one), fewer heads (halves, then one), fewer
//   tokens (halve topk, drop halves of every list, then single entries), topk_length removed,
//   fewer pages (compact the used pages), identity page order, minimum stride, scales fixed at
//   127 (scale 1; 1.5 for fp32 V32 scales) or the writer's, power-of-two V32 scales (the
//   default convention), small-integer values, no sink, default sm_scale and
//   conventions, zero pad fill, no q/out head padding, and last fewer valid tokens in place
//   (valid entries turned into -1, halving chunks then single ones: the others keep their token
//   tiles).
// Passes repeat until none is accepted (a fixed point) or a limit is reached (ShrinkLimits below: a
// count of evaluations, which makes the result independent of the machine's speed, and a wall-clock
// cap as a safety net). The order is fixed, so a shrink is deterministic when its predicate is.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "core/case.h"
#include "properties/evaluate.h"

namespace mlafuzz {

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

// ---- The steps ----

// One simplification of a recipe: a name for logs and the candidates it proposes (possibly
// none), simplest first.
struct ShrinkStep {
  std::string name;
  std::function<std::vector<Case>(const Case&)> candidates;
};

// The steps above, in order. Candidates keep explicit index lists consistent with batch, topk,
// topk_length and the page count.
const std::vector<ShrinkStep>& shrink_steps();

// The greedy loop of shrink_case (above) over any steps: each pass tries the steps in order
// and takes the first candidate `still_fails` accepts, until a pass takes none (a fixed point) or
// a limit is reached. Candidates that are invalid, equal to the current case or outside
// `envelope` are skipped without an evaluation. With `rejected`, a candidate whose JSON is in it
// is skipped too and every rejected candidate is added (a deterministic predicate says the same
// of the same case), and a case already visited is never taken again (no cycle). `hooks` as for
// shrink_case.
ShrinkResult greedy_shrink(const Case& start, const std::vector<ShrinkStep>& steps,
                           const std::function<bool(const Case&)>& still_fails,
                           const ShrinkLimits& limits, const Envelope& envelope,
                           std::set<std::string>* rejected, const ShrinkHooks& hooks = {});

// A recipe's size, for tests and reports: rows, heads, valid selected tokens.
struct CaseSize {
  int rows = 0, heads = 0, topk = 0, valid_tokens = 0, pages = 0;
  int s_q = 1, extra_topk = 0;  // the production decode: query tokens, extra list length (0: none)
};
CaseSize case_size(const Case& c);

}  // namespace mlafuzz
