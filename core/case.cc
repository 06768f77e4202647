// Case <-> JSON, validation and case files.
//
// The parser is strict on purpose: a typo in a field name would otherwise silently fall back to
// a default and test something other than what the author meant.
#include "core/case.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "core/fileio.h"
#include "core/json_fields.h"

namespace mlafuzz {
namespace {

using json = nlohmann::ordered_json;

constexpr const char* kCaseFormat = "mlafuzz-case";
constexpr const char* kCorpusFormat = "mlafuzz-corpus";

// Limits that keep one case within the memory of a CI machine; a larger case is almost
// certainly a typo, and it would otherwise die in an allocation far from the field at fault.
constexpr int64_t kMaxCacheBytes = int64_t{1} << 32;
constexpr int64_t kMaxElements = int64_t{1} << 28;  // q, out, indices elements each
constexpr int32_t kMaxHeadPad = 1 << 16;
constexpr int32_t kMaxQueryTokens = 1024;
// Keeps every drawn value, including the 4*magnitude specials and 6-sigma normal tails, finite
// in bf16 and fp32 (largest finite ~3.4e38).
constexpr double kMaxMagnitude = 1e30;

// ---- enum names: one table per enum, used both ways ----

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

constexpr EnumName<mla::Layout> kLayouts[] = {{mla::Layout::kModel1, "model1"},
                                              {mla::Layout::kV32, "v32"}};
constexpr EnumName<mla::InvalidIndexRule> kInvalidRules[] = {
    {mla::InvalidIndexRule::kMinusOneOnly, "minus_one_only"},
    {mla::InvalidIndexRule::kAnyNegative, "any_negative"},
    {mla::InvalidIndexRule::kOutOfRange, "out_of_range"}};
constexpr EnumName<mla::EmptyRowLse> kEmptyLse[] = {{mla::EmptyRowLse::kPosInf, "+inf"},
                                                    {mla::EmptyRowLse::kNegInf, "-inf"}};
constexpr EnumName<ValueDist> kDists[] = {{ValueDist::kNormal, "normal"},
                                          {ValueDist::kUniform, "uniform"},
                                          {ValueDist::kSmallInt, "small_int"},
                                          {ValueDist::kZeros, "zeros"},
                                          {ValueDist::kTies, "ties"}};
constexpr EnumName<ScaleMode> kScaleModes[] = {
    {ScaleMode::kWriter, "writer"}, {ScaleMode::kFixed, "fixed"}, {ScaleMode::kRandom, "random"}};
constexpr EnumName<ScaleConvention> kScaleConventions[] = {
    {ScaleConvention::kPowerOfTwo, "power_of_two"}, {ScaleConvention::kFp32, "fp32"}};
constexpr EnumName<Fill> kFills[] = {
    {Fill::kZero, "zero"}, {Fill::kNaN, "nan"}, {Fill::kGarbage, "garbage"}};
constexpr EnumName<IndexRule> kIndexRules[] = {{IndexRule::kRandom, "random"},
                                               {IndexRule::kSequential, "sequential"},
                                               {IndexRule::kPageRuns, "page_runs"}};

template <typename E, size_t N>
const char* enum_name(const EnumName<E> (&table)[N], E v) {
  for (const auto& e : table) {
    if (e.value == v) return e.name;
  }
  return "?";
}

// ---- strict reading ----

std::string type_name(const json& j) { return j.type_name(); }

int64_t read_int(const json& j, const std::string& path, int64_t lo, int64_t hi) {
  if (!j.is_number_integer()) throw CaseError(path, "expected an integer, got " + type_name(j));
  if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    throw CaseError(path, "out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  const int64_t v = j.get<int64_t>();
  if (v < lo || v > hi) {
    throw CaseError(path, std::to_string(v) + " is out of range [" + std::to_string(lo) + ", " +
                              std::to_string(hi) + "]");
  }
  return v;
}

int32_t read_i32(const json& j, const std::string& path) {
  return static_cast<int32_t>(
      read_int(j, path, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()));
}

// Numbers, or the strings "inf", "+inf", "-inf", "nan" (JSON has no literal for them).
double read_double(const json& j, const std::string& path) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const auto& s = j.get_ref<const std::string&>();
    if (s == "inf" || s == "+inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    throw CaseError(path, "expected a number or \"inf\", \"-inf\", \"nan\", got \"" + s + "\"");
  }
  throw CaseError(path, "expected a number, got " + type_name(j));
}

json write_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

std::string read_string(const json& j, const std::string& path) {
  if (!j.is_string()) throw CaseError(path, "expected a string, got " + type_name(j));
  return j.get<std::string>();
}

bool read_bool(const json& j, const std::string& path) {
  if (!j.is_boolean()) throw CaseError(path, "expected true or false, got " + type_name(j));
  return j.get<bool>();
}

template <typename E, size_t N>
E read_enum(const json& j, const std::string& path, const EnumName<E> (&table)[N]) {
  const std::string s = read_string(j, path);
  std::string known;
  for (const auto& e : table) {
    if (s == e.name) return e.value;
    known += known.empty() ? "" : ", ";
    known += std::string("\"") + e.name + "\"";
  }
  throw CaseError(path, "unknown value \"" + s + "\" (expected one of " + known + ")");
}

const json& read_array(const json& j, const std::string& path) {
  if (!j.is_array()) throw CaseError(path, "expected an array, got " + type_name(j));
  return j;
}

std::vector<int32_t> read_i32_list(const json& j, const std::string& path) {
  std::vector<int32_t> v;
  const json& a = read_array(j, path);
  v.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i)
    v.push_back(read_i32(a[i], path + "[" + std::to_string(i) + "]"));
  return v;
}

