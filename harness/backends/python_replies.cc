// The Python worker's replies as field tables (see python_replies.h).
#include "harness/backends/python_replies.h"

#include <stdexcept>
#include <utility>
#include <vector>

namespace mlafuzz {
namespace {

using fields::Field;
using fields::FieldError;
using fields::Json;

constexpr int32_t kMaxTokenTile = 1 << 20;

// A field of the reply held by the member `at` returns (a generic lambda: `at(info)` gives a
// reference into the description), written and read as its type says.
template <class At>
Field<PythonInfo> plain(std::string key, At at, bool optional = true) {
  Field<PythonInfo> f{std::move(key), fields::kAllViews,
                      [at](const PythonInfo& i, const fields::WriteStyle& s) {
                        return fields::write_value(at(i), s);
                      },
                      [at](PythonInfo& i, const Json& v, const std::string& path) {
                        fields::read_value(at(i), v, path);
                      }};
  f.optional = optional;
  return f;
}

template <class V>
Field<PythonInfo> desc(std::string key, V PythonDescription::*m, bool optional = true) {
  return plain(
      std::move(key), [m](auto& i) -> auto& { return i.description.*m; }, optional);
}

template <class V>
Field<PythonInfo> trait(std::string key, V BackendTraits::*m) {
  return plain(
      std::move(key), [m](auto& i) -> auto& { return i.description.traits.*m; });
}

// A field of T whose value is one of `names` (the protocol's spelling of an enumeration), held
// by the member `at` returns.
template <class T, class E, class At>
Field<T> one_of(std::string key, At at, std::vector<std::pair<std::string, E>> names,
                bool optional = true) {
  Field<T> f{std::move(key), fields::kAllViews,
             [at, names](const T& x, const fields::WriteStyle&) {
               for (const auto& [name, value] : names) {
                 if (at(x) == value) return Json(name);
               }
               throw std::logic_error("a value the Python worker protocol cannot name");
             },
             [at, names](T& x, const Json& v, const std::string& path) {
               std::string s, known;
               fields::read_value(s, v, path);
               for (const auto& [name, value] : names) {
                 if (s == name) {
                   at(x) = value;
                   return;
                 }
                 known += (known.empty() ? "" : ", ") + name;
               }
               throw FieldError(path, "unknown value '" + s + "' (known: " + known + ")");
             }};
  f.optional = optional;
  return f;
}

// A field with its own write and read functions, absent from older replies.
Field<PythonInfo> custom(std::string key, std::function<Json(const PythonInfo&)> write,
                         std::function<void(PythonInfo&, const Json&, const std::string&)> read) {
  Field<PythonInfo> f{std::move(key), fields::kAllViews,
                      [write = std::move(write)](const PythonInfo& i, const fields::WriteStyle&) {
                        return write(i);
                      },
                      std::move(read)};
  f.optional = true;
  return f;
}

}  // namespace

const fields::Table<PythonInfo>& python_info_fields() {
  using I = PythonInfo;
  static const fields::Table<I> t = {
      plain(
          "protocol", [](auto& i) -> auto& { return i.protocol; }, false),
      desc("name", &PythonDescription::name, false),
      desc("description", &PythonDescription::description),
      one_of<I, Precision>(
          "precision", [](auto& i) -> auto& { return i.description.traits.precision; },
          {{"bf16_mma", Precision::kMmaBf16},
           {"fp32_simt", Precision::kSimtFp32},
           {"custom", Precision::kCustom}},
          false),
      trait("abs_tol", &BackendTraits::abs_tol),
      trait("rel_tol", &BackendTraits::rel_tol),
      // device="cuda": the kernel gets torch tensors on the GPU (on_device).
      one_of<I, std::string>("device", [](auto& i) -> auto& { return i.description.device; },
                             {{"cpu", "cpu"}, {"cuda", "cuda"}}),
      desc("has_supports", &PythonDescription::has_supports),
      plain(
          "available",
          [](auto& i) -> auto& { return i.description.traits.availability.available; }),
      plain(
          "reason", [](auto& i) -> auto& { return i.description.traits.availability.reason; }),
      plain(
          "pid", [](auto& i) -> auto& { return i.pid; }),
      desc("python", &PythonDescription::python),
      desc("python_version", &PythonDescription::python_version),
      desc("numpy", &PythonDescription::numpy_version),
      // null: the kernel declares no envelope (it accepts anything).
      custom(
          "envelope",
          [](const I& i) {
            return i.description.has_envelope ? envelope_to_json(i.description.traits.envelope)
                                              : Json(nullptr);
          },
          [](I& i, const Json& v, const std::string& path) {
            i.description.has_envelope = !v.is_null();
            if (i.description.has_envelope) {
              i.description.traits.envelope = envelope_from_json(v, path);
            }
          }),
      // The invariants the kernel does not promise bit for bit, by name.
      custom(
          "inexact",
          [](const I& i) {
            Json names = Json::array();
            for (uint32_t bit = 1; bit & kInvariantAll; bit <<= 1) {
              if (i.description.traits.inexact_invariants & bit)
                names.push_back(invariant_name(bit));
            }
            return names;
          },
          [](I& i, const Json& v, const std::string& path) {
            std::vector<std::string> names;
            fields::read_value(names, v, path);
            try {
              i.description.traits.inexact_invariants = parse_invariants(names);
            } catch (const std::invalid_argument& e) {
              throw FieldError(path, e.what());
            }
          }),
      one_of<I, ExtraPipeline>(
          "extra_pipeline", [](auto& i) -> auto& { return i.description.traits.extra_pipeline; },
          {{"joint", ExtraPipeline::kJoint}, {"lse_merged", ExtraPipeline::kLseMerged}}),
      // Tokens per online-softmax tile; 0: the precision's default.
      custom(
          "token_tile", [](const I& i) { return Json(i.description.traits.token_tile); },
          [](I& i, const Json& v, const std::string& path) {
            if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
                v.get<int64_t>() > kMaxTokenTile) {
              throw FieldError(path, "expected a number of tokens from 0 (the default) to " +
                                         std::to_string(kMaxTokenTile) + ", got " + v.dump());
            }
            i.description.traits.token_tile = v.get<int32_t>();
          }),
      // Envelope(extra_cache=...): true, false or null (nothing said); only true is kept.
      custom(
          "extra_cache",
          [](const I& i) {
            return i.description.declares_extra_cache ? Json(true) : Json(nullptr);
          },
          [](I& i, const Json& v, const std::string& path) {
            if (v.is_null()) {
              i.description.declares_extra_cache = false;
              return;
            }
            if (!v.is_boolean()) throw FieldError(path, "expected true, false or null");
            i.description.declares_extra_cache = v.get<bool>();
          }),
      // The module's planted bugs, {name: description} in declaration order; null: none.
      custom(
          "mutants",
          [](const I& i) {
            Json m = Json::object();
            for (const auto& [name, what] : i.description.mutants) m[name] = what;
            return m;
          },
          [](I& i, const Json& v, const std::string& path) {
            i.description.mutants.clear();
            if (v.is_null()) return;
            if (!v.is_object()) throw FieldError(path, "expected an object or null");
            for (const auto& [name, what] : v.items()) {
              fields::read_value(i.description.mutants.emplace_back(name, "").second, what,
                                 fields::child(path, name));
            }
          }),
  };
  return t;
}

