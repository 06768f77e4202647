// The properties as a typed table: one descriptor per property, the only place that says what a
// property is (its kind, whether it has error figures, which backends it applies to and why
// not). Evaluation, campaign statistics, reports, HTML and JUnit all read it; no other code
// lists property names.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/backend.h"

namespace mlafuzz {

// In the order of the table (the order all_properties() lists and campaigns report).
enum class PropertyId {
  kRun,
  kTolerance,
  kPoison,
  kRelocate,
  kBatchAlone,
  kHeadAlone,
  kDeterminism,
  kPermute,
  kInsertInvalid,
  kMmaVsSimt,
  kQueryAlone,  // the production decode (docs/SPEC.md section 8)
  kMoveToExtra,
  kSplitAgree,  // split-KV backends
};

enum class PropertyKind {
  kRun,      // the backend returned kOk; no figures
  kBounded,  // compared within the tolerance model: error figures (tightness, max abs, ...)
  kBitwise,  // compared bit for bit: a failure has a position, no error figures
};

struct PropertyInfo {
  PropertyId id;
  const char* name;  // as users write it (--properties) and reports print it
  PropertyKind kind;
  // Applies to the reference backend (Backend::is_reference(), the Eigen oracle); when not,
  // `off_on_reference` says why (the outcome is "not applicable" with that reason).
  const char* off_on_reference;  // nullptr: applies
  // Evaluated on a pair: an MMA backend and its SIMT partner (Backend::simt_partner()); backends
  // without a partner have no outcome of it.
  bool needs_simt_partner;
  const char* summary;  // one line, for --help and docs
  // What the property does to the case before it compares, as a cause of a failure that only
  // shows there ("-1 entries are inserted"); nullptr for run, tolerance and mma-vs-simt, which
  // judge the case as it is.
  const char* transformation;

  // Outcomes carry error figures (error, bound, tightness, max abs, ...): plotted, percentiled
  // and printed with the outcome. The bounded properties, and only them.
  bool has_error_figures() const { return kind == PropertyKind::kBounded; }
};

// Every property, in evaluation-listing order.
std::span<const PropertyInfo> property_table();

const PropertyInfo& property_info(PropertyId id);
// nullptr for a name that is no property (e.g. the campaign's pseudo-property "fault").
const PropertyInfo* find_property(std::string_view name);
// Whether outcomes of `name` carry error figures; false for names that are no property.
bool has_error_figures(std::string_view name);

// Names in table order.
std::vector<std::string> all_properties();
// Sorts property names into table order (names that are no property, such as the campaign's
// pseudo-property "fault", first), keeping the order of equal ones.
void sort_properties(std::vector<std::string>& names);
// "run, tolerance, poison, ..." (for messages and --help).
std::string known_properties();
// Throws std::invalid_argument "unknown property 'x' (known: run, tolerance, ...)" for the first
// name that is not in the table.
void check_property_names(const std::vector<std::string>& names);

// Why `p` is switched off for `backend` by design (applicable = false, never loosened), or
// nullopt when it applies. Pairs (mma-vs-simt) are not judged here: they need two backends.
std::optional<std::string> off_by_design(const PropertyInfo& p, const Backend& backend);

}  // namespace mlafuzz