// Index lists of `s_q` query tokens per batch row: [B][s_q][topk], or [B][topk] when s_q = 1.
// Returns them flattened to [B * s_q][topk].
std::vector<std::vector<int32_t>> read_index_lists(const json& v, const std::string& p,
                                                   int32_t s_q) {
  const json& rows = read_array(v, p);
  std::vector<std::vector<int32_t>> lists;
  for (size_t b = 0; b < rows.size(); ++b) {
    const std::string pb = p + "[" + std::to_string(b) + "]";
    const json& row = read_array(rows[b], pb);
    const bool nested = !row.empty() && row[0].is_array();
    if (s_q == 1 && !nested) {
      lists.push_back(read_i32_list(row, pb));
      continue;
    }
    if (row.size() != static_cast<size_t>(s_q)) {
      throw CaseError(pb, "has " + std::to_string(row.size()) +
                              " query-token lists, expected s_q = " + std::to_string(s_q) +
                              " (indices are [batch][s_q][topk])");
    }
    for (size_t s = 0; s < row.size(); ++s) {
      lists.push_back(read_i32_list(row[s], pb + "[" + std::to_string(s) + "]"));
    }
  }
  return lists;
}

json write_index_lists(const std::vector<std::vector<int32_t>>& lists, int32_t s_q) {
  if (s_q == 1) return lists;
  json rows = json::array();
  for (size_t r = 0; r < lists.size(); r += static_cast<size_t>(s_q)) {
    json row = json::array();
    for (int32_t s = 0; s < s_q && r + s < lists.size(); ++s) row.push_back(lists[r + s]);
    rows.push_back(std::move(row));
  }
  return rows;
}

// Checks the optional "format" tag of a case file.
void check_case_format(const json& v, const std::string& p) {
  const std::string s = read_string(v, p);
  if (s != kCaseFormat) {
    throw CaseError(p, "expected \"" + std::string(kCaseFormat) + "\", got \"" + s + "\"");
  }
}

// Reads the "version" field: a case format version this build reads.
int read_case_version(const json& v, const std::string& p) {
  const int file_version = static_cast<int>(read_int(v, p, 0, std::numeric_limits<int32_t>::max()));
  if (file_version < kOldestCaseFormatVersion || file_version > kCaseFormatVersion) {
    throw CaseError(p, "unsupported case format version " + std::to_string(file_version) +
                           " (this build reads versions " +
                           std::to_string(kOldestCaseFormatVersion) + " to " +
                           std::to_string(kCaseFormatVersion) + ")");
  }
  return file_version;
}

std::vector<double> read_sink(const json& v, const std::string& p) {
  const json& a = read_array(v, p);
  std::vector<double> s;
  for (size_t i = 0; i < a.size(); ++i) {
    s.push_back(read_double(a[i], p + "[" + std::to_string(i) + "]"));
  }
  return s;
}

uint64_t read_data_seed(const json& v, const std::string& p) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0)) {
    throw CaseError(p, "expected an integer in [0, 2^64), got " + v.dump());
  }
  return v.get<uint64_t>();
}

// Rejects a version-1 file that sets a row padding, a version-2 field (every version-2 field
// absent is 0 in version 1).
void check_v1_row_pads(const Case& c, int file_version, const std::string& prefix) {
  if (file_version >= 2) return;
  for (const auto& [value, field] :
       {std::pair{c.q_batch_pad, "q_batch_pad"}, std::pair{c.out_batch_pad, "out_batch_pad"},
        std::pair{c.indices_row_pad, "indices_row_pad"}, std::pair{c.lse_row_pad, "lse_row_pad"}}) {
    if (value != 0) {
      throw CaseError(prefix + field, "needs case format version 2 (the file says version " +
                                          std::to_string(file_version) + ")");
    }
  }
}

// ---- the field tables: one list of {key, write, read} per object writes it and reads it ----

template <class T>
using Table = fields::Table<T>;

// Reads an object of `table`'s fields strictly: a value of the wrong type, a missing required
// field or an unknown key is a CaseError naming its JSON path.
template <class T>
void read_object(const json& j, T& t, const Table<T>& table, const std::string& path) {
  if (!j.is_object()) {
    throw CaseError(path.empty() ? "(top level)" : path,
                    "expected a JSON object, got " + type_name(j));
  }
  try {
    fields::read(j, t, table, {.path = path, .unknown_is_error = true});
  } catch (const fields::FieldError& e) {
    throw CaseError(e.path(), e.reason() == "missing" ? "required field is missing" : e.reason());
  }
}

// A field written by `write` (a discarded value leaves it out) and read by `read`; an absent
// key keeps the struct's default unless the field is required.
template <class T, class W, class R>
fields::Field<T> field(std::string key, W write, R read, bool required = false) {
  fields::Field<T> f;
  f.key = std::move(key);
  f.write = [write](const T& t, const fields::WriteStyle&) { return json(write(t)); };
  f.read = [read](T& t, const json& v, const std::string& p) { read(t, v, p); };
  f.optional = !required;
  return f;
}

// The same field, written only when `keep(t)` holds (a value that means the default).
template <class T, class K>
fields::Field<T> only_if(fields::Field<T> f, K keep) {
  f.write = [keep, write = std::move(f.write)](const T& t, const fields::WriteStyle& s) {
    return keep(t) ? write(t, s) : json(json::value_t::discarded);
  };
  return f;
}

// A field of a member struct, lifted to the outer struct's table.
template <class O, class I>
fields::Field<O> of_member(I O::*member, fields::Field<I> f) {
  fields::Field<O> g;
  g.key = f.key;
  g.optional = f.optional;
  g.write = [member, write = f.write](const O& o, const fields::WriteStyle& s) {
    return write(o.*member, s);
  };
  g.read = [member, read = f.read](O& o, const json& v, const std::string& p) {
    read(o.*member, v, p);
  };
  return g;
}

template <class T>
fields::Field<T> i32(std::string key, int32_t T::*m) {
  return field<T>(
      std::move(key), [m](const T& t) { return t.*m; },
      [m](T& t, const json& v, const std::string& p) { t.*m = read_i32(v, p); });
}

template <class T>
fields::Field<T> int_field(std::string key, int T::*m) {
  return field<T>(
      std::move(key), [m](const T& t) { return t.*m; },
      [m](T& t, const json& v, const std::string& p) { t.*m = static_cast<int>(read_i32(v, p)); });
}

