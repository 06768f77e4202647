// The canonical walk and the cause set of a finding.
//
// A shrunk failing case still carries whatever features the random case it came from had (a
// layout, a page size, a sink, an order of pages, values, ...). The canonical walk moves every
// feature, one at a time, toward one canonical case, keeping a move only when the failure
// persists. Each feature's values are ordered from canonical to not, and a move only goes down
// that order:
//
//   size       1 row, 1 query token, 1 head, no extra cache (or merged into the main list), few
//              valid entries (half of a row's many made -1 at once, then each made -1 in place,
//              then fewer positions), few pages
//   data       data_seed 0 then 1, q values of the case's own positions; values small integers,
//              then small integers of 1/16, then normal; scales 1, then random around 1
//              (tiles differ), then the writer's; logits neither large (|x| >= 64) nor small
//              (|x| <= 1/4), decided on the logits themselves and moved by scaling q by 8 or
//              1/8; a value move from large or small logits also tried with q scaled back to
//              them (keeping_logit_range)
//   geometry   MODEL1 with nope 512 and rope 64 (a padded nope: 448), identity page order,
//              minimum page stride, page size 64 (else 61, 1, 2: an entry keeps its page and
//              slot), each valid entry on the lowest unused slot (else the last slot of page 0,
//              the first and the last slot of page 1)
//   lists      no invalid entry, no row without a valid entry, no duplicate, no topk_length
//              (an entry it masks holds a valid index: a kernel that reads masked entries reads
//              a token)
//   the rest   no sink (else 0, -inf, +inf), default sm_scale and conventions, zero pad fill,
//              no head or row padding
//
// The walk ends (a fixed point of every move, no case visited twice), and two cases of one
// failure meet in the same canonical case more often than not, whichever seed found them. What
// the walk cannot remove is the failure's cause set: the features still present on the result
// that some move inside the envelope would remove, each described in fixed, coarse words
// ("topk_length < topk", "-1 entry", "sink = -inf", "page_size not a power of two", "entry
// beyond the first page").
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/case.h"
#include "core/envelope.h"
#include "properties/shrink.h"

namespace mlafuzz {

// One feature a canonical case does not have: its description on a case (empty when canonical
// there) and the moves toward the canonical case (candidates, most canonical first).
struct CanonicalFeature {
  const char* name;
  std::function<std::vector<std::string>(const Case&)> describe;
  std::function<std::vector<Case>(const Case&)> toward;
  // Whether the moves change the values the case's tokens hold (relabelled tokens, other dims,
  // value or scale specs): a failure that needs particular values may go away with them
  // whatever the feature, so robust_causes (triage.h) asks more evidence of them.
  bool changes_values = false;
};

// Every feature, in the order cause sets list them.
const std::vector<CanonicalFeature>& canonical_features();

// The walk's steps: every feature's moves, sizes first, then the data, then the structure.
std::vector<ShrinkStep> canonical_steps();

// The largest |logit| of a case (sm_scale q . K over every row's valid entries, the oracle's):
// +inf when one is not finite, 0 for none. A case is said to have large logits from 64 on, small
// ones up to 1/4 (the feature "logit range", moved by scaling q by 8 or 1/8: the same draws).
double max_abs_logit(const Case& c);

// `m`, a move that changes values from a case whose largest |logit| is `most`, with q scaled by
// a power of two so that its logits are in that case's range again: when the case's logits are
// large (small) and m's are not. nullopt otherwise. The walk tries it after `m`, and a
// value-changing feature is a cause only when this candidate loses the failure too: a failure that
// needs large logits, not the particular values or scales that gave them, walks to the canonical
// values and names "large logits" whichever draw found it.
std::optional<Case> keeping_logit_range(double most, const Case& m);

// The walk from `c` (explicit indices) within `limits`: greedy_shrink over canonical_steps(),
// remembering rejected candidates (`still_fails` must be deterministic). `rejected` may be
// null; `hooks` as for shrink_case.
ShrinkResult canonicalize_case(const Case& c, const std::function<bool(const Case&)>& still_fails,
                               const ShrinkLimits& limits, const Envelope& envelope = {},
                               std::set<std::string>* rejected = nullptr,
                               const ShrinkHooks& hooks = {});

// Whether cases write the same file as `c` (to_json(other) == to_json(c)), without writing their
// explicit index lists, most of a large case's text: lists are written in full whenever they are
// not empty (shaped by s_q, itself written), so unequal lists write unequal files and equal ones
// the same text, and the rest of the two files decides. c must outlive the matcher.
class SameCaseFile {
 public:
  explicit SameCaseFile(const Case& c);
  bool operator()(const Case& other) const;
  // Whether a and b hold the same explicit index lists (main and extra cache).
  static bool same_lists(const Case& a, const Case& b);

 private:
  const Case& c_;
  std::string rest_;  // to_json(c) without its index lists
};

// The cause set of a case the walk ended on: the descriptions of the features still present
// that a move inside `envelope` would remove, in the order of canonical_features(). Empty: the
// failure shows on the canonical case itself.
std::vector<std::string> cause_set(const Case& c, const Envelope& envelope = {});

}  // namespace mlafuzz
