#include "core/value_format.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "mla/fp_formats.h"

namespace mlafuzz {
namespace {

// Maps sign-magnitude bits to integers that are ordered like the values.
int64_t ordered(uint32_t bits, int width) {
  const uint32_t sign = 1u << (width - 1);
  const int64_t mag = bits & (sign - 1);
  return (bits & sign) ? -mag - 1 : mag;  // -0 is one below +0
}

}  // namespace

const char* value_format_name(ValueFormat f) {
  switch (f) {
    case ValueFormat::kBf16:
      return "bf16";
    case ValueFormat::kFp32:
      return "fp32";
    case ValueFormat::kFp64:
      return "fp64";
  }
  return "?";
}

std::string format_bf16_bits(uint16_t bits) {
  return fmt::format("{} (bf16 0x{:04x})", fmt::format("{:.9g}", mla::bf16_to_float(bits)), bits);
}

std::string format_fp32_bits(uint32_t bits) {
  return fmt::format("{:.9g} (fp32 0x{:08x})", mla::bits_to_float(bits), bits);
}

std::string format_value(double v, ValueFormat f) {
  switch (f) {
    case ValueFormat::kBf16:
      return format_bf16_bits(mla::float_to_bf16(static_cast<float>(v)));
    case ValueFormat::kFp32:
      return format_fp32_bits(mla::float_to_bits(static_cast<float>(v)));
    case ValueFormat::kFp64:
      return fmt::format("{:.17g} (fp64)", v);
  }
  return "?";
}

int64_t ulp_distance_bf16(uint16_t a, uint16_t b) {
  const auto nan = [](uint16_t x) { return (x & 0x7f80) == 0x7f80 && (x & 0x7f) != 0; };
  if (nan(a) || nan(b)) return -1;
  const int64_t d = ordered(a, 16) - ordered(b, 16);
  return d < 0 ? -d : d;
}

int64_t ulp_distance_fp32(uint32_t a, uint32_t b) {
  if (std::isnan(mla::bits_to_float(a)) || std::isnan(mla::bits_to_float(b))) return -1;
  const int64_t d = ordered(a, 32) - ordered(b, 32);
  return d < 0 ? -d : d;
}

double ulp_of(double v, ValueFormat f) {
  int e = 0;
  std::frexp(v, &e);  // |v| in [2^(e-1), 2^e)
  switch (f) {
    case ValueFormat::kBf16:  // 8 significant bits, fp32's exponent range
      return std::ldexp(1.0, std::max(e, -125) - 8);
    case ValueFormat::kFp32:
      return std::ldexp(1.0, std::max(e, -125) - 24);
    case ValueFormat::kFp64:
      return std::ldexp(1.0, std::max(e, -1021) - 53);
  }
  return 0;
}

std::string ulps_text(double value, double reference, ValueFormat f) {
  if (!std::isfinite(value) || !std::isfinite(reference)) return "-";
  return fmt::format("{:.3g} ulp ({})", std::fabs(value - reference) / ulp_of(value, f),
                     value_format_name(f));
}

}  // namespace mlafuzz