// A byte count or stride: an integer in [0, 2^63).
template <class T>
fields::Field<T> size_field(std::string key, int64_t T::*m) {
  return field<T>(
      std::move(key), [m](const T& t) { return t.*m; },
      [m](T& t, const json& v, const std::string& p) {
        t.*m = read_int(v, p, 0, std::numeric_limits<int64_t>::max());
      });
}

template <class T>
fields::Field<T> real(std::string key, double T::*m) {
  return field<T>(
      std::move(key), [m](const T& t) { return write_double(t.*m); },
      [m](T& t, const json& v, const std::string& p) { t.*m = read_double(v, p); });
}

template <class T>
fields::Field<T> boolean(std::string key, bool T::*m) {
  return field<T>(
      std::move(key), [m](const T& t) { return t.*m; },
      [m](T& t, const json& v, const std::string& p) { t.*m = read_bool(v, p); });
}

template <class T>
fields::Field<T> text(std::string key, std::string T::*m) {
  return field<T>(
      std::move(key), [m](const T& t) { return t.*m; },
      [m](T& t, const json& v, const std::string& p) { t.*m = read_string(v, p); });
}

template <class T, class E, size_t N>
fields::Field<T> named(std::string key, E T::*m, const EnumName<E> (&names)[N]) {
  return field<T>(
      std::move(key), [m, &names](const T& t) { return enum_name(names, t.*m); },
      [m, &names](T& t, const json& v, const std::string& p) { t.*m = read_enum(v, p, names); });
}

template <class T>
fields::Field<T> i32_list(std::string key, std::vector<int32_t> T::*m) {
  return field<T>(
      std::move(key), [m](const T& t) { return t.*m; },
      [m](T& t, const json& v, const std::string& p) { t.*m = read_i32_list(v, p); });
}

// An optional list, written only when present.
template <class T>
fields::Field<T> i32_list(std::string key, std::optional<std::vector<int32_t>> T::*m) {
  return only_if(
      field<T>(
          std::move(key), [m](const T& t) { return *(t.*m); },
          [m](T& t, const json& v, const std::string& p) { t.*m = read_i32_list(v, p); }),
      [m](const T& t) { return (t.*m).has_value(); });
}

// A nested object of another table.
template <class T, class I>
fields::Field<T> object(std::string key, I T::*m, const Table<I>& (*table)()) {
  return field<T>(
      std::move(key), [m, table](const T& t) { return fields::write(t.*m, table()); },
      [m, table](T& t, const json& v, const std::string& p) { read_object(v, t.*m, table(), p); });
}

template <class T>
bool non_empty(const std::vector<T>& v) {
  return !v.empty();
}

const Table<ValueSpec>& value_spec_fields() {
  static const Table<ValueSpec> t = {named("dist", &ValueSpec::dist, kDists),
                                     real("magnitude", &ValueSpec::magnitude),
                                     real("special_fraction", &ValueSpec::special_fraction)};
  return t;
}

const Table<IndexSpec>& index_spec_fields() {
  static const Table<IndexSpec> t = {named("rule", &IndexSpec::rule, kIndexRules),
                                     real("invalid_fraction", &IndexSpec::invalid_fraction),
                                     real("duplicate_fraction", &IndexSpec::duplicate_fraction)};
  return t;
}

const Table<mla::CacheGeometry>& geometry_fields() {
  using G = mla::CacheGeometry;
  static const Table<G> t = {field<G>(
                                 "layout", [](const G& g) { return layout_name(g.layout); },
                                 [](G& g, const json& v, const std::string& p) {
                                   g.layout = read_enum(v, p, kLayouts);
                                   // V32 defaults (FlashMLA README): 512 nope dims, one fp32 scale
                                   // per 128 dims; the fields after this one may still set them.
                                   if (g.layout == mla::Layout::kV32) {
                                     g.nope_dim = 512;
                                     g.scale_tile = 128;
                                   }
                                 }),
                             i32("nope_dim", &G::nope_dim),
                             i32("rope_dim", &G::rope_dim),
                             i32("scale_tile", &G::scale_tile),
                             i32("page_size", &G::page_size),
                             size_field("page_stride", &G::page_stride),
                             i32("num_pages", &G::num_pages)};
  return t;
}

// The case's "geometry" object: the cache geometry and the physical page order.
const Table<Case>& case_geometry_fields() {
  static const Table<Case> t = [] {
    Table<Case> g;
    for (const auto& f : geometry_fields()) g.push_back(of_member(&Case::geom, f));
    g.push_back(only_if(i32_list("page_order", &Case::page_order),
                        [](const Case& c) { return non_empty(c.page_order); }));
    return g;
  }();
  return t;
}

// Index lists are [B][s_q][topk] (or [B][topk] when s_q = 1): their shape depends on the case's
// s_q, so the extra cache's table is made for it.
Table<ExtraCache> extra_fields(int32_t s_q) {
  using E = ExtraCache;
  static const Table<E> geometry = {i32("page_size", &E::page_size),
                                    size_field("page_stride", &E::page_stride),
                                    i32("num_pages", &E::num_pages),
                                    only_if(i32_list("page_order", &E::page_order),
                                            [](const E& e) { return non_empty(e.page_order); })};
  return {
      field<E>(
          "geometry", [](const E& e) { return fields::write(e, geometry); },
          [](E& e, const json& v, const std::string& p) { read_object(v, e, geometry, p); }),
      i32("topk", &E::topk),
      only_if(field<E>(
                  "indices", [s_q](const E& e) { return write_index_lists(e.indices, s_q); },
                  [s_q](E& e, const json& v, const std::string& p) {
                    e.indices = read_index_lists(v, p, s_q);
                  }),
              [](const E& e) { return non_empty(e.indices); }),
      object("index_spec", &E::index_spec, index_spec_fields),
      i32_list("topk_length", &E::topk_length),
      only_if(boolean("same_values", &E::same_values), [](const E& e) { return e.same_values; })};
}