PythonInfo read_python_info(const fields::Json& reply, const std::string& backend,
                            const std::string& interpreter) {
  PythonInfo info;
  PythonDescription& d = info.description;
  d.traits.name = backend;
  d.traits.needs_worker = true;
  d.device = "cpu";
  d.python = interpreter;
  fields::read(reply, info, python_info_fields(), {.path = "info"});
  d.traits.on_device = d.device == "cuda";
  return info;
}

PythonSupportsReply read_python_supports_reply(const fields::Json& reply) {
  using S = PythonSupportsReply;
  static const fields::Table<S> t = {
      {"reason", fields::kAllViews,
       [](const S& s, const fields::WriteStyle&) { return s.reason ? Json(*s.reason) : Json(); },
       [](S& s, const Json& v, const std::string& path) {
         if (v.is_null()) return;
         fields::read_value(s.reason.emplace(), v, path);
       }},
      fields::optional_field("error", &S::error),
  };
  PythonSupportsReply r;
  fields::read(reply, r, t, {.path = "supports"});
  return r;
}

PythonRunReply read_python_run_reply(const fields::Json& reply) {
  using R = PythonRunReply;
  static const fields::Table<R> t = {
      one_of<R, R::Status>(
          "status", [](auto& r) -> auto& { return r.status; },
          {{"ok", R::Status::kOk}, {"error", R::Status::kError}, {"fault", R::Status::kFault}},
          false),
      fields::optional_field("message", &R::message),
      fields::optional_field("seconds", &R::seconds),
  };
  PythonRunReply r;
  fields::read(reply, r, t, {.path = "run"});
  return r;
}

}  // namespace mlafuzz
