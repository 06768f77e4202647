// Backend helpers shared by every bf16 backend: canary-guarded output buffers and their
// conversion into a RunResult.
#include "core/backend.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

namespace mlafuzz {

const char* phase_name(Phase p) {
  static constexpr const char* kNames[kPhaseCount] = {"queue",    "encode", "transport", "decode",
                                                      "run",      "alloc",  "upload",    "kernel",
                                                      "download", "stage",  "widen"};
  const int i = static_cast<int>(p);
  return i >= 0 && i < kPhaseCount ? kNames[i] : "?";
}

OutputBuffers::OutputBuffers(const MaterializedCase& m)
    : out_head_stride(m.out_head_stride),
      out_batch_stride(m.out_batch_stride),
      out_token_stride(m.out_token_stride),
      lse_token_stride(m.lse_token_stride),
      lse_batch_stride(m.lse_batch_stride) {
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
      out_batch_stride(m.out_batch_stride),
      out_token_stride(m.out_token_stride),
      lse_token_stride(m.lse_token_stride),
      lse_batch_stride(m.lse_batch_stride) {}

OutputBuffers::OutputBuffers(const MaterializedCase& m, std::vector<uint16_t>&& out_raw,
                             std::vector<float>&& lse_raw)
    : out(std::move(out_raw)),
      lse(std::move(lse_raw)),
      out_head_stride(m.out_head_stride),
      out_batch_stride(m.out_batch_stride),
      out_token_stride(m.out_token_stride),
      lse_token_stride(m.lse_token_stride),
      lse_batch_stride(m.lse_batch_stride) {}

void OutputBuffers::fill_canaries(uint16_t* out_raw, size_t out_n, float* lse_raw, size_t lse_n) {
  std::fill_n(out_raw, out_n, kCanaryBits);
  std::fill_n(lse_raw, lse_n, mla::bits_to_float(kLseCanaryBits));
}

int64_t OutputBuffers::guard_violations(const MaterializedCase& m) const {
  // Walks only the guard ranges (no per-element modulo): the bands before and after the body,
  // and inside each batch row the gap between d_v and the head stride, the gap after the last head
  // of each query token and the gap after the last token. Writing any of them is a bug.
  int64_t bad = 0;
  const auto count = [&](int64_t from, int64_t to) {  // out elements [from, to) are guard
    for (int64_t i = from; i < to; ++i) bad += out[static_cast<size_t>(i)] != kCanaryBits;
  };
  // Compare bits: the canary is a NaN, and NaN != NaN as floats.
  const auto count_lse = [&](int64_t from, int64_t to) {
    for (int64_t i = from; i < to; ++i) {
      bad += mla::float_to_bits(lse[static_cast<size_t>(i)]) != kLseCanaryBits;
    }
  };
  const int32_t dv = m.d_v();
  const int64_t heads_span = int64_t{m.heads} * out_head_stride;
  count(0, kGuard);
  for (int64_t b = 0; b < m.batch; ++b) {
    const int64_t row = kGuard + b * out_batch_stride;
    for (int64_t s = 0; s < m.s_q; ++s) {
      const int64_t token = row + s * out_token_stride;
      if (out_head_stride > dv) {
        for (int64_t h = 0; h < m.heads; ++h) {
          const int64_t head = token + h * out_head_stride;
          count(head + dv, head + out_head_stride);
        }
      }
      count(token + heads_span, token + out_token_stride);
    }
    count(row + m.s_q * out_token_stride, row + out_batch_stride);
  }
  count(kGuard + int64_t{m.batch} * out_batch_stride, static_cast<int64_t>(out.size()));
  count_lse(0, kGuard);
  for (int64_t b = 0; b < m.batch; ++b) {
    const int64_t row = kGuard + b * lse_batch_stride;
    for (int64_t s = 0; s < m.s_q; ++s) {
      const int64_t token = row + s * lse_token_stride;
      count_lse(token + m.heads, token + lse_token_stride);
    }
    count_lse(row + m.s_q * lse_token_stride, row + lse_batch_stride);
  }
  count_lse(kGuard + int64_t{m.batch} * lse_batch_stride, static_cast<int64_t>(lse.size()));
  return bad;
}

namespace {

// The logical outputs, widened; the raw buffers are the caller's to fill.
RunResult widen_outputs(const MaterializedCase& m, const OutputBuffers& bufs) {
  RunResult r;
  const int32_t dv = m.d_v();
  const int32_t rows = m.query_rows();
  r.out.resize(static_cast<size_t>(int64_t{rows} * m.heads * dv));
  r.lse.resize(static_cast<size_t>(int64_t{rows} * m.heads));
  for (int32_t qr = 0; qr < rows; ++qr) {
    const int32_t b = qr / m.s_q, t = qr % m.s_q;
    for (int32_t h = 0; h < m.heads; ++h) {
      const int64_t row = int64_t{qr} * m.heads + h;
      const uint16_t* src = bufs.out.data() + OutputBuffers::kGuard + b * bufs.out_batch_stride +
                            t * bufs.out_token_stride + h * bufs.out_head_stride;
      double* dst = r.out.data() + row * dv;
      for (int32_t d = 0; d < dv; ++d) dst[d] = mla::bf16_to_float(src[d]);  // exact widening
      r.lse[static_cast<size_t>(row)] = bufs.lse[static_cast<size_t>(
          OutputBuffers::kGuard + b * bufs.lse_batch_stride + t * bufs.lse_token_stride + h)];
    }
  }
  return r;
}

}  // namespace

RunResult collect_outputs(const MaterializedCase& m, const OutputBuffers& bufs) {
  RunResult r;
  r.outputs_pending = true;
  r.guard_violations = bufs.guard_violations(m);
  r.out_raw = bufs.out;
  r.lse_raw = bufs.lse;
  return r;
}

RunResult collect_outputs(const MaterializedCase& m, OutputBuffers&& bufs) {
  RunResult r;
  r.outputs_pending = true;
  r.guard_violations = bufs.guard_violations(m);
  r.out_raw = std::move(bufs.out);
  r.lse_raw = std::move(bufs.lse);
  return r;
}

namespace {
// Whether r's raw buffers have the sizes of m's; otherwise r becomes the kFault saying so.
bool raw_sizes_ok(const MaterializedCase& m, RunResult& r) {
  if (r.out_raw.size() != OutputBuffers::out_elements(m) ||
      r.lse_raw.size() != OutputBuffers::lse_elements(m)) {
    const std::string what = "raw outputs of " + std::to_string(r.out_raw.size()) + " and " +
                             std::to_string(r.lse_raw.size()) + " elements for a case of " +
                             std::to_string(OutputBuffers::out_elements(m)) + " and " +
                             std::to_string(OutputBuffers::lse_elements(m));
    r = RunResult{};
    r.status = RunStatus::kFault;
    r.message = "worker sent " + what;
    return false;
  }
  return true;
}
}  // namespace

void check_raw_outputs(const MaterializedCase& m, RunResult& r) {
  if (r.outputs_pending) raw_sizes_ok(m, r);
}

void widen_raw_outputs(const MaterializedCase& m, RunResult& r) {
  if (!r.outputs_pending) return;
  r.outputs_pending = false;
  if (!raw_sizes_ok(m, r)) return;
  OutputBuffers bufs(m, std::move(r.out_raw), std::move(r.lse_raw));
  RunResult w = widen_outputs(m, bufs);
  r.out = std::move(w.out);
  r.lse = std::move(w.lse);
  r.out_raw = std::move(bufs.out);
  r.lse_raw = std::move(bufs.lse);
}

void finish_outputs(const MaterializedCase& m, RunResult& r, bool raw_outputs) {
  if (raw_outputs) {
    check_raw_outputs(m, r);
  } else {
    widen_raw_outputs(m, r);
  }
}

bool Backend::deliver(const MaterializedCase& m, size_t k, CheckedRun& c, const RunOptions& o) {
  if (!c.unsupported) finish_outputs(m, c.result, o.raw_outputs);
  return !o.on_result || o.on_result(k, c);
}

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

std::vector<CheckedRun> Backend::run_batch(const std::vector<const MaterializedCase*>& cases,
                                           const RunOptions& o) {
  std::vector<CheckedRun> out;
  out.reserve(cases.size());
  for (size_t k = 0; k < cases.size(); ++k) {
    const MaterializedCase& m = *cases[k];
    CheckedRun& c = out.emplace_back();
    const auto t0 = Clock::now();
    if (o.on_inputs) o.on_inputs(k, true);
    c.unsupported = unsupported(m);
    if (!c.unsupported) c.result = run_case(m);
    if (o.on_inputs) o.on_inputs(k, false);
    c.seconds = seconds_since(t0);
    if (!deliver(m, k, c, o)) break;
  }
  return out;
}

RunResult Backend::run(const MaterializedCase& m, const RunOptions& o) {
  std::vector<CheckedRun> one = run_batch({&m}, o);
  if (one.size() != 1) throw std::logic_error(traits().name + ": run_batch lost the case");
  if (one[0].unsupported) {
    RunResult r;
    r.status = RunStatus::kUnsupported;
    r.message = std::move(*one[0].unsupported);
    return r;
  }
  return std::move(one[0].result);
}

std::vector<CheckedRun> PipelinedBackend::run_batch(
    const std::vector<const MaterializedCase*>& cases, const RunOptions& o) {
  std::vector<CheckedRun> out(cases.size());
  struct InFlight {
    size_t k = 0;
    std::unique_ptr<Pending> pending;
    double begin_s = 0;  // host time of begin_case and unsupported()
  };
  std::optional<InFlight> in_flight;
  size_t delivered = 0;
  // Finishes the call in flight and delivers its result; false when on_result stopped the batch.
  const auto finish = [&]() {
    InFlight f = std::move(*in_flight);
    in_flight.reset();
    const auto t0 = Clock::now();
    CheckedRun& c = out[f.k];
    c.result = finish_case(std::move(f.pending));
    c.seconds = f.begin_s + seconds_since(t0);
    delivered = f.k + 1;
    return deliver(*cases[f.k], f.k, c, o);
  };
  bool more = true;
  for (size_t k = 0; k < cases.size() && more; ++k) {
    const MaterializedCase& m = *cases[k];
    const auto t0 = Clock::now();
    if (o.on_inputs) o.on_inputs(k, true);
    out[k].unsupported = unsupported(m);
    InFlight begun{k, nullptr, 0};
    if (!out[k].unsupported) begun.pending = begin_case(m);  // reads m's vectors here only
    if (o.on_inputs) o.on_inputs(k, false);
    begun.begin_s = seconds_since(t0);
    if (in_flight && !finish()) {
      more = false;
      break;
    }
    if (out[k].unsupported) {
      out[k].seconds = begun.begin_s;
      delivered = k + 1;
      more = deliver(m, k, out[k], o);
      continue;
    }
    in_flight = std::move(begun);
    if (!overlaps()) more = finish();
  }
  if (more && in_flight) finish();
  out.resize(delivered);
  return out;
}

}  // namespace mlafuzz
