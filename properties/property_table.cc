// The property table (property_table.h).
#include "properties/property_table.h"

#include <algorithm>
#include <array>
#include <stdexcept>

namespace mlafuzz {
namespace {

// The bitwise properties compare bit for bit, except that NaNs of any sign or payload are equal
// (properties.h, bitwise_equal).

// The Eigen oracle is the fast reference, not a kernel: its vectorized products peel and block
// by buffer alignment and matrix shape, so float64 sums (and their last bit) change order from
// run to run and with B or H. oracle-loop keeps every bitwise property.
constexpr const char* kEigenNotBitwise =
    "Eigen's products order float64 sums by buffer alignment and shape (last-bit differences); "
    "oracle-loop holds this property";

using K = PropertyKind;
constexpr std::array<PropertyInfo, 13> kTable = {{
    {PropertyId::kRun, "run", K::kRun, nullptr, false,
     "the backend returned ok (error/fault fail it; unsupported: not applicable)", nullptr},
    {PropertyId::kTolerance, "tolerance", K::kBounded,
     "the Eigen oracle is the reference (oracle-loop is checked against it)", false,
     "every out/lse element within its bound against the float64 oracle", nullptr},
    {PropertyId::kPoison, "poison", K::kBitwise, kEigenNotBitwise, false,
     "bytes a correct kernel never reads poisoned: output bitwise identical, guards untouched",
     "unread bytes are poisoned"},
    {PropertyId::kRelocate, "relocate", K::kBitwise, kEigenNotBitwise, false,
     "pages in another physical order and stride: bitwise identical", "pages are relocated"},
    {PropertyId::kBatchAlone, "batch-alone", K::kBitwise, kEigenNotBitwise, false,
     "each batch row computed alone: bitwise identical", "a batch row runs alone"},
    {PropertyId::kHeadAlone, "head-alone", K::kBitwise, kEigenNotBitwise, false,
     "a head computed alone: bitwise identical", "a head runs alone"},
    {PropertyId::kDeterminism, "determinism", K::kBitwise, kEigenNotBitwise, false,
     "two runs bitwise identical", "the case runs twice"},
    {PropertyId::kPermute, "permute", K::kBounded, nullptr, false,
     "index lists permuted: within the bound of the clean run", "the index lists are permuted"},
    {PropertyId::kInsertInvalid, "insert-invalid", K::kBounded, nullptr, false,
     "-1 entries inserted into the index lists: within the bound of the clean run",
     "-1 entries are inserted"},
    {PropertyId::kMmaVsSimt, "mma-vs-simt", K::kBounded, nullptr, true,
     "an MMA backend against its SIMT partner within the sum of both bounds", nullptr},
    {PropertyId::kQueryAlone, "query-alone", K::kBitwise, kEigenNotBitwise, false,
     "each query token of a row (s_q > 1) computed alone: bitwise identical",
     "a query token runs alone"},
    {PropertyId::kMoveToExtra, "move-to-extra", K::kBounded, nullptr, false,
     "valid entries moved from the main list into the extra list, or the two caches swapped: "
     "within the sum of both runs' bounds",
     "entries move to the extra list"},
    {PropertyId::kSplitAgree, "split-agree", K::kBounded, nullptr, false,
     "a split-KV backend rerun with 1 split and with one split per tile: within the sum of both "
     "runs' bounds",
     "the split count changes"},
}};

constexpr bool table_in_id_order() {
  for (size_t i = 0; i < kTable.size(); ++i) {
    if (static_cast<size_t>(kTable[i].id) != i) return false;
  }
  return true;
}
static_assert(table_in_id_order(), "kTable rows must follow the PropertyId order");

}  // namespace

std::span<const PropertyInfo> property_table() { return kTable; }

const PropertyInfo& property_info(PropertyId id) { return kTable[static_cast<size_t>(id)]; }

const PropertyInfo* find_property(std::string_view name) {
  for (const auto& p : kTable) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

bool has_error_figures(std::string_view name) {
  const PropertyInfo* p = find_property(name);
  return p != nullptr && p->has_error_figures();
}

std::vector<std::string> all_properties() {
  std::vector<std::string> names;
  for (const auto& p : kTable) names.emplace_back(p.name);
  return names;
}

void sort_properties(std::vector<std::string>& names) {
  const auto rank = [](const std::string& n) {
    const PropertyInfo* p = find_property(n);
    return p == nullptr ? -1 : static_cast<int>(p->id);
  };
  std::stable_sort(names.begin(), names.end(),
                   [&](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
}

std::string known_properties() {
  std::string s;
  for (const auto& p : kTable) s += (s.empty() ? "" : ", ") + std::string(p.name);
  return s;
}

void check_property_names(const std::vector<std::string>& names) {
  for (const auto& n : names) {
    if (find_property(n) == nullptr) {
      throw std::invalid_argument("unknown property '" + n + "' (known: " + known_properties() +
                                  ")");
    }
  }
}

std::optional<std::string> off_by_design(const PropertyInfo& p, const Backend& backend) {
  if (backend.traits().is_reference && p.off_on_reference != nullptr) return p.off_on_reference;
  if (p.id == PropertyId::kSplitAgree && !backend.traits().splits_kv) {
    return "the backend does not split the KV list (split-KV backends: cpu-mma-split*, "
           "cuda-mma-split*)";
  }
  return std::nullopt;
}

}  // namespace mlafuzz
