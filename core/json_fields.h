// A plain struct serialized from one table of its fields: the same list of {key, member} writes
// the JSON object and reads it back, so writer and reader cannot drift apart.
//
//   const fields::Table<Point>& point_fields() {
//     static const fields::Table<Point> t = {fields::field("x", &Point::x),
//                                            fields::field("y", &Point::y)};
//     return t;
//   }
//   Json j = fields::write(p, point_fields());
//   fields::read(j, p, point_fields(), {.path = "point"});
//
// Keys are written in table order. A field may belong to some documents only (`views`, a bit
// mask the caller defines), and a field whose value is not a plain member (a nested object, a
// derived figure, a compact row) is a custom field with its own write and read functions.
// Reading is strict: a mistyped value raises FieldError naming the JSON path of the field.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace mlafuzz::fields {

using Json = nlohmann::ordered_json;

// A bad field: `path` is its JSON path ("findings[0].seed"), `reason` what is wrong with it.
class FieldError : public std::runtime_error {
 public:
  FieldError(std::string path, std::string reason)
      : std::runtime_error(path + ": " + reason),
        path_(std::move(path)),
        reason_(std::move(reason)) {}
  const std::string& path() const { return path_; }
  const std::string& reason() const { return reason_; }

 private:
  std::string path_, reason_;
};

// How numbers are written. JSON has no infinities or NaN: with `nonfinite_as_string` they are
// written "inf", "-inf", "nan" (read back either way); without, as nlohmann writes them (null).
struct WriteStyle {
  bool nonfinite_as_string = false;
};

inline constexpr unsigned kAllViews = ~0u;

template <class T>
struct Field {
  std::string key;
  unsigned views = kAllViews;  // documents holding the field
  std::function<Json(const T&, const WriteStyle&)> write;
  // Null for a field that is written only (a figure derived from others).
  std::function<void(T&, const Json&, const std::string& path)> read;
  // Absent from documents written before the field existed: missing keeps the default.
  bool optional = false;
};

template <class T>
using Table = std::vector<Field<T>>;

inline std::string child(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

// ---- Values ----

inline Json number(double x, const WriteStyle& style) {
  if (style.nonfinite_as_string && !std::isfinite(x)) {
    if (std::isnan(x)) return "nan";
    return x > 0 ? "inf" : "-inf";
  }
  return x;
}

inline double read_double(const Json& v, const std::string& path) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  throw FieldError(path, "expected a number (or \"inf\", \"-inf\", \"nan\")");
}

template <class V>
Json write_value(const V& v, const WriteStyle& style) {
  if constexpr (std::is_floating_point_v<V>) {
    return number(v, style);
  } else {
    return v;
  }
}

template <class V>
void read_value(V& out, const Json& v, const std::string& path) {
  if constexpr (std::is_same_v<V, std::string>) {
    if (!v.is_string()) throw FieldError(path, "expected a string");
    out = v.get<std::string>();
  } else if constexpr (std::is_same_v<V, bool>) {
    if (!v.is_boolean()) throw FieldError(path, "expected true or false");
    out = v.get<bool>();
  } else if constexpr (std::is_floating_point_v<V>) {
    out = static_cast<V>(read_double(v, path));
  } else if constexpr (std::is_integral_v<V> && std::is_unsigned_v<V>) {
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
      throw FieldError(path, "expected a non-negative integer");
    }
    out = v.get<V>();
  } else if constexpr (std::is_integral_v<V>) {
    if (!v.is_number_integer()) throw FieldError(path, "expected an integer");
    out = v.get<V>();
  } else if constexpr (std::is_same_v<V, std::vector<std::string>>) {
    if (!v.is_array()) throw FieldError(path, "expected an array");
    out.clear();
    for (size_t i = 0; i < v.size(); ++i) {
      read_value(out.emplace_back(), v[i], path + "[" + std::to_string(i) + "]");
    }
  } else {
    static_assert(sizeof(V) == 0, "no JSON reader for this member type");
  }
}

