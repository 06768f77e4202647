// Greedy recipe shrinking (shrink_case in evaluate.h). The steps, in the order they are tried,
// each kept only when the candidate still fails the same property on the same backend:
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
// Passes repeat until none is accepted (a fixed point) or a limit is reached (ShrinkLimits in
// evaluate.h: a count of evaluations, which makes the result independent of the machine's speed,
// and a wall-clock cap as a safety net). The order is fixed, so a shrink is deterministic when
// its predicate is.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "core/case.h"
#include "properties/evaluate.h"

namespace mlafuzz {

// One simplification of a recipe: a name for logs and the candidates it proposes (possibly
// none), simplest first.
struct ShrinkStep {
  std::string name;
  std::function<std::vector<Case>(const Case&)> candidates;
};

// The steps above, in order. Candidates keep explicit index lists consistent with batch, topk,
// topk_length and the page count.
const std::vector<ShrinkStep>& shrink_steps();

// The greedy loop of shrink_case (evaluate.h) over any steps: each pass tries the steps in order
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