const Table<mla::Conventions>& convention_fields() {
  using C = mla::Conventions;
  static const Table<C> t = {named("invalid_index", &C::invalid_index, kInvalidRules),
                             named("empty_lse", &C::empty_lse, kEmptyLse),
                             boolean("sink_in_lse", &C::sink_in_lse)};
  return t;
}

const Table<Case::QSource>& q_source_fields() {
  using Q = Case::QSource;
  auto required = [](fields::Field<Q> f) {
    f.optional = false;
    return f;
  };
  static const Table<Q> t = {required(i32("heads", &Q::heads)),
                             required(i32_list("rows", &Q::rows)),
                             required(i32_list("head_ids", &Q::head_ids)),
                             only_if(i32("s_q", &Q::s_q), [](const Q& q) { return q.s_q != 1; }),
                             only_if(i32_list("token_ids", &Q::token_ids),
                                     [](const Q& q) { return non_empty(q.token_ids); })};
  return t;
}

const Table<ScaleSpec>& scale_fields() {
  using S = ScaleSpec;
  // convention and mantissa are written only when set, so that a case without them reads the
  // same in every build.
  static const Table<S> t = {
      named("mode", &S::mode, kScaleModes), int_field("exp_lo", &S::exp_lo),
      int_field("exp_hi", &S::exp_hi),
      only_if(named("convention", &S::convention, kScaleConventions),
              [](const S& s) { return s.convention != ScaleConvention::kPowerOfTwo; }),
      only_if(real("mantissa", &S::mantissa), [](const S& s) { return s.mantissa != 1.0; })};
  return t;
}

// A field that only a version-2 file may hold; while a case is read, `version` is the file's.
void since_v2(const Case& c, const std::string& p) {
  if (c.version < 2) {
    throw CaseError(
        p, "needs case format version 2 (the file says version " + std::to_string(c.version) + ")");
  }
}

// The rows of the case table that read or write more than a member.

// "format" and "version", first in every file.
fields::Field<Case> format_field() {
  return field<Case>(
      "format", [](const Case&) { return kCaseFormat; },
      [](Case&, const json& v, const std::string& p) { check_case_format(v, p); });
}

fields::Field<Case> version_field() {
  return field<Case>(
      "version", [](const Case& c) { return c.version; },
      [](Case& c, const json& v, const std::string& p) { c.version = read_case_version(v, p); },
      /*required=*/true);
}

fields::Field<Case> geometry_field() {
  return field<Case>(
      "geometry", [](const Case& c) { return fields::write(c, case_geometry_fields()); },
      [](Case& c, const json& v, const std::string& p) {
        read_object(v, c, case_geometry_fields(), p);
      });
}

// s_q: version 2, written when not 1.
fields::Field<Case> s_q_field() {
  return only_if(field<Case>(
                     "s_q", [](const Case& c) { return c.s_q; },
                     [](Case& c, const json& v, const std::string& p) {
                       since_v2(c, p);
                       c.s_q = read_i32(v, p);
                       if (c.s_q < 1) throw CaseError(p, std::to_string(c.s_q) + " must be >= 1");
                     }),
                 [](const Case& c) { return c.s_q != 1; });
}

// The index lists, shaped by s_q (read before them).
fields::Field<Case> indices_field() {
  return only_if(field<Case>(
                     "indices", [](const Case& c) { return write_index_lists(c.indices, c.s_q); },
                     [](Case& c, const json& v, const std::string& p) {
                       c.indices = read_index_lists(v, p, c.s_q);
                     }),
                 [](const Case& c) { return non_empty(c.indices); });
}

// The extra cache (version 2), its lists shaped by s_q.
fields::Field<Case> extra_field() {
  return only_if(
      field<Case>(
          "extra", [](const Case& c) { return fields::write(*c.extra, extra_fields(c.s_q)); },
          [](Case& c, const json& v, const std::string& p) {
            since_v2(c, p);
            read_object(v, c.extra.emplace(), extra_fields(c.s_q), p);
          }),
      [](const Case& c) { return c.extra.has_value(); });
}

// The attention sink, one double per head (non-finite values as strings).
fields::Field<Case> sink_field() {
  return only_if(
      field<Case>(
          "sink",
          [](const Case& c) {
            json s = json::array();
            for (double v : *c.sink) s.push_back(write_double(v));
            return s;
          },
          [](Case& c, const json& v, const std::string& p) { c.sink = read_sink(v, p); }),
      [](const Case& c) { return c.sink.has_value(); });
}

fields::Field<Case> sm_scale_field() {
  return only_if(
      field<Case>(
          "sm_scale", [](const Case& c) { return write_double(*c.sm_scale); },
          [](Case& c, const json& v, const std::string& p) { c.sm_scale = read_double(v, p); }),
      [](const Case& c) { return c.sm_scale.has_value(); });
}

fields::Field<Case> q_source_field() {
  return only_if(
      field<Case>(
          "q_source", [](const Case& c) { return fields::write(*c.q_source, q_source_fields()); },
          [](Case& c, const json& v, const std::string& p) {
            read_object(v, c.q_source.emplace(), q_source_fields(), p);
          }),
      [](const Case& c) { return c.q_source.has_value(); });
}

fields::Field<Case> data_seed_field() {
  return field<Case>(
      "data_seed", [](const Case& c) { return c.data_seed; },
      [](Case& c, const json& v, const std::string& p) { c.data_seed = read_data_seed(v, p); });
}

