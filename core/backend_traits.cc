// Names of the precision pipelines and extra-cache pipelines, and BackendTraits' field table.
#include "core/backend_traits.h"

#include <nlohmann/json.hpp>

#include "core/json_fields.h"

namespace mlafuzz {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kFloat64:
      return "float64";
    case Precision::kSimtFp32:
      return "simt-fp32";
    case Precision::kMmaBf16:
      return "mma-bf16";
    case Precision::kCustom:
      return "custom";
  }
  return "?";
}

const char* extra_pipeline_name(ExtraPipeline e) {
  return e == ExtraPipeline::kLseMerged ? "lse_merged" : "joint";
}

namespace {

using fields::Field;
using fields::FieldError;
using fields::Json;

// A field written as fmt(value)'s name and read back by finding the value of that name among
// `values`.
template <class E, size_t N>
Field<BackendTraits> named_field(std::string key, E BackendTraits::*member, const char* (*fmt)(E),
                                 const E (&values)[N]) {
  return {std::move(key), fields::kAllViews,
          [=](const BackendTraits& t, const fields::WriteStyle&) { return Json(fmt(t.*member)); },
          [=](BackendTraits& t, const Json& v, const std::string& path) {
            std::string s;
            fields::read_value(s, v, path);
            std::string known;
            for (const E e : values) {
              if (s == fmt(e)) {
                t.*member = e;
                return;
              }
              known += std::string(known.empty() ? "" : ", ") + fmt(e);
            }
            throw FieldError(path, "unknown value '" + s + "' (known: " + known + ")");
          }};
}

constexpr Precision kPrecisions[] = {Precision::kFloat64, Precision::kSimtFp32, Precision::kMmaBf16,
                                     Precision::kCustom};
constexpr ExtraPipeline kExtraPipelines[] = {ExtraPipeline::kJoint, ExtraPipeline::kLseMerged};

}  // namespace

const fields::Table<BackendTraits>& backend_traits_fields() {
  using T = BackendTraits;
  static const fields::Table<T> t = {
      fields::field("name", &T::name),
      named_field("precision", &T::precision, precision_name, kPrecisions),
      {"available", fields::kAllViews,
       [](const T& x, const fields::WriteStyle&) { return Json(x.availability.available); },
       [](T& x, const Json& v, const std::string& path) {
         fields::read_value(x.availability.available, v, path);
       }},
      {"reason", fields::kAllViews,
       [](const T& x, const fields::WriteStyle&) { return Json(x.availability.reason); },
       [](T& x, const Json& v, const std::string& path) {
         fields::read_value(x.availability.reason, v, path);
       }},
      {"envelope", fields::kAllViews,
       [](const T& x, const fields::WriteStyle&) { return envelope_to_json(x.envelope); },
       [](T& x, const Json& v, const std::string& path) {
         x.envelope = envelope_from_json(v, path);  // throws std::invalid_argument naming path
       }},
      fields::field("inexact_invariants", &T::inexact_invariants),
      named_field("extra_pipeline", &T::extra_pipeline, extra_pipeline_name, kExtraPipelines),
      fields::field("abs_tol", &T::abs_tol),
      fields::field("rel_tol", &T::rel_tol),
      fields::field("on_device", &T::on_device),
      fields::field("needs_worker", &T::needs_worker),
      fields::field("is_reference", &T::is_reference),
      fields::field("simt_partner", &T::simt_partner),
      fields::field("splits_kv", &T::splits_kv),
      {"token_tile", fields::kAllViews,
       [](const T& x, const fields::WriteStyle&) { return Json(x.token_tile); },
       [](T& x, const Json& v, const std::string& path) {
         fields::read_value(x.token_tile, v, path);
         if (x.token_tile < 0) throw FieldError(path, "negative token tile");
       }},
  };
  return t;
}

}  // namespace mlafuzz
