// Backend helpers shared by every bf16 backend: canary-guarded output buffers and their
// conversion into a RunResult.
#include "harness/core/backend.h"

#include <chrono>

namespace mlafuzz {

const char* phase_name(Phase p) {
  static constexpr const char* kNames[kPhaseCount] = {"queue",    "encode", "transport", "decode",
                                                      "run",      "alloc",  "upload",    "kernel",
                                                      "download", "stage"};
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
    : out_head_stride(m.out_head_stride),
      out_batch_stride(m.out_batch_stride),
      out_token_stride(m.out_token_stride),
      lse_token_stride(m.lse_token_stride),
      lse_batch_stride(m.lse_batch_stride) {
  // Canaries are NaNs with a payload no kernel produces: an element that still holds one after
  // the call was never written, and a guard element that lost it was written out of bounds.
  out.assign(static_cast<size_t>(2 * kGuard + int64_t{m.batch} * out_batch_stride), kCanaryBits);
  lse.assign(static_cast<size_t>(2 * kGuard + int64_t{m.batch} * lse_batch_stride),
             mla::bits_to_float(kLseCanaryBits));
}

int64_t OutputBuffers::guard_violations(const MaterializedCase& m) const {
  int64_t bad = 0;
  const int64_t body = int64_t{m.batch} * out_batch_stride;
  const int32_t dv = m.d_v();
  const int64_t heads_span = int64_t{m.heads} * out_head_stride;
  const int64_t tokens_span = int64_t{m.s_q} * out_token_stride;
  for (int64_t i = 0; i < static_cast<int64_t>(out.size()); ++i) {
    const int64_t rel = i - kGuard;
    bool guard = rel < 0 || rel >= body;
    // The gaps between d_v and the head stride, after the last head of a token and after the
    // last token of a batch row belong to nobody: writing them is a bug too.
    if (!guard) {
      const int64_t in_row = rel % out_batch_stride;
      guard = in_row >= tokens_span;
      if (!guard) {
        const int64_t in_token = in_row % out_token_stride;
        guard = in_token >= heads_span || in_token % out_head_stride >= dv;
      }
    }
    if (guard && out[static_cast<size_t>(i)] != kCanaryBits) ++bad;
  }
  const int64_t lse_body = int64_t{m.batch} * lse_batch_stride;
  for (int64_t i = 0; i < static_cast<int64_t>(lse.size()); ++i) {
    const int64_t rel = i - kGuard;
    // Compare bits: the canary is a NaN, and NaN != NaN as floats.
    bool guard = rel < 0 || rel >= lse_body;
    if (!guard) {
      const int64_t in_row = rel % lse_batch_stride;
      guard = in_row >= int64_t{m.s_q} * lse_token_stride || in_row % lse_token_stride >= m.heads;
    }
    if (guard && mla::float_to_bits(lse[static_cast<size_t>(i)]) != kLseCanaryBits) {
      ++bad;
    }
  }
  return bad;
}

RunResult collect_outputs(const MaterializedCase& m, const OutputBuffers& bufs) {
  RunResult r;
  const int32_t dv = m.d_v();
  const int32_t rows = m.query_rows();
  r.out.resize(static_cast<size_t>(int64_t{rows} * m.heads * dv));
  r.lse.resize(static_cast<size_t>(int64_t{rows} * m.heads));
  for (int32_t qr = 0; qr < rows; ++qr) {
    const int32_t b = qr / m.s_q, t = qr % m.s_q;
    for (int32_t h = 0; h < m.heads; ++h) {
      const int64_t row = int64_t{qr} * m.heads + h;
      const int64_t src = OutputBuffers::kGuard + b * bufs.out_batch_stride +
                          t * bufs.out_token_stride + h * bufs.out_head_stride;
      for (int32_t d = 0; d < dv; ++d) {
        r.out[static_cast<size_t>(row * dv + d)] =
            mla::bf16_to_float(bufs.out[static_cast<size_t>(src + d)]);  // exact widening
      }
      r.lse[static_cast<size_t>(row)] = bufs.lse[static_cast<size_t>(
          OutputBuffers::kGuard + b * bufs.lse_batch_stride + t * bufs.lse_token_stride + h)];
    }
  }
  r.out_raw = bufs.out;
  r.lse_raw = bufs.lse;
  r.guard_violations = bufs.guard_violations(m);
  return r;
}

std::vector<CheckedRun> Backend::check_and_run(const std::vector<const MaterializedCase*>& cases) {
  std::vector<CheckedRun> out(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    out[i].unsupported = unsupported(*cases[i]);
    if (!out[i].unsupported) out[i].result = run(*cases[i]);
    out[i].seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return out;
}

}  // namespace mlafuzz
