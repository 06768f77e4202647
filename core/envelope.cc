// Envelopes and invariance claims (see envelope.h).
#include "core/envelope.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "core/fileio.h"
#include "core/json_fields.h"

namespace mlafuzz {
namespace {

using Json = nlohmann::ordered_json;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Effective bounds of a set inside [lo, hi].
void clip(const IntSet& s, int64_t& lo, int64_t& hi) {
  if (s.min != 0) lo = std::max<int64_t>(lo, s.min);
  if (s.max != 0) hi = std::min<int64_t>(hi, s.max);
}

int64_t lcm_capped(int64_t a, int64_t b) {
  if (a <= 1) return b;
  if (b <= 1) return a;
  const int64_t l = std::lcm(a, b);
  return std::min(l, kInt32Max);
}

const char* const kFeatureNames[] = {
    "sink",       "infinite_sink", "topk_length", "extra_cache", "extra_topk_length",
    "q_head_pad", "out_head_pad",  "row_pad"};
const char* const kInvariantNames[] = {"batch", "head", "deterministic", "page_placement", "query"};

std::string mask_names(uint32_t mask, const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) {
    if ((mask >> i) & 1u) s += (s.empty() ? "" : ", ") + names[i];
  }
  return s.empty() ? "none" : s;
}

const std::vector<std::string> kLayoutNames = {"model1", "v32"};
const std::vector<std::string> kInvalidRuleNames = {"minus_one_only", "any_negative",
                                                    "out_of_range"};
const std::vector<std::string> kScaleConventionNames = {"power_of_two", "fp32"};
const std::vector<std::string> kEmptyLseNames = {"+inf", "-inf"};

// ---- JSON reading ----

[[noreturn]] void bad(const std::string& path, const std::string& why) {
  throw std::invalid_argument(path + ": " + why);
}

int32_t read_int(const Json& j, const std::string& path, int64_t lo = 0) {
  if (!j.is_number_integer()) bad(path, "expected an integer, got " + j.dump());
  const int64_t v = j.get<int64_t>();
  if (v < lo || v > kInt32Max) {
    bad(path, "must be in [" + std::to_string(lo) + ", " + std::to_string(kInt32Max) + "], got " +
                  std::to_string(v));
  }
  return static_cast<int32_t>(v);
}

// An integer set: a number (exactly it), a list of numbers, or an object with values / min /
// max / multiple_of.
IntSet read_set(const Json& j, const std::string& path) {
  IntSet s;
  if (j.is_number()) {
    s.values = {read_int(j, path, 1)};
    return s;
  }
  if (j.is_array()) {
    if (j.empty()) bad(path, "an empty list allows nothing (leave the key out for 'any')");
    for (size_t i = 0; i < j.size(); ++i) {
      s.values.push_back(read_int(j[i], path + "[" + std::to_string(i) + "]", 1));
    }
    return s;
  }
  if (!j.is_object()) bad(path, "expected a number, a list or {values, min, max, multiple_of}");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string k = it.key(), p = path + "." + k;
    if (k == "values") {
      s.values = read_set(it.value(), p).values;
      if (!it.value().is_array()) bad(p, "expected a list");
    } else if (k == "min") {
      s.min = read_int(it.value(), p);
    } else if (k == "max") {
      s.max = read_int(it.value(), p);
    } else if (k == "multiple_of") {
      s.multiple_of = read_int(it.value(), p);
    } else {
      bad(p, "unknown key (known: values, min, max, multiple_of)");
    }
  }
  if (s.min != 0 && s.max != 0 && s.min > s.max) {
    bad(path, "min " + std::to_string(s.min) + " > max " + std::to_string(s.max));
  }
  return s;
}

Json write_set(const IntSet& s) {
  Json j = Json::object();
  if (!s.values.empty()) j["values"] = s.values;
  if (s.min != 0) j["min"] = s.min;
  if (s.max != 0) j["max"] = s.max;
  if (s.multiple_of > 1) j["multiple_of"] = s.multiple_of;
  return j;
}

