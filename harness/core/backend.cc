// Backend helpers shared by every bf16 backend: canary-guarded output buffers and their
// conversion into a RunResult.
#include "harness/core/backend.h"

#include <algorithm>

namespace mlafuzz {

const char* phase_name(Phase p) {
  static constexpr const char* kNames[kPhaseCount] = {
      "queue", "encode", "transport", "decode", "run", "alloc", "upload", "kernel", "download"};
  const int i = static_cast<int>(p);
  return i >= 0 && i < kPhaseCount ? kNames[i] : "?";
}

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

OutputBuffers::OutputBuffers(const MaterializedCase& m)
    : out_head_stride(m.out_head_stride), out_batch_stride(m.out_head_stride * m.heads) {
  // Canaries are NaNs with a payload no kernel produces: an element that still holds one after
  // the call was never written, and a guard element that lost it was written out of bounds.
  out.assign(out_elements(m), kCanaryBits);
  lse.assign(lse_elements(m), mla::bits_to_float(kLseCanaryBits));
}

OutputBuffers::OutputBuffers(const MaterializedCase& m, const uint16_t* out_raw,
                             const float* lse_raw)
    : out(out_raw, out_raw + out_elements(m)),
      lse(lse_raw, lse_raw + lse_elements(m)),
      out_head_stride(m.out_head_stride),
      out_batch_stride(m.out_head_stride * m.heads) {}

void OutputBuffers::fill_canaries(uint16_t* out_raw, size_t out_n, float* lse_raw, size_t lse_n) {
  std::fill_n(out_raw, out_n, kCanaryBits);
  std::fill_n(lse_raw, lse_n, mla::bits_to_float(kLseCanaryBits));
}

int64_t OutputBuffers::guard_violations(const MaterializedCase& m) const {
  int64_t bad = 0;
  const auto count = [&](int64_t from, int64_t to) {  // out elements [from, to) are guard
    for (int64_t i = from; i < to; ++i) bad += out[static_cast<size_t>(i)] != kCanaryBits;
  };
  const int64_t rows = int64_t{m.batch} * m.heads;
  const int32_t dv = m.d_v();
  count(0, kGuard);
  // The gap between d_v and the head stride belongs to nobody: writing it is a bug too.
  if (out_head_stride > dv) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t head = kGuard + r * out_head_stride;
      count(head + dv, head + out_head_stride);
    }
  }
  count(kGuard + rows * out_head_stride, static_cast<int64_t>(out.size()));
  const int64_t lse_body = rows;
  for (int64_t i = 0; i < static_cast<int64_t>(lse.size()); ++i) {
    const int64_t rel = i - kGuard;
    // Compare bits: the canary is a NaN, and NaN != NaN as floats.
    if ((rel < 0 || rel >= lse_body) &&
        mla::float_to_bits(lse[static_cast<size_t>(i)]) != kLseCanaryBits) {
      ++bad;
    }
  }
  return bad;
}

namespace {

// The logical outputs, widened; the raw buffers are the caller's to fill.
RunResult widen_outputs(const MaterializedCase& m, const OutputBuffers& bufs) {
  RunResult r;
  const int32_t dv = m.d_v();
  r.out.resize(static_cast<size_t>(int64_t{m.batch} * m.heads * dv));
  r.lse.resize(static_cast<size_t>(int64_t{m.batch} * m.heads));
  for (int32_t b = 0; b < m.batch; ++b) {
    for (int32_t h = 0; h < m.heads; ++h) {
      const int64_t row = int64_t{b} * m.heads + h;
      const uint16_t* src = bufs.out.data() + OutputBuffers::kGuard + b * bufs.out_batch_stride +
                            h * bufs.out_head_stride;
      double* dst = r.out.data() + row * dv;
      for (int32_t d = 0; d < dv; ++d) dst[d] = mla::bf16_to_float(src[d]);  // exact widening
      r.lse[static_cast<size_t>(row)] = bufs.lse[static_cast<size_t>(OutputBuffers::kGuard + row)];
    }
  }
  r.guard_violations = bufs.guard_violations(m);
  return r;
}

}  // namespace

RunResult collect_outputs(const MaterializedCase& m, const OutputBuffers& bufs) {
  RunResult r = widen_outputs(m, bufs);
  r.out_raw = bufs.out;
  r.lse_raw = bufs.lse;
  return r;
}

RunResult collect_outputs(const MaterializedCase& m, OutputBuffers&& bufs) {
  RunResult r = widen_outputs(m, bufs);
  r.out_raw = std::move(bufs.out);
  r.lse_raw = std::move(bufs.lse);
  return r;
}

}  // namespace mlafuzz