// Fields in the order they are written; the reader takes them in the same order, so a field
// read later may depend on one read earlier (indices on s_q, version-2 fields on version).
const Table<Case>& case_fields() {
  static const Table<Case> t = {
      format_field(),
      version_field(),
      text("name", &Case::name),
      only_if(text("description", &Case::description),
              [](const Case& c) { return !c.description.empty(); }),
      geometry_field(),
      i32("batch", &Case::batch),
      i32("heads", &Case::heads),
      i32("topk", &Case::topk),
      s_q_field(),
      indices_field(),
      object("index_spec", &Case::index_spec, index_spec_fields),
      extra_field(),
      i32_list("topk_length", &Case::topk_length),
      sink_field(),
      sm_scale_field(),
      object("conventions", &Case::conventions, convention_fields),
      q_source_field(),
      i32("q_head_pad", &Case::q_head_pad),
      i32("out_head_pad", &Case::out_head_pad),
      // Version-2 fields only when set (0 is their meaning in a version-1 file).
      only_if(i32("q_batch_pad", &Case::q_batch_pad), [](const Case& c) { return c.q_batch_pad; }),
      only_if(i32("out_batch_pad", &Case::out_batch_pad),
              [](const Case& c) { return c.out_batch_pad; }),
      only_if(i32("indices_row_pad", &Case::indices_row_pad),
              [](const Case& c) { return c.indices_row_pad; }),
      only_if(i32("lse_row_pad", &Case::lse_row_pad), [](const Case& c) { return c.lse_row_pad; }),
      object("q_values", &Case::q_values, value_spec_fields),
      object("kv_values", &Case::kv_values, value_spec_fields),
      object("rope_values", &Case::rope_values, value_spec_fields),
      object("scales", &Case::scales, scale_fields),
      named("pad_fill", &Case::pad_fill, kFills),
      data_seed_field(),
  };
  return t;
}

Case read_case(const json& j, const std::string& prefix) {
  Case c;
  read_object(j, c, case_fields(), prefix.empty() ? "" : prefix.substr(0, prefix.size() - 1));
  // A version-1 file means exactly what it meant: it loads as the same case of the current
  // version (and is written back as that version).
  check_v1_row_pads(c, c.version, prefix);
  c.version = kCaseFormatVersion;
  return c;
}

// ---- pretty printing ----

bool is_flat_array(const json& j) {
  if (!j.is_array()) return false;
  for (const auto& e : j) {
    if (e.is_array() || e.is_object()) return false;
  }
  return true;
}

// A scalar as nlohmann's dump() writes it; integers (most of a case file: its index lists)
// without the serializer's temporary string.
void print_scalar(const json& j, std::string& out) {
  if (j.is_number_integer()) {
    char buf[24];
    const auto r = j.is_number_unsigned() ? std::to_chars(buf, buf + sizeof buf, j.get<uint64_t>())
                                          : std::to_chars(buf, buf + sizeof buf, j.get<int64_t>());
    out.append(buf, r.ptr);
  } else {
    out += j.dump();
  }
}

// A key as dump() writes it: a plain ASCII key as is between quotes, any other escaped by dump().
void print_key(const std::string& key, std::string& out) {
  const bool plain = std::all_of(key.begin(), key.end(), [](char ch) {
    return ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\';
  });
  if (plain) {
    out += '"';
    out += key;
    out += '"';
  } else {
    out += json(key).dump();
  }
}

void print(const json& j, int indent, std::string& out) {
  const size_t pad = static_cast<size_t>(indent) + 2;
  if (j.is_object() && !j.empty()) {
    out += "{\n";
    size_t i = 0;
    for (const auto& [key, value] : j.items()) {
      out.append(pad, ' ');
      print_key(key, out);
      out += ": ";
      print(value, indent + 2, out);
      out += ++i < j.size() ? ",\n" : "\n";
    }
    out.append(static_cast<size_t>(indent), ' ');
    out += '}';
  } else if (j.is_array() && !j.empty() && !is_flat_array(j)) {
    out += "[\n";
    for (size_t i = 0; i < j.size(); ++i) {
      out.append(pad, ' ');
      print(j[i], indent + 2, out);
      out += i + 1 < j.size() ? ",\n" : "\n";
    }
    out.append(static_cast<size_t>(indent), ' ');
    out += ']';
  } else if (j.is_array()) {
    out += '[';
    for (size_t i = 0; i < j.size(); ++i) {
      if (i != 0) out += ", ";
      print_scalar(j[i], out);
    }
    out += ']';
  } else {
    print_scalar(j, out);
  }
}

void check(bool ok, const std::string& field, const std::string& reason) {
  if (!ok) throw CaseError(field, reason);
}

void check_fraction(double v, const std::string& field) {
  check(v >= 0 && v <= 1, field, "must be a fraction in [0, 1], got " + std::to_string(v));
}

void check_value_spec(const ValueSpec& s, const std::string& field) {
  check(std::isfinite(s.magnitude) && s.magnitude >= 0 && s.magnitude <= kMaxMagnitude,
        field + ".magnitude",
        "must be finite and in [0, 1e30] so that every drawn value stays finite in bf16");
  check_fraction(s.special_fraction, field + ".special_fraction");
}

std::string at(const std::string& base, size_t i) { return base + "[" + std::to_string(i) + "]"; }

}  // namespace

double Case::effective_sm_scale() const {
  // FlashMLA's default softmax scale: 1 / sqrt(d_qk).
  return sm_scale ? *sm_scale : 1.0 / std::sqrt(static_cast<double>(d_qk()));
}

namespace {

// c.q_source, or the identity map of c's own rows and heads when it has none.
Case::QSource explicit_q_source(const Case& c) {
  if (c.q_source) return *c.q_source;
  Case::QSource q;
  q.heads = c.heads;
  for (int32_t b = 0; b < c.batch; ++b) q.rows.push_back(b);
  for (int32_t h = 0; h < c.heads; ++h) q.head_ids.push_back(h);
  q.s_q = c.s_q;
  return q;
}

std::vector<int32_t> pick(const std::vector<int32_t>& from, const std::vector<int>& which) {
  std::vector<int32_t> v;
  for (int i : which) v.push_back(from[static_cast<size_t>(i)]);
  return v;
}

}  // namespace

Case::QSource q_source_of_rows(const Case& c, const std::vector<int>& rows) {
  Case::QSource q = explicit_q_source(c);
  q.rows = pick(q.rows, rows);
  return q;
}

Case::QSource q_source_of_heads(const Case& c, const std::vector<int>& heads) {
  Case::QSource q = explicit_q_source(c);
  q.head_ids = pick(q.head_ids, heads);
  return q;
}

Case::QSource q_source_of_tokens(const Case& c, const std::vector<int>& tokens) {
  Case::QSource q = explicit_q_source(c);
  if (q.token_ids.empty()) {
    for (int32_t s = 0; s < c.s_q; ++s) q.token_ids.push_back(s);
  }
  q.token_ids = pick(q.token_ids, tokens);
  return q;
}

