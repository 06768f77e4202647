// From a failing case to a finding a person reads, one per bug: the canonical minimal case, the
// group it belongs to, and where it fails.
//
//   1. size shrink: shrink_case with the failing property alone (same_failure_predicate),
//      within half the evaluations;
//   2. canonical walk (canonicalize_case, canonical.h) keeping a direct failure (run or
//      tolerance: the case judged as it is) while there is one. A failure that only shows under
//      a property's transformation is first turned into a direct one where a recipe can say the
//      transformation (pages relocated: tokens on page 1 and a padded stride; -1 entries
//      inserted; lists reversed; an entry moved into an extra list; NaN or garbage pad fill);
//      where it cannot, the walk keeps any selected property failing, and tries again at its
//      end. So the same bug, whichever property found it, walks to the same canonical case;
//   3. every selected property evaluated on the minimal case: the failing ones are listed with
//      the finding; the first of them in property-table order (run, tolerance, poison, ...) is
//      its primary failure, which names the failure kind;
//   4. the cause set: the features the walk could not remove that its failure needs with most
//      draws of the values (robust_causes), and "only when <transformation>" for a failure only
//      a transformation shows; the group signature is backend | failure kind | cause set (never
//      the property nor the random shape), so one bug found by several properties, by several
//      shards or on another night's seed is one group;
//   5. the locus, on the minimal case: which outputs are wrong (the primary failure's elements
//      by column range, scale group, nope or rope part, query row and head), which cache entries
//      it needs (those whose removal makes the failure go away) and the minimal case's inputs
//      inline when they are small.
//
// Every evaluation of steps 1, 2, 4 and 5 counts against one ShrinkLimits (a count of
// evaluations, `--shrink-evals`), so the result depends on the kernel and the failing case only.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/case.h"
#include "core/envelope.h"
#include "properties/evaluate.h"
#include "properties/shrink.h"

