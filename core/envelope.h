// What a kernel accepts (its envelope) and which exact invariants it promises.
//
// Every backend declares an Envelope (in BackendTraits): the built-in kernels their launchers'
// real limits, plugins through mlafuzz_plugin_envelope (include/mlafuzz/plugin.h, ABI version 2),
// `python:` kernels through their decorator, and a campaign may narrow it further with
// `mlafuzz fuzz --envelope FILE.json`. The generator draws inside the intersection of the selected
// backends' envelopes and the shrinker never leaves it; Backend::unsupported stays the final word.
//
// The JSON form (docs/plugins.md, "Envelopes") is the C struct's: every key optional, a missing key
// means "no constraint", unknown keys are rejected with the field named.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/case.h"

namespace mlafuzz {

// A set of integers: v is in it when every given constraint holds (empty `values`, or a 0 for
// min/max, or multiple_of <= 1 constrain nothing) -- MlafuzzIntSet's rule.
struct IntSet {
  std::vector<int32_t> values;  // allowed values (empty: any)
  int32_t min = 0;              // v >= min (0: none)
  int32_t max = 0;              // v <= max (0: none)
  int32_t multiple_of = 0;      // v % multiple_of == 0 (<= 1: none)

  bool constrained() const { return !values.empty() || min != 0 || max != 0 || multiple_of > 1; }
  bool contains(int64_t v) const;
  // The member of the set inside [lo, hi] nearest to v (ties: the smaller), or nullopt when the
  // set has no member in [lo, hi]. The generator snaps each drawn dimension with it, so that a
  // weighted choice keeps its weight on the nearest admissible value.
  std::optional<int32_t> nearest(int64_t v, int64_t lo, int64_t hi) const;
  // Members inside [lo, hi], ascending, at most `limit` of them.
  std::vector<int32_t> members(int64_t lo, int64_t hi, size_t limit = 64) const;
  // "any", "{448}", "[1, 64]", "multiple of 64", joined with ", ".
  std::string describe() const;

  friend bool operator==(const IntSet&, const IntSet&) = default;
};

// Both constraints at once (values filtered by the other set, max of mins, min of maxes, lcm of
// the multiples).
IntSet intersect(const IntSet& a, const IntSet& b);

// Features a kernel may refuse (Envelope::refuses), bit for bit MlafuzzFeature.
enum Feature : uint32_t {
  kFeatureSink = 1u << 0,
  kFeatureInfiniteSink = 1u << 1,
  kFeatureTopkLength = 1u << 2,
  kFeatureExtraCache = 1u << 3,
  kFeatureExtraTopkLength = 1u << 4,
  kFeatureQHeadPad = 1u << 5,
  kFeatureOutHeadPad = 1u << 6,
  kFeatureRowPad = 1u << 7,
  kFeatureAll = (1u << 8) - 1,
};
// "sink", "infinite_sink", "topk_length", "extra_cache", "extra_topk_length", "q_head_pad",
// "out_head_pad", "row_pad" (nullptr for a bit that is no feature).
const char* feature_name(uint32_t bit);

// Exact invariants a kernel may promise, bit for bit MlafuzzInvariance. A backend declares the
// ones it does NOT promise (Backend::inexact_invariants); those are checked within the tolerance
// bound instead of bit for bit.
enum Invariant : uint32_t {
  kInvariantBatch = 1u << 0,          // batch-alone
  kInvariantHead = 1u << 1,           // head-alone
  kInvariantDeterministic = 1u << 2,  // determinism
  kInvariantPagePlacement = 1u << 3,  // relocate
  kInvariantQuery = 1u << 4,          // query-alone (s_q > 1)
  kInvariantAll = (1u << 5) - 1,
};
// "batch", "head", "deterministic", "page_placement", "query" (nullptr for another bit).
const char* invariant_name(uint32_t bit);
// Names -> bits; throws std::invalid_argument naming an unknown name and the known ones.
uint32_t parse_invariants(const std::vector<std::string>& names);
// "batch, head" ("none" for 0).
std::string describe_invariants(uint32_t bits);

inline constexpr uint32_t kAllLayouts = 0x3;  // 1 << Layout::kModel1 | 1 << Layout::kV32
inline constexpr uint32_t kBothValues = 0x3;  // both values of a two-valued convention
// Every invalid-index rule, kOutOfRange (bit 2) included. kOutOfRange is opt-in: an envelope
// that does not name it (the default, a plugin's 0, a JSON envelope without the key) excludes
// it, so that kernels written before it never receive indices past the cache.
inline constexpr uint32_t kAllInvalidIndexRules = 0x7;
inline constexpr uint32_t kSinkExcluded = 0x1;  // sink_in_lse bit 0: sink excluded from the LSE
inline constexpr uint32_t kSinkIncluded = 0x2;  // bit 1: included

struct Envelope {
  // Masks hold the allowed values (bit 1 << value); unlike the C struct, 0 means "none allowed"
  // (an empty intersection): the conversions from C and JSON map "0 / absent" to all bits.
  uint32_t layouts = kAllLayouts;
  IntSet nope_dim, rope_dim, scale_tile, page_size;
  int64_t page_stride_multiple = 0;  // bytes (0: any)
  IntSet batch, heads, topk, s_q, extra_topk, extra_page_size;
  uint32_t invalid_index_rules = kBothValues;  // bit 1 << mla::InvalidIndexRule (opt-in bit 2)
  uint32_t v32_scales = kBothValues;           // bit 1 << ScaleConvention the V32 reader reads
  uint32_t empty_row_lses = kBothValues;       // bit 1 << mla::EmptyRowLse
  uint32_t sink_in_lse = kBothValues;          // kSinkExcluded | kSinkIncluded
  uint32_t refuses = 0;                        // Feature bits

