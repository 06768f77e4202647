// Values in failure details, readable to the last bit: fp32 values with 9 significant digits
// (enough to tell any two fp32 values apart), float64 with 17, each with its bit pattern in hex,
// and distances in units in the last place (ulps) of the format the backend writes.
#pragma once

#include <cstdint>
#include <string>

namespace mlafuzz {

// The format a value was produced in (a bf16 backend writes out as bf16 and lse as fp32).
enum class ValueFormat { kBf16, kFp32, kFp64 };

// "8.66268063 (fp32 0x410a9a4c)", "1.5 (bf16 0x3fc0)", "8.6626806259155273 (fp64)".
// A bf16 or fp32 value must be exactly representable (a widened result); it is printed with
// %.9g and its bits.
std::string format_value(double v, ValueFormat f);
std::string format_bf16_bits(uint16_t bits);
std::string format_fp32_bits(uint32_t bits);

// Distance between two values of one format in ulps: the count of representable values between
// them (ordered bit patterns, +0 and -0 one apart), or -1 when either is NaN.
int64_t ulp_distance_bf16(uint16_t a, uint16_t b);
int64_t ulp_distance_fp32(uint32_t a, uint32_t b);

// One ulp of format f at |v| (the spacing of the binade holding v; subnormal spacing below the
// normal range). Float64: 2^-52 relative.
double ulp_of(double v, ValueFormat f);

// "|error| in ulps" of a backend value against an exact reference: |value - reference| / ulp at
// value, as text with 3 significant digits ("2.5 ulp (bf16)"); "-" when not finite.
std::string ulps_text(double value, double reference, ValueFormat f);

const char* value_format_name(ValueFormat f);

}  // namespace mlafuzz