namespace {

// Geometry and page order of one cache; `prefix` is "geometry" or "extra.geometry".
void validate_geometry(const mla::CacheGeometry& g, const std::vector<int32_t>& page_order,
                       const std::string& prefix) {
  const int64_t min_stride = mla::min_page_stride(g);
  check(g.page_size > 0, prefix + ".page_size", "must be > 0");
  check(g.num_pages > 0, prefix + ".num_pages", "must be > 0");
  check(g.page_stride == 0 || g.page_stride >= min_stride, prefix + ".page_stride",
        std::to_string(g.page_stride) +
            " is below the layout's minimum page_size * token_bytes = " +
            std::to_string(min_stride) + " (0 means that minimum)");
  const int64_t stride = g.page_stride == 0 ? min_stride : g.page_stride;
  check(stride <= kMaxCacheBytes / g.num_pages, prefix + ".num_pages",
        "cache of " + std::to_string(g.num_pages) + " pages of " + std::to_string(stride) +
            " bytes exceeds the 4 GiB limit");
  check(mla::num_slots(g) <= std::numeric_limits<int32_t>::max(), prefix + ".num_pages",
        "page_size * num_pages must fit in int32 (indices are int32)");
  if (!page_order.empty()) {
    check(page_order.size() == static_cast<size_t>(g.num_pages), prefix + ".page_order",
          "has " + std::to_string(page_order.size()) + " entries, expected num_pages = " +
              std::to_string(g.num_pages) + " (or none for identity)");
    std::vector<bool> seen(static_cast<size_t>(g.num_pages), false);
    for (size_t i = 0; i < page_order.size(); ++i) {
      const int32_t p = page_order[i];
      check(p >= 0 && p < g.num_pages, at(prefix + ".page_order", i),
            std::to_string(p) + " is not a page in [0, " + std::to_string(g.num_pages) + ")");
      check(!seen[static_cast<size_t>(p)], at(prefix + ".page_order", i),
            "page " + std::to_string(p) + " appears twice (page_order must be a permutation)");
      seen[static_cast<size_t>(p)] = true;
    }
  }
}

// Explicit index lists [batch * s_q][topk] of one cache, named `name` ("indices",
// "extra.indices"): entry k of token s of row b is "name[b][s][k]" ("name[b][k]" when s_q = 1).
void validate_lists(const Case& c, const std::vector<std::vector<int32_t>>& lists, int32_t topk,
                    int64_t slots, const std::string& name) {
  if (lists.empty()) return;
  check(lists.size() == static_cast<size_t>(c.query_rows()), name,
        "has " + std::to_string(lists.size() / static_cast<size_t>(c.s_q)) +
            " rows, expected batch = " + std::to_string(c.batch));
  const bool minus_one_only = c.conventions.invalid_index == mla::InvalidIndexRule::kMinusOneOnly;
  const bool out_of_range = c.conventions.invalid_index == mla::InvalidIndexRule::kOutOfRange;
  for (size_t r = 0; r < lists.size(); ++r) {
    const auto& row = lists[r];
    const size_t b = r / static_cast<size_t>(c.s_q), s = r % static_cast<size_t>(c.s_q);
    const std::string list = c.s_q == 1 ? at(name, b) : at(at(name, b), s);
    check(row.size() == static_cast<size_t>(topk), list,
          "has " + std::to_string(row.size()) + " entries, expected " +
              (name == "indices" ? "topk" : name.substr(0, name.size() - 7) + "topk") + " = " +
              std::to_string(topk));
    // Every entry of every list: the messages are formed only for a bad entry (a shrink
    // validates each of its candidates).
    for (size_t k = 0; k < row.size(); ++k) {
      const int32_t idx = row[k];
      // Positive out-of-range indices are undefined behaviour unless the convention makes them
      // invalid entries.
      if (!out_of_range && idx >= slots) {
        const std::string cache =
            "the cache has num_pages * page_size = " + std::to_string(slots) + " slots";
        throw CaseError(at(list, k), std::to_string(idx) + " is out of range: " + cache +
                                         " (only conventions.invalid_index \"out_of_range\" "
                                         "makes it an invalid entry)");
      }
      // FlashMLA treats only -1 as invalid; other negatives are undefined behaviour there.
      if (minus_one_only && idx < -1) {
        throw CaseError(at(list, k), std::to_string(idx) +
                                         " is negative but not -1, undefined behaviour under "
                                         "conventions.invalid_index \"minus_one_only\"");
      }
    }
  }
}

void validate_lengths(const Case& c, const std::optional<std::vector<int32_t>>& lengths,
                      int32_t topk, const std::string& name, const std::string& topk_name) {
  if (!lengths) return;
  check(lengths->size() == static_cast<size_t>(c.batch), name,
        "has " + std::to_string(lengths->size()) +
            " entries, expected batch = " + std::to_string(c.batch));
  for (size_t b = 0; b < lengths->size(); ++b) {
    const int32_t len = (*lengths)[b];
    check(
        len >= 0 && len <= topk, at(name, b),
        std::to_string(len) + " is outside [0, " + topk_name + " = " + std::to_string(topk) + "]");
  }
}

// Checks the main cache geometry and, when the case has one, the extra cache's.
void validate_geometries(const Case& c) {
  const auto& g = c.geom;
  check(g.layout == mla::Layout::kModel1 || g.layout == mla::Layout::kV32, "geometry.layout",
        "unknown layout");
  check(g.nope_dim > 0, "geometry.nope_dim", "must be > 0");
  check(g.rope_dim >= 0, "geometry.rope_dim", "must be >= 0");
  check(g.scale_tile > 0, "geometry.scale_tile", "must be > 0");
  check(g.nope_dim % g.scale_tile == 0, "geometry.nope_dim",
        std::to_string(g.nope_dim) + " is not a multiple of geometry.scale_tile " +
            std::to_string(g.scale_tile) + " (one scale per tile)");
  check(g.nope_dim <= (1 << 16) && g.rope_dim <= (1 << 16), "geometry.nope_dim",
        "nope_dim and rope_dim must be <= 65536");
  validate_geometry(g, c.page_order, "geometry");
  if (c.extra) validate_geometry(c.extra_geom(), c.extra->page_order, "extra.geometry");
}

// Checks batch, heads, topk, s_q and the paddings, and that no tensor exceeds kMaxElements.
void validate_shape(const Case& c) {
  check(c.batch > 0, "batch", "must be > 0");
  check(c.heads > 0, "heads", "must be > 0");
  check(c.topk > 0, "topk", "must be > 0");
  check(c.s_q >= 1 && c.s_q <= kMaxQueryTokens, "s_q",
        std::to_string(c.s_q) + " is outside [1, " + std::to_string(kMaxQueryTokens) + "]");
  check(c.q_head_pad >= 0 && c.q_head_pad <= kMaxHeadPad, "q_head_pad", "must be in [0, 65536]");
  check(c.out_head_pad >= 0 && c.out_head_pad <= kMaxHeadPad, "out_head_pad",
        "must be in [0, 65536]");
  const struct {
    int32_t value;
    const char* field;
  } row_pads[] = {{c.q_batch_pad, "q_batch_pad"},
                  {c.out_batch_pad, "out_batch_pad"},
                  {c.indices_row_pad, "indices_row_pad"},
                  {c.lse_row_pad, "lse_row_pad"}};
  for (const auto& rp : row_pads) {
    check(rp.value >= 0 && rp.value <= kMaxHeadPad, rp.field, "must be in [0, 65536]");
  }
  const int64_t nb = c.batch;
  const int64_t sh = int64_t{c.s_q} * c.heads;
  check(nb * (sh * (c.d_qk() + c.q_head_pad) + c.q_batch_pad) <= kMaxElements, "batch",
        "batch * (s_q * heads * (d_qk + q_head_pad) + q_batch_pad) exceeds 2^28 elements");
  check(nb * (sh * (c.d_v() + c.out_head_pad) + c.out_batch_pad) <= kMaxElements, "batch",
        "batch * (s_q * heads * (d_v + out_head_pad) + out_batch_pad) exceeds 2^28 elements");
  check(nb * (int64_t{c.s_q} * c.topk + c.indices_row_pad) <= kMaxElements, "topk",
        "batch * (s_q * topk + indices_row_pad) exceeds 2^28 elements");
  check(nb * (sh + c.lse_row_pad) <= kMaxElements, "lse_row_pad",
        "batch * (s_q * heads + lse_row_pad) exceeds 2^28 elements");
}

// Checks the index lists, index spec and topk lengths of the main cache and the extra cache.
void validate_indices(const Case& c) {
  validate_lists(c, c.indices, c.topk, mla::num_slots(c.geom), "indices");
  check_fraction(c.index_spec.invalid_fraction, "index_spec.invalid_fraction");
  check_fraction(c.index_spec.duplicate_fraction, "index_spec.duplicate_fraction");
  validate_lengths(c, c.topk_length, c.topk, "topk_length", "topk");
  if (!c.extra) return;
  const ExtraCache& e = *c.extra;
  check(e.topk > 0, "extra.topk", "must be > 0");
  check(int64_t{c.batch} * (int64_t{c.s_q} * e.topk + c.indices_row_pad) <= kMaxElements,
        "extra.topk", "batch * (s_q * extra.topk + indices_row_pad) exceeds 2^28 elements");
  validate_lists(c, e.indices, e.topk, mla::num_slots(c.extra_geom()), "extra.indices");
  check_fraction(e.index_spec.invalid_fraction, "extra.index_spec.invalid_fraction");
  check_fraction(e.index_spec.duplicate_fraction, "extra.index_spec.duplicate_fraction");
  validate_lengths(c, e.topk_length, e.topk, "extra.topk_length", "extra.topk");
}

void validate_sink(const Case& c) {
  if (!c.sink) return;
  check(c.sink->size() == static_cast<size_t>(c.heads), "sink",
        "has " + std::to_string(c.sink->size()) +
            " entries, expected heads = " + std::to_string(c.heads));
  for (size_t h = 0; h < c.sink->size(); ++h) {
    // +-inf are meaningful (+inf: output 0; -inf: no sink); NaN has no defined result.
    check(!std::isnan((*c.sink)[h]), at("sink", h), "is NaN (only finite values or +-inf)");
  }
}

void validate_q_source(const Case& c) {
  if (!c.q_source) return;
  const Case::QSource& q = *c.q_source;
  check(q.heads >= 1, "q_source.heads", "must be >= 1");
  check(q.rows.size() == static_cast<size_t>(c.batch), "q_source.rows",
        "has " + std::to_string(q.rows.size()) +
            " entries, expected batch = " + std::to_string(c.batch));
  for (size_t b = 0; b < q.rows.size(); ++b) {
    check(q.rows[b] >= 0, at("q_source.rows", b), "must be >= 0");
  }
  check(q.head_ids.size() == static_cast<size_t>(c.heads), "q_source.head_ids",
        "has " + std::to_string(q.head_ids.size()) +
            " entries, expected heads = " + std::to_string(c.heads));
  for (size_t h = 0; h < q.head_ids.size(); ++h) {
    check(q.head_ids[h] >= 0 && q.head_ids[h] < q.heads, at("q_source.head_ids", h),
          std::to_string(q.head_ids[h]) +
              " is outside [0, q_source.heads = " + std::to_string(q.heads) + ")");
  }
  check(q.s_q >= 1, "q_source.s_q", "must be >= 1");
  check(q.token_ids.empty() || q.token_ids.size() == static_cast<size_t>(c.s_q),
        "q_source.token_ids",
        "has " + std::to_string(q.token_ids.size()) +
            " entries, expected s_q = " + std::to_string(c.s_q) + " (or none)");
  check(!q.token_ids.empty() || q.s_q == c.s_q, "q_source.token_ids",
        "is required when q_source.s_q differs from s_q");
  for (size_t s = 0; s < q.token_ids.size(); ++s) {
    check(q.token_ids[s] >= 0 && q.token_ids[s] < q.s_q, at("q_source.token_ids", s),
          std::to_string(q.token_ids[s]) +
              " is outside [0, q_source.s_q = " + std::to_string(q.s_q) + ")");
  }
}

void validate_scales(const Case& c) {
  // ue8m0 byte 255 is NaN, so stored exponents live in [0, 254].
  check(c.scales.exp_lo >= 0 && c.scales.exp_lo <= 254, "scales.exp_lo",
        std::to_string(c.scales.exp_lo) + " is outside the ue8m0 range [0, 254]");
  check(c.scales.exp_hi >= 0 && c.scales.exp_hi <= 254, "scales.exp_hi",
        std::to_string(c.scales.exp_hi) + " is outside the ue8m0 range [0, 254]");
  check(c.scales.exp_lo <= c.scales.exp_hi, "scales.exp_hi", "must be >= scales.exp_lo");
  const bool fp32 = c.scales.convention == ScaleConvention::kFp32;
  check(!fp32 || c.geom.layout == mla::Layout::kV32, "scales.convention",
        "\"fp32\" applies to the v32 layout only (MODEL1 stores ue8m0 bytes)");
  const double mant = c.scales.mantissa;
  check(mant == 1.0 || (fp32 && c.scales.mode == ScaleMode::kFixed), "scales.mantissa",
        "is used by mode \"fixed\" under convention \"fp32\" only (leave it out otherwise)");
  check(mant >= 1.0 && mant < 2.0 && static_cast<double>(static_cast<float>(mant)) == mant,
        "scales.mantissa", "must be in [1, 2) and exact in float32");
}

}  // namespace

