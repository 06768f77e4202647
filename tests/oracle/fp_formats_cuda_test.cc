// The shared number formats against CUDA's own host-side conversions (<cuda_fp8.h>,
// <cuda_bf16.h>): what the kernels' hardware paths are specified to do. Compiled by the host
// compiler with the toolkit's include directories; built only when CUDAToolkit is found.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "mla/fp_formats.h"
#include "oracle/oracle.h"

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float cuda_e4m3_via_half(uint8_t v) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3);
  return __half2float(__half(h));
}

float cuda_e4m3_via_class(uint8_t v) {
  __nv_fp8_e4m3 f;
  f.__x = static_cast<__nv_fp8_storage_t>(v);
  return static_cast<float>(f);
}

TEST(CudaFormats, AllE4m3EncodingsMatchCuda) {
  const double* table = mlafuzz::e4m3_table();
  for (int v = 0; v < 256; ++v) {
    const uint8_t b = static_cast<uint8_t>(v);
    const float ours = mla::e4m3_to_float(b);
    for (float cuda : {cuda_e4m3_via_half(b), cuda_e4m3_via_class(b)}) {
      if (std::isnan(cuda)) {
        EXPECT_TRUE(std::isnan(ours)) << v;
        EXPECT_TRUE(std::isnan(table[v])) << v;
      } else {
        EXPECT_EQ(ours, cuda) << v;
        EXPECT_EQ(std::signbit(ours), std::signbit(cuda)) << v;
        EXPECT_EQ(table[v], static_cast<double>(cuda)) << v;
      }
    }
  }
}

// Floats to test rounding on: every e4m3 value, the midpoints between neighbours and one fp32
// ulp either side of them, the saturation boundary, plus a stride through all bit patterns.
std::vector<float> rounding_probes() {
  std::vector<float> p;
  std::vector<float> finite;
  for (int v = 0; v < 0x7f; ++v) finite.push_back(mla::e4m3_to_float(static_cast<uint8_t>(v)));
  finite.push_back(480.0f);  // the first value past 448 the format would have
  for (size_t i = 0; i + 1 < finite.size(); ++i) {
    const float mid = 0.5f * (finite[i] + finite[i + 1]);  // exact: few significant bits
    for (float f : {finite[i], mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      p.push_back(f);
      p.push_back(-f);
    }
  }
  for (uint64_t u = 0; u < (1ull << 32); u += 65537) p.push_back(from_bits(uint32_t(u)));
  return p;
}

TEST(CudaFormats, FloatToE4m3SatMatchesCudaSatfinite) {
  int checked = 0;
  for (float f : rounding_probes()) {
    const uint8_t cuda = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
    const uint8_t ours = mla::float_to_e4m3_sat(f);
    if (std::isnan(f)) {
      EXPECT_EQ(ours & 0x7f, 0x7f);  // CUDA's NaN sign is unspecified; both must be NaN
      EXPECT_EQ(cuda & 0x7f, 0x7f);
      continue;
    }
    ASSERT_EQ(ours, cuda) << std::hexfloat << f;
    ++checked;
  }
  EXPECT_GT(checked, 60000);
}

TEST(CudaFormats, FloatToBf16MatchesCudaRn) {
  for (float f : rounding_probes()) {
    const __nv_bfloat16_raw cuda = __float2bfloat16_rn(f);
    const uint16_t ours = mla::float_to_bf16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(mla::bf16_to_float(ours)));
      EXPECT_TRUE(std::isnan(mla::bf16_to_float(cuda.x)));
      continue;
    }
    ASSERT_EQ(ours, cuda.x) << std::hexfloat << f;
    // And back: the widening is exact.
    ASSERT_EQ(mla::bf16_to_float(ours), __bfloat162float(__nv_bfloat16(cuda)));
  }
}

}  // namespace