// A list of names -> mask (bit i for names[i]).
uint32_t read_names(const Json& j, const std::string& path, const std::vector<std::string>& names) {
  if (!j.is_array()) bad(path, "expected a list of names");
  uint32_t mask = 0;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string p = path + "[" + std::to_string(i) + "]";
    if (!j[i].is_string()) bad(p, "expected a name, got " + j[i].dump());
    const auto it = std::find(names.begin(), names.end(), j[i].get<std::string>());
    if (it == names.end()) {
      std::string known;
      for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
      bad(p, "unknown name '" + j[i].get<std::string>() + "' (known: " + known + ")");
    }
    mask |= 1u << (it - names.begin());
  }
  if (mask == 0) bad(path, "an empty list allows nothing (leave the key out for 'any')");
  return mask;
}

Json write_names(uint32_t mask, const std::vector<std::string>& names) {
  Json j = Json::array();
  for (size_t i = 0; i < names.size(); ++i) {
    if ((mask >> i) & 1u) j.push_back(names[i]);
  }
  return j;
}

std::vector<std::string> feature_names() {
  return std::vector<std::string>(std::begin(kFeatureNames), std::end(kFeatureNames));
}

}  // namespace

// ---- IntSet ----

bool IntSet::contains(int64_t v) const {
  if (!values.empty() && std::find(values.begin(), values.end(), v) == values.end()) return false;
  if (min != 0 && v < min) return false;
  if (max != 0 && v > max) return false;
  if (multiple_of > 1 && v % multiple_of != 0) return false;
  return true;
}

std::optional<int32_t> IntSet::nearest(int64_t v, int64_t lo, int64_t hi) const {
  clip(*this, lo, hi);
  if (lo > hi) return std::nullopt;
  if (!values.empty()) {
    std::optional<int32_t> best;
    for (const int32_t x : values) {
      if (x < lo || x > hi || !contains(x)) continue;
      if (!best || std::llabs(x - v) < std::llabs(*best - v) ||
          (std::llabs(x - v) == std::llabs(*best - v) && x < *best)) {
        best = x;
      }
    }
    return best;
  }
  const int64_t m = multiple_of > 1 ? multiple_of : 1;
  const int64_t first = (lo + m - 1) / m * m;  // lo >= 0 here for every dimension
  const int64_t last = hi / m * m;
  if (first > last) return std::nullopt;
  const int64_t c = std::clamp(v, first, last);
  const int64_t down = c / m * m;
  const int64_t up = down == c ? c : down + m;
  int64_t pick = down;
  if (down < first || (up <= last && up - c < c - down)) pick = up;
  return static_cast<int32_t>(pick);
}