mla::CacheGeometry Case::extra_geom() const {
  mla::CacheGeometry g = geom;
  if (extra) {
    g.page_size = extra->page_size;
    g.page_stride = extra->page_stride;
    g.num_pages = extra->num_pages;
  }
  return g;
}

Case extra_as_main(const Case& c) {
  Case e = c;
  e.extra.reset();
  if (!c.extra) return e;
  e.geom = c.extra_geom();
  e.page_order = c.extra->page_order;
  e.topk = c.extra->topk;
  e.indices = c.extra->indices;
  e.index_spec = c.extra->index_spec;
  e.topk_length = c.extra->topk_length;
  return e;
}

void validate(const Case& c) {
  check(c.version >= kOldestCaseFormatVersion && c.version <= kCaseFormatVersion, "version",
        "unsupported case format version " + std::to_string(c.version));
  validate_geometries(c);
  validate_shape(c);
  validate_indices(c);
  validate_sink(c);
  validate_q_source(c);
  if (c.sm_scale) {
    const double s = *c.sm_scale;
    check(std::isfinite(s) && std::isfinite(static_cast<float>(s)), "sm_scale",
          "must be finite in fp32 (the kernels receive it as a float)");
  }
  check_value_spec(c.q_values, "q_values");
  check_value_spec(c.kv_values, "kv_values");
  check_value_spec(c.rope_values, "rope_values");
  validate_scales(c);
}