  bool allows(mla::Layout l) const { return (layouts >> static_cast<int>(l)) & 1u; }
  bool allows(mla::InvalidIndexRule r) const {
    return (invalid_index_rules >> static_cast<int>(r)) & 1u;
  }
  bool allows(mla::EmptyRowLse e) const { return (empty_row_lses >> static_cast<int>(e)) & 1u; }
  bool allows(ScaleConvention s) const { return (v32_scales >> static_cast<int>(s)) & 1u; }
  bool allows_sink_in_lse(bool in) const { return (sink_in_lse >> (in ? 1 : 0)) & 1u; }
  bool refuses_feature(uint32_t f) const { return (refuses & f) != 0; }
  // The stride the generator gives a page: the smallest multiple of page_stride_multiple that
  // is >= `at_least`.
  int64_t stride_at_least(int64_t at_least) const;

  // Accepts every case (the default envelope).
  bool unconstrained() const;
  // Why `c` lies outside the envelope ("heads 65 not in [1, 64]"), or nullopt when inside.
  std::optional<std::string> rejects(const Case& c) const;
  // Why no case lies inside (an empty intersection: "no layout left", "topk: no value in
  // [1, 512]" ...), or nullopt. `max_topk` etc. are the generator's own ranges.
  std::optional<std::string> empty_reason(int max_batch, int max_heads, int max_topk,
                                          int max_page_size) const;
  // One line per constrained field, for `plugin-info` and the campaign banner ("" when none).
  std::string describe() const;

  friend bool operator==(const Envelope&, const Envelope&) = default;
};

Envelope intersect(const Envelope& a, const Envelope& b);

// The envelope of the built-in kernels' host models (cpu-simt, cpu-mma), which mirror the CUDA
// launchers' limits (kernels/cuda/launch.h and device_common.cuh common_unsupported) -- 16 <= nope
// <= 512 (a multiple of 16), rope <= 64 (a multiple of 16), scale tile a multiple of 8,
// B <= 65535; both layouts, every convention, sinks (+-inf too), topk_length, padded strides,
// s_q > 1 and the extra cache (the production decode).
// Every invalid-index rule (out_of_range too) and both V32 scale conventions.
Envelope builtin_kernel_envelope();
// Every case, out_of_range included: the float64 oracles, and where a campaign starts before
// the backends and --envelope narrow it.
Envelope any_case_envelope();
// The CUDA kernels' envelope (cuda-simt, cuda-mma): builtin_kernel_envelope() (the production
// decode included: s_q > 1, the extra cache, H up to 128 and beyond), without out_of_range and
// with power-of-two V32 scales only: what their device code has been run on. The MMA mutants
// (cuda-mma~<mutant>) refuse the extra cache on top of it.
Envelope cuda_kernel_envelope();

// JSON (docs/plugins.md, "Envelopes"). from_json is strict: unknown keys, wrong types, unknown
// names, negative numbers raise std::invalid_argument naming the field ("envelope.heads.max: ...").
nlohmann::ordered_json envelope_to_json(const Envelope& e);
Envelope envelope_from_json(const nlohmann::ordered_json& j, const std::string& path = "envelope");
// Reads and parses FILE (errors name the file and the field).
Envelope load_envelope(const std::string& path);

}  // namespace mlafuzz