std::vector<int32_t> IntSet::members(int64_t lo, int64_t hi, size_t limit) const {
  std::vector<int32_t> out;
  clip(*this, lo, hi);
  if (!values.empty()) {
    for (const int32_t x : values) {
      if (x >= lo && x <= hi && contains(x)) out.push_back(x);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    if (out.size() > limit) out.resize(limit);
    return out;
  }
  const int64_t m = multiple_of > 1 ? multiple_of : 1;
  for (int64_t x = (lo + m - 1) / m * m; x <= hi && out.size() < limit; x += m) {
    out.push_back(static_cast<int32_t>(x));
  }
  return out;
}

std::string IntSet::describe() const {
  if (!constrained()) return "any";
  std::vector<std::string> parts;
  if (!values.empty()) {
    std::string s = "{";
    for (size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + std::to_string(values[i]);
    parts.push_back(s + "}");
  }
  if (min != 0 || max != 0) {
    parts.push_back("[" + (min != 0 ? std::to_string(min) : std::string("-")) + ", " +
                    (max != 0 ? std::to_string(max) : std::string("-")) + "]");
  }
  if (multiple_of > 1) parts.push_back("multiple of " + std::to_string(multiple_of));
  std::string s;
  for (const auto& p : parts) s += (s.empty() ? "" : " and ") + p;
  return s;
}

IntSet intersect(const IntSet& a, const IntSet& b) {
  IntSet r;
  r.min = std::max(a.min, b.min);
  r.max = a.max == 0 ? b.max : b.max == 0 ? a.max : std::min(a.max, b.max);
  r.multiple_of = static_cast<int32_t>(lcm_capped(a.multiple_of, b.multiple_of));
  if (!a.values.empty() || !b.values.empty()) {
    // A list: the values both sets contain, and nothing else to say.
    const IntSet& from = a.values.empty() ? b : a;
    std::vector<int32_t> kept;
    for (const int32_t v : from.values) {
      if (a.contains(v) && b.contains(v) && std::find(kept.begin(), kept.end(), v) == kept.end()) {
        kept.push_back(v);
      }
    }
    r = IntSet{};
    r.values = kept;
    // Every value excluded: an impossible set (values {0} with min 1: every dimension is
    // >= 0 and 0 < min), so that the intersection reads as empty instead of "any".
    if (r.values.empty()) {
      r.values = {0};
      r.min = 1;
    }
  }
  // min > max: an empty set (nearest() finds nothing), kept as it is so that it reads as empty.
  return r;
}

// ---- names ----

const char* feature_name(uint32_t bit) {
  for (int i = 0; i < 8; ++i) {
    if (bit == (1u << i)) return kFeatureNames[i];
  }
  return nullptr;
}

const char* invariant_name(uint32_t bit) {
  for (int i = 0; i < 5; ++i) {
    if (bit == (1u << i)) return kInvariantNames[i];
  }
  return nullptr;
}

uint32_t parse_invariants(const std::vector<std::string>& names) {
  uint32_t bits = 0;
  for (const auto& n : names) {
    bool found = false;
    for (int i = 0; i < 5; ++i) {
      if (n == kInvariantNames[i]) {
        bits |= 1u << i;
        found = true;
      }
    }
    if (!found) {
      throw std::invalid_argument("unknown invariant '" + n +
                                  "' (known: batch, head, deterministic, page_placement, query)");
    }
  }
  return bits;
}

std::string describe_invariants(uint32_t bits) {
  return mask_names(
      bits, std::vector<std::string>(std::begin(kInvariantNames), std::end(kInvariantNames)));
}

// ---- Envelope ----

int64_t Envelope::stride_at_least(int64_t at_least) const {
  if (page_stride_multiple <= 1) return at_least;
  return (at_least + page_stride_multiple - 1) / page_stride_multiple * page_stride_multiple;
}

bool Envelope::unconstrained() const { return *this == Envelope{}; }

std::optional<std::string> Envelope::rejects(const Case& c) const {
  const auto& g = c.geom;
  auto set = [](const char* what, int64_t v, const IntSet& s) -> std::optional<std::string> {
    if (s.contains(v)) return std::nullopt;
    return std::string(what) + " " + std::to_string(v) + " not in " + s.describe();
  };
  if (!allows(g.layout)) {
    return std::string("layout ") + layout_name(g.layout) + " not in {" +
           mask_names(layouts, kLayoutNames) + "}";
  }
  for (const auto& r :
       {set("nope_dim", g.nope_dim, nope_dim), set("rope_dim", g.rope_dim, rope_dim),
        set("scale_tile", g.scale_tile, scale_tile), set("page_size", g.page_size, page_size),
        set("batch", c.batch, batch), set("heads", c.heads, heads), set("topk", c.topk, topk)}) {
    if (r) return r;
  }
  const int64_t stride = g.page_stride == 0 ? mla::min_page_stride(g) : g.page_stride;
  if (page_stride_multiple > 1 && stride % page_stride_multiple != 0) {
    return "page_stride " + std::to_string(stride) + " not a multiple of " +
           std::to_string(page_stride_multiple);
  }
  // The production decode: query tokens per row and the extra cache.
  if (auto r = set("s_q", c.s_q, s_q)) return r;
  if (c.extra) {
    if (refuses_feature(kFeatureExtraCache)) return "refuses an extra cache";
    if (auto r = set("extra_topk", c.extra->topk, extra_topk)) return r;
    if (auto r = set("extra_page_size", c.extra->page_size, extra_page_size)) return r;
    if (c.extra->topk_length && refuses_feature(kFeatureExtraTopkLength)) {
      return "refuses extra_topk_length";
    }
  }
  if (!allows(c.conventions.invalid_index)) {
    return "invalid_index_rule " +
           kInvalidRuleNames[static_cast<size_t>(c.conventions.invalid_index)] + " not allowed";
  }
  if (g.layout == mla::Layout::kV32 && !allows(c.scales.convention)) {
    return std::string("v32 scales ") + scale_convention_name(c.scales.convention) + " not allowed";
  }
  if (!allows(c.conventions.empty_lse)) {
    return "empty_row_lse " + kEmptyLseNames[static_cast<size_t>(c.conventions.empty_lse)] +
           " not allowed";
  }
  if (!allows_sink_in_lse(c.conventions.sink_in_lse)) {
    return std::string("sink_in_lse ") + (c.conventions.sink_in_lse ? "true" : "false") +
           " not allowed";
  }
  if (c.sink && refuses_feature(kFeatureSink)) return "refuses a sink";
  if (c.sink && refuses_feature(kFeatureInfiniteSink)) {
    for (const double s : *c.sink) {
      if (std::isinf(s)) return "refuses an infinite sink";
    }
  }
  if (c.topk_length && refuses_feature(kFeatureTopkLength)) return "refuses topk_length";
  if (c.q_head_pad > 0 && refuses_feature(kFeatureQHeadPad)) return "refuses q head padding";
  if (c.out_head_pad > 0 && refuses_feature(kFeatureOutHeadPad)) return "refuses out head padding";
  if (refuses_feature(kFeatureRowPad) &&
      (c.q_batch_pad > 0 || c.out_batch_pad > 0 || c.indices_row_pad > 0 || c.lse_row_pad > 0)) {
    return "refuses row padding (batch-row gaps of q/out, index/LSE row gaps)";
  }
  return std::nullopt;
}

std::optional<std::string> Envelope::empty_reason(int max_batch, int max_heads, int max_topk,
                                                  int max_page_size) const {
  if ((layouts & kAllLayouts) == 0) return "no layout left";
  // A layout survives when its scale tile (64 MODEL1, 128 V32: the generator's) is allowed and
  // some nope dim, a multiple of it, is.
  bool any_layout = false;
  for (int l = 0; l < 2; ++l) {
    if (!((layouts >> l) & 1u)) continue;
    const int tile = l == 0 ? 64 : 128;
    IntSet n = nope_dim;
    n.multiple_of = static_cast<int32_t>(lcm_capped(n.multiple_of, tile));
    const bool scales = l == 0 || (v32_scales & kBothValues) != 0;
    if (scales && scale_tile.contains(tile) && n.nearest(tile, tile, 512)) any_layout = true;
  }
  if (!any_layout) {
    return "no layout with an allowed scale tile (model1: 64, v32: 128) and nope_dim (" +
           nope_dim.describe() + ", a multiple of the tile, <= 512)";
  }
  if (!rope_dim.nearest(64, 0, 64))
    return "rope_dim: no value in [0, 64] in " + rope_dim.describe();
  const struct {
    const char* name;
    const IntSet& s;
    int hi;
  } dims[] = {{"batch", batch, max_batch},
              {"heads", heads, max_heads},
              {"topk", topk, max_topk},
              {"page_size", page_size, max_page_size}};
  for (const auto& d : dims) {
    if (!d.s.nearest(1, 1, std::max(1, d.hi))) {
      return std::string(d.name) + ": no value in [1, " + std::to_string(std::max(1, d.hi)) +
             "] in " + d.s.describe();
    }
  }
  // The generator draws s_q in [1, 4] (GenConfig::max_s_q, at least 1); the extra cache is
  // optional, so its sets never empty the envelope.
  if (!s_q.nearest(1, 1, 4)) return "s_q: no value in [1, 4] in " + s_q.describe();
  if ((invalid_index_rules & kAllInvalidIndexRules) == 0) return "no invalid-index rule left";
  if ((empty_row_lses & kBothValues) == 0) return "no empty-row LSE convention left";
  if ((sink_in_lse & kBothValues) == 0) return "no sink_in_lse value left";
  return std::nullopt;
}

std::string Envelope::describe() const {
  std::ostringstream os;
  if (layouts != kAllLayouts) os << "layouts " << mask_names(layouts, kLayoutNames) << "\n";
  const struct {
    const char* name;
    const IntSet& s;
  } sets[] = {{"nope_dim", nope_dim},
              {"rope_dim", rope_dim},
              {"scale_tile", scale_tile},
              {"page_size", page_size},
              {"batch", batch},
              {"heads", heads},
              {"topk", topk},
              {"s_q", s_q},
              {"extra_topk", extra_topk},
              {"extra_page_size", extra_page_size}};
  for (const auto& s : sets) {
    if (s.s.constrained()) os << s.name << " " << s.s.describe() << "\n";
  }
  if (page_stride_multiple > 1) os << "page_stride multiple of " << page_stride_multiple << "\n";
  if (invalid_index_rules != kBothValues) {
    os << "invalid_index_rules " << mask_names(invalid_index_rules, kInvalidRuleNames) << "\n";
  }
  if (empty_row_lses != kBothValues) {
    os << "empty_row_lses " << mask_names(empty_row_lses, kEmptyLseNames) << "\n";
  }
  if (v32_scales != kBothValues) {
    os << "v32_scales " << mask_names(v32_scales, kScaleConventionNames) << "\n";
  }
  if (sink_in_lse != kBothValues) {
    os << "sink_in_lse " << mask_names(sink_in_lse, {"false", "true"}) << "\n";
  }
  if (refuses != 0) os << "refuses " << mask_names(refuses, feature_names()) << "\n";
  return os.str();
}

Envelope intersect(const Envelope& a, const Envelope& b) {
  Envelope r;
  r.layouts = a.layouts & b.layouts;
  r.nope_dim = intersect(a.nope_dim, b.nope_dim);
  r.rope_dim = intersect(a.rope_dim, b.rope_dim);
  r.scale_tile = intersect(a.scale_tile, b.scale_tile);
  r.page_size = intersect(a.page_size, b.page_size);
  r.page_stride_multiple = lcm_capped(a.page_stride_multiple, b.page_stride_multiple);
  r.batch = intersect(a.batch, b.batch);
  r.heads = intersect(a.heads, b.heads);
  r.topk = intersect(a.topk, b.topk);
  r.s_q = intersect(a.s_q, b.s_q);
  r.extra_topk = intersect(a.extra_topk, b.extra_topk);
  r.extra_page_size = intersect(a.extra_page_size, b.extra_page_size);
  r.invalid_index_rules = a.invalid_index_rules & b.invalid_index_rules;
  r.empty_row_lses = a.empty_row_lses & b.empty_row_lses;
  r.v32_scales = a.v32_scales & b.v32_scales;
  r.sink_in_lse = a.sink_in_lse & b.sink_in_lse;
  r.refuses = a.refuses | b.refuses;
  return r;
}

Envelope builtin_kernel_envelope() {
  Envelope e;
  e.nope_dim.min = 16;
  e.nope_dim.max = 512;
  e.nope_dim.multiple_of = 16;
  e.rope_dim.max = 64;
  e.rope_dim.multiple_of = 16;
  e.scale_tile.multiple_of = 8;
  e.batch.max = 65535;  // grid y limit
  e.invalid_index_rules = kAllInvalidIndexRules;
  return e;
}

Envelope any_case_envelope() {
  Envelope e;
  e.invalid_index_rules = kAllInvalidIndexRules;
  return e;
}

Envelope cuda_kernel_envelope() {
  // The kernels run the production decode (s_q > 1, the extra cache, any H): the launchers'
  // limits are the host models' (common_unsupported in device_common.cuh). Indices past the
  // cache and fp32 V32 scales wait for a GPU run before the device kernels are offered them.
  Envelope e = builtin_kernel_envelope();
  e.invalid_index_rules = kBothValues;
  e.v32_scales = 1u << static_cast<int>(ScaleConvention::kPowerOfTwo);
  return e;
}

// ---- JSON: one field table writes an envelope and reads it ----

namespace {

using EnvelopeField = fields::Field<Envelope>;

// A field written only where it constrains something (`keep`), read by `read`.
template <class K, class W, class R>
EnvelopeField envelope_field(std::string key, K keep, W write, R read) {
  EnvelopeField f;
  f.key = std::move(key);
  f.write = [keep, write](const Envelope& e, const fields::WriteStyle&) {
    return keep(e) ? Json(write(e)) : Json(Json::value_t::discarded);
  };
  f.read = [read](Envelope& e, const Json& v, const std::string& p) { read(e, v, p); };
  f.optional = true;
  return f;
}

EnvelopeField set_field(std::string key, IntSet Envelope::*m) {
  return envelope_field(
      std::move(key), [m](const Envelope& e) { return (e.*m).constrained(); },
      [m](const Envelope& e) { return write_set(e.*m); },
      [m](Envelope& e, const Json& v, const std::string& p) { e.*m = read_set(v, p); });
}

// A mask of names, written when it differs from `all` (the absent key's meaning).
EnvelopeField names_field(std::string key, uint32_t Envelope::*m, uint32_t all,
                          const std::vector<std::string>& (*names)()) {
  return envelope_field(
      std::move(key), [m, all](const Envelope& e) { return e.*m != all; },
      [m, names](const Envelope& e) { return write_names(e.*m, names()); },
      [m, names](Envelope& e, const Json& v, const std::string& p) {
        e.*m = read_names(v, p, names());
      });
}

const std::vector<std::string>& layout_names() { return kLayoutNames; }
const std::vector<std::string>& invalid_rule_names() { return kInvalidRuleNames; }
const std::vector<std::string>& empty_lse_names() { return kEmptyLseNames; }
const std::vector<std::string>& scale_convention_names() { return kScaleConventionNames; }
const std::vector<std::string>& refusable_names() {
  static const std::vector<std::string> names = feature_names();
  return names;
}

const fields::Table<Envelope>& envelope_fields() {
  auto always = [](const Envelope&) { return true; };
  static const fields::Table<Envelope> t = {
      envelope_field(
          "format", always, [](const Envelope&) { return "mlafuzz-envelope"; },
          [](Envelope&, const Json& v, const std::string& p) {
            if (v != "mlafuzz-envelope") bad(p, "expected \"mlafuzz-envelope\", got " + v.dump());
          }),
      envelope_field(
          "version", always, [](const Envelope&) { return 1; },
          [](Envelope&, const Json& v, const std::string& p) {
            if (v != 1) bad(p, "unknown version " + v.dump() + " (this mlafuzz reads version 1)");
          }),
      names_field("layouts", &Envelope::layouts, kAllLayouts, layout_names),
      set_field("nope_dim", &Envelope::nope_dim),
      set_field("rope_dim", &Envelope::rope_dim),
      set_field("scale_tile", &Envelope::scale_tile),
      set_field("page_size", &Envelope::page_size),
      set_field("batch", &Envelope::batch),
      set_field("heads", &Envelope::heads),
      set_field("topk", &Envelope::topk),
      set_field("s_q", &Envelope::s_q),
      set_field("extra_topk", &Envelope::extra_topk),
      set_field("extra_page_size", &Envelope::extra_page_size),
      envelope_field(
          "page_stride_multiple", [](const Envelope& e) { return e.page_stride_multiple > 1; },
          [](const Envelope& e) { return e.page_stride_multiple; },
          [](Envelope& e, const Json& v, const std::string& p) {
            e.page_stride_multiple = read_int(v, p);
          }),
      names_field("invalid_index_rules", &Envelope::invalid_index_rules, kBothValues,
                  invalid_rule_names),
      names_field("empty_row_lses", &Envelope::empty_row_lses, kBothValues, empty_lse_names),
      names_field("v32_scales", &Envelope::v32_scales, kBothValues, scale_convention_names),
      envelope_field(
          "sink_in_lse", [](const Envelope& e) { return e.sink_in_lse != kBothValues; },
          [](const Envelope& e) {
            Json s = Json::array();
            if (e.sink_in_lse & kSinkExcluded) s.push_back(false);
            if (e.sink_in_lse & kSinkIncluded) s.push_back(true);
            return s;
          },
          [](Envelope& e, const Json& v, const std::string& p) {
            if (!v.is_array() || v.empty()) bad(p, "expected a non-empty list of booleans");
            e.sink_in_lse = 0;
            for (size_t i = 0; i < v.size(); ++i) {
              if (!v[i].is_boolean()) {
                bad(p + "[" + std::to_string(i) + "]", "expected true or false");
              }
              e.sink_in_lse |= v[i].get<bool>() ? kSinkIncluded : kSinkExcluded;
            }
          }),
      names_field("refuses", &Envelope::refuses, 0, refusable_names)};
  return t;
}

}  // namespace

Json envelope_to_json(const Envelope& e) { return fields::write(e, envelope_fields()); }

Envelope envelope_from_json(const Json& j, const std::string& path) {
  if (!j.is_object()) bad(path, "expected an object");
  Envelope e;
  try {
    fields::read(j, e, envelope_fields(), {.path = path, .unknown_is_error = true});
  } catch (const fields::FieldError& err) {
    std::string known;
    for (const auto& f : envelope_fields()) known += (known.empty() ? "" : ", ") + f.key;
    bad(err.path(),
        err.reason() == "unknown field" ? "unknown key (known: " + known + ")" : err.reason());
  }
  return e;
}

Envelope load_envelope(const std::string& path) {
  const std::string text = read_file(path);  // std::runtime_error naming the path
  Json j;
  try {
    j = Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::invalid_argument("envelope " + path + ": not valid JSON: " + e.what());
  }
  try {
    return envelope_from_json(j);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("envelope " + path + ": " + e.what());
  }
}

}  // namespace mlafuzz