nlohmann::ordered_json geometry_to_json(const mla::CacheGeometry& g) {
  return fields::write(g, geometry_fields());
}

nlohmann::ordered_json case_to_json_value(const Case& c) { return fields::write(c, case_fields()); }

Case case_from_json_value(const nlohmann::ordered_json& j, const std::string& path_prefix) {
  Case c = read_case(j, path_prefix);
  try {
    validate(c);
  } catch (const CaseError& e) {
    throw CaseError(path_prefix + e.field(), e.reason());
  }
  return c;
}

std::string json_to_text(const nlohmann::ordered_json& j) {
  std::string out;
  print(j, 0, out);
  out += '\n';
  return out;
}

std::string to_json(const Case& c) { return json_to_text(case_to_json_value(c)); }

Case case_from_json(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw CaseError("(json)", std::string("not valid JSON: ") + e.what());
  }
  // A corpus entry wraps the case; take it and report its fields as "case.<field>".
  if (j.is_object() && j.contains("format") && j.at("format") == kCorpusFormat) {
    check_corpus_entry_version(j);
    if (!j.contains("case")) throw CaseError("case", "corpus entry has no \"case\" field");
    return case_from_json_value(j.at("case"), "case.");
  }
  return case_from_json_value(j, "");
}

void check_corpus_entry_version(const json& entry) {
  const bool known = entry.contains("version") && entry.at("version").is_number_integer() &&
                     entry.at("version").get<int>() >= kOldestCorpusFormatVersion &&
                     entry.at("version").get<int>() <= kCorpusFormatVersion;
  if (!known) {
    throw CaseError("version", "unsupported corpus entry version (this build reads versions " +
                                   std::to_string(kOldestCorpusFormatVersion) + " to " +
                                   std::to_string(kCorpusFormatVersion) + ")");
  }
}

Case load_case(const std::string& path) {
  const std::string text = read_file(path);
  try {
    return case_from_json(text);
  } catch (const CaseError& e) {
    // Keep the field path as is, so tools can match it; the message names the file.
    throw CaseError(e.field(), e.reason() + " (in " + path + ")");
  }
}

void save_case(const Case& c, const std::string& path) {
  validate(c);  // before anything is written: an invalid case leaves no file behind
  write_file_atomic(path, to_json(c));
}

const char* layout_name(mla::Layout l) { return enum_name(kLayouts, l); }
const char* value_dist_name(ValueDist d) { return enum_name(kDists, d); }
const char* scale_mode_name(ScaleMode m) { return enum_name(kScaleModes, m); }
const char* scale_convention_name(ScaleConvention c) { return enum_name(kScaleConventions, c); }
const char* invalid_index_rule_name(mla::InvalidIndexRule r) { return enum_name(kInvalidRules, r); }
const char* fill_name(Fill f) { return enum_name(kFills, f); }
const char* index_rule_name(IndexRule r) { return enum_name(kIndexRules, r); }

}  // namespace mlafuzz