// ---- Fields ----

// A plain member, written and read as its type says.
template <class T, class V>
Field<T> field(std::string key, V T::*member, unsigned views = kAllViews) {
  return {
      std::move(key), views,
      [member](const T& t, const WriteStyle& s) { return write_value(t.*member, s); },
      [member](T& t, const Json& v, const std::string& path) { read_value(t.*member, v, path); }};
}

// A plain member absent from documents written before it existed, and left out of those written
// while it holds its default value (V{}): a document reads the same with or without it.
template <class T, class V>
Field<T> optional_field(std::string key, V T::*member, unsigned views = kAllViews) {
  Field<T> f = field(std::move(key), member, views);
  f.write = [member](const T& t, const WriteStyle& s) {
    return t.*member == V{} ? Json(Json::value_t::discarded) : write_value(t.*member, s);
  };
  f.optional = true;
  return f;
}

// ---- Objects ----

// The object of the table's fields that belong to `view`, in table order (a field whose write
// gives a discarded value is left out).
template <class T>
Json write(const T& t, const Table<T>& table, unsigned view = kAllViews,
           const WriteStyle& style = {}) {
  Json j = Json::object();
  for (const auto& f : table) {
    if (!(f.views & view)) continue;
    Json v = f.write(t, style);
    if (!v.is_discarded()) j[f.key] = std::move(v);
  }
  return j;
}

struct ReadRules {
  std::string path;               // JSON path of the object, for messages
  unsigned view = kAllViews;      // fields of other views are unknown
  bool missing_is_error = true;   // false: a missing field keeps the struct's default
  bool unknown_is_error = false;  // a key no field of the view reads
};

template <class T>
void read(const Json& j, T& t, const Table<T>& table, const ReadRules& rules = {}) {
  if (!j.is_object()) {
    throw FieldError(rules.path.empty() ? "(top)" : rules.path, "expected an object");
  }
  for (const auto& f : table) {
    if (!(f.views & rules.view) || !f.read) continue;
    auto it = j.find(f.key);
    if (it == j.end()) {
      if (rules.missing_is_error && !f.optional) {
        throw FieldError(child(rules.path, f.key), "missing");
      }
      continue;
    }
    f.read(t, *it, child(rules.path, f.key));
  }
  if (!rules.unknown_is_error) return;
  for (const auto& [key, value] : j.items()) {
    (void)value;
    bool known = false;
    for (const auto& f : table) known = known || ((f.views & rules.view) && f.key == key);
    if (!known) throw FieldError(child(rules.path, key), "unknown field");
  }
}

// An array of objects of one table, read and written element by element.
template <class T>
Json write_array(const std::vector<T>& v, const Table<T>& table, unsigned view = kAllViews,
                 const WriteStyle& style = {}) {
  Json a = Json::array();
  for (const auto& e : v) a.push_back(write(e, table, view, style));
  return a;
}

template <class T>
std::vector<T> read_array(const Json& a, const Table<T>& table, ReadRules rules) {
  if (!a.is_array()) throw FieldError(rules.path, "expected an array");
  std::vector<T> out;
  const std::string base = rules.path;
  for (size_t i = 0; i < a.size(); ++i) {
    rules.path = base + "[" + std::to_string(i) + "]";
    read(a[i], out.emplace_back(), table, rules);
  }
  return out;
}

// A member holding an array of objects of another table (`view` selects their fields).
template <class T, class E>
Field<T> array_of(std::string key, std::vector<E> T::*member, const Table<E>& (*table)(),
                  unsigned view = kAllViews, unsigned views = kAllViews) {
  return {std::move(key), views,
          [=](const T& t, const WriteStyle& s) { return write_array(t.*member, table(), view, s); },
          [=](T& t, const Json& v, const std::string& path) {
            t.*member = read_array(v, table(), {.path = path, .view = view});
          }};
}

}  // namespace mlafuzz::fields