namespace mlafuzz {

enum class FailureKind {
  kBoundExcess,        // a finite element beyond its bound
  kNonfiniteMismatch,  // +inf, -inf or NaN where the reference has another class
  kBitwiseDifference,  // a bitwise property's runs differ
  kGuardWrite,         // output guard or gap elements overwritten
  kRunError,           // the backend returned an error
  kFault,              // the backend crashed, hung or exited (a worker's fault)
};
// "bound excess", "non-finite mismatch", "bitwise difference", "guard write", "run error",
// "fault".
const char* failure_kind_name(FailureKind k);
// The kind of a failed outcome (property "fault": the campaign's fault pseudo-property).
FailureKind failure_kind(const PropertyOutcome& o);

// The failure that names a group: the first failed outcome in property-table order.
const PropertyOutcome* primary_failure(const std::vector<PropertyOutcome>& failures);

// The cause set of a group: cause_set(minimal, envelope), and "only when <transformation>"
// (property_table.h) when the primary failure only shows under its property's transformation.
std::vector<std::string> group_causes(const Case& minimal, const PropertyOutcome& primary,
                                      const Envelope& envelope);

// "<backend> | <kind> | <cause>; <cause>", with "fails on the canonical case" for an empty cause
// set.
std::string group_signature(const std::string& backend, FailureKind kind,
                            const std::vector<std::string>& causes);

// The causes of cause_set that hold whatever the values. The draws of the values: the case's
// data_seed and data_seeds 0 to 4, and 5 to 10 too when the case fails with fewer than two
// thirds of those. A feature counts when each of its moves (the first four) fails with less
// than half as many draws as the case does: a feature a failure needs only through the values it
// happens to give leaves the rate where it was. When the case fails with fewer than two thirds of
// the draws (the values decide), the features whose moves change the tokens' values
// (CanonicalFeature::changes_values) are no cause. At most `max_evaluations` evaluations (added
// to *evaluations); a draw not evaluated within them counts as passing.
std::vector<std::string> robust_causes(const Case& c, const Envelope& envelope,
                                       const std::function<bool(const Case&)>& still_fails,
                                       int max_evaluations, int* evaluations);

// The backends a failure names ("a", or "a|b" for a pair), found in `backends`.
std::vector<Backend*> failure_backends(const std::string& names,
                                       const std::vector<Backend*>& backends);

// Whether the failure's backend (or pair) still fails any of `properties` (empty: all) on a
// case: the failing property first, the others only when it passes.
std::function<bool(const Case&)> any_failure_predicate(const PropertyOutcome& failure,
                                                       const std::vector<Backend*>& backends,
                                                       const std::vector<std::string>& properties);

// Steps 1 and 2 within one `limits`: shrink_case with `size_fails` (within half the
// evaluations), then canonicalize_case with `canonical_fails` from where it stopped (skipped
// when `hooks` stopped it); `hooks` as for shrink_case, over both.
ShrinkResult shrink_canonical(const Case& failing,
                              const std::function<bool(const Case&)>& size_fails,
                              const std::function<bool(const Case&)>& canonical_fails,
                              const ShrinkLimits& limits, const Envelope& envelope,
                              const ShrinkHooks& hooks = {});

// Where a finding fails, on its minimal case.
struct Locus {
  std::string outputs;  // "out[b0,h0] wrong only in d 384..447 (scale group 6); lse[b0,h0] wrong"
  std::string entries;  // "needs entry 1 (token 127: page 1, slot 63 = last slot of the page)"
  std::string inputs;   // the minimal case inline (when small), as a falsifying example
  std::string text() const;  // the three joined by "; "
};

// The outputs part: which outputs `wrong` (of an outcome on case c) names, in words.
std::string describe_wrong(const Case& c, const WrongOutputs& wrong);

// The entries part: each entry of c removed in turn (a valid or masked entry made -1, an
// invalid one dropped from a one-row list); an entry is needed when `still_fails` then says no.
// At most `max_probes` evaluations (added to *evaluations); `needed` (may be null) receives the
// needed tokens (logical slots of the main cache).
std::string needed_entries(const Case& c, const std::function<bool(const Case&)>& still_fails,
                           int max_probes, int* evaluations, std::vector<int32_t>* needed);

// The inputs part: geometry, index lists, lengths, sinks, the scales of `tokens` (all valid
// tokens when empty; at most four) and the value specs; "" when the case is too large to print.
std::string inline_inputs(const Case& c, const std::vector<int32_t>& tokens);

struct TriageOptions {
  std::vector<std::string> properties;  // the campaign's (empty: all)
  ShrinkLimits limits;
  Envelope envelope;
  std::function<bool()> stopping;  // when it says true, every predicate says "passes"
  // For the size shrink and the walk (shrink_case): each accepted move, and a stop asked before
  // each evaluation. A triage they stop (ShrinkStop::kStopped) evaluates nothing more: its
  // failure is the one given, its causes those of the case so far.
  ShrinkHooks hooks;
};

struct Triage {
  Case minimal;                           // explicit index lists
  bool reproduced = true;                 // false: no property fails on `minimal` any more
  std::vector<PropertyOutcome> failures;  // on `minimal`, property-table order (with `wrong`)
  PropertyOutcome primary;                // the first of `failures` (the failure when none)
  FailureKind kind = FailureKind::kBoundExcess;
  std::vector<std::string> causes;
  std::string signature;
  Locus locus;
  int steps = 0, evaluations = 0;  // accepted moves; evaluations, the locus's included
  ShrinkStop stopped_by = ShrinkStop::kFixedPoint;
  double seconds = 0;
  bool stopped_by_limit() const { return stopped_by != ShrinkStop::kFixedPoint; }
};

// Steps 1 to 5 for `failure` (an outcome of evaluate_case on `failing` with `backends`).
Triage triage_failure(const Case& failing, const PropertyOutcome& failure,
                      const std::vector<Backend*>& backends, const TriageOptions& options);

}  // namespace mlafuzz
