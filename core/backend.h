// One interface for every implementation under test: the float64 oracles, the host models of
// the kernels, the CUDA kernels and user plugins.
//
// A Backend never exits or aborts: errors become RunResult statuses. The harness core includes
// no CUDA header; CUDA backends are created through factory functions declared in plain headers.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/backend_traits.h"
#include "core/envelope.h"
#include "core/materialize.h"

namespace mlafuzz {

enum class RunStatus {
  kOk,
  kUnsupported,  // the backend cannot run this case by design; `message` says why
  kError,        // a launch or API error (the case is not at fault... or is: see message)
  kFault,        // device fault, crash or hang (set by the isolation layer)
};

// Canary-guarded output buffers. `out` holds kGuard elements before and after the strided
// [B, out_batch_stride] region: a batch row holds s_q tokens out_token_stride apart, each H heads
// out_head_stride apart. Elements between d_v and out_head_stride, after the H heads of a token
// and after the s_q tokens of a batch row are guard too. `lse` likewise: kGuard before and after
// [B, lse_batch_stride], tokens lse_token_stride apart; every element of a row that is not
// (token, head) is guard.
struct OutputBuffers {
  static constexpr int64_t kGuard = 64;
  static constexpr uint16_t kCanaryBits = 0x7fa5;  // a bf16 NaN with a recognisable payload
  static constexpr uint32_t kLseCanaryBits = 0x7fa5a5a5u;
  std::vector<uint16_t> out;  // kGuard + B*out_batch_stride + kGuard
  std::vector<float> lse;     // kGuard + B*lse_batch_stride + kGuard
  int64_t out_head_stride = 0, out_batch_stride = 0, out_token_stride = 0;
  int64_t lse_token_stride = 0, lse_batch_stride = 0;

  explicit OutputBuffers(const MaterializedCase& m);
  // The buffers as a kernel left them in memory elsewhere (a worker's shared memory): `out_raw`
  // and `lse_raw` hold out_elements(m) and lse_elements(m) elements, guards included.
  OutputBuffers(const MaterializedCase& m, const uint16_t* out_raw, const float* lse_raw);
  // Takes the raw buffers of a result (widen_raw_outputs); sizes as above, checked by the caller.
  OutputBuffers(const MaterializedCase& m, std::vector<uint16_t>&& out_raw,
                std::vector<float>&& lse_raw);
  static size_t out_elements(const MaterializedCase& m) {
    return static_cast<size_t>(2 * kGuard + int64_t{m.batch} * m.out_batch_stride);
  }
  static size_t lse_elements(const MaterializedCase& m) {
    return static_cast<size_t>(2 * kGuard + int64_t{m.batch} * m.lse_batch_stride);
  }
  // Fills buffers of those sizes with the canaries, as the constructor does.
  static void fill_canaries(uint16_t* out_raw, size_t out_n, float* lse_raw, size_t lse_n);
  uint16_t* out_begin() { return out.data() + kGuard; }
  float* lse_begin() { return lse.data() + kGuard; }
  // Points p's out and lse (and their strides) at these buffers.
  void attach(mla::DecodeParams& p) {
    p.out = out_begin();
    p.out_head_stride = out_head_stride;
    p.out_token_stride = out_token_stride;
    p.out_batch_stride = out_batch_stride;
    p.lse = lse_begin();
    p.lse_token_stride = lse_token_stride;
    p.lse_batch_stride = lse_batch_stride;
  }
  // Number of guard elements (out and lse) that no longer hold their canary.
  int64_t guard_violations(const MaterializedCase& m) const;
};

// Where the time of one backend call went, in seconds, filled by each layer the call passes
// through: the worker proxy (waiting for a free worker, encoding the case, the round trip through
// the transport less the worker's own time), the worker (decoding the case), and the CUDA staging
// (device allocation, copies to and from the device, the kernel with its synchronization). What a
// backend does not measure stays 0; `run` is the backend's whole run() as the worker saw it.
// A CUDA backend's resident path (one synchronization per call) measures upload, kernel and
// download as device-side durations between CUDA events, alloc and stage as host wall time.
enum class Phase : int {
  kQueue,      // waiting for a free worker (another thread's call in flight)
  kEncode,     // case -> frame (proxy side)
  kTransport,  // request and reply through the transport, less the worker's decode and run
  kDecode,     // frame -> case (worker side)
  kRun,        // the backend's run() inside the worker: alloc + upload + kernel + download + rest
  kAlloc,      // device allocation (cudaMalloc) inside kRun
  kUpload,     // host -> device copies inside kRun
  kKernel,     // launch and synchronize inside kRun
  kDownload,   // device -> host copies inside kRun
  kStage,      // inside kRun, host side: inputs compared with the device-resident copies, changed
               // ones and the output canaries copied into pinned memory (cuda_backends.cu)
  kWiden,      // campaign side, after the reply: raw outputs widened to float64 and the guard
               // bands checked (worker protocol 2; inside the worker's kRun before it)
  kCount,
};
inline constexpr int kPhaseCount = static_cast<int>(Phase::kCount);
const char* phase_name(Phase p);

struct CallPhases {
  std::array<double, kPhaseCount> seconds{};
  double& operator[](Phase p) { return seconds[static_cast<int>(p)]; }
  double operator[](Phase p) const { return seconds[static_cast<int>(p)]; }
  CallPhases& operator+=(const CallPhases& o) {
    for (int i = 0; i < kPhaseCount; ++i) seconds[i] += o.seconds[i];
    return *this;
  }
};

struct RunResult {
  RunStatus status = RunStatus::kOk;
  std::string message;
  std::vector<double> out;  // [B * s_q, H, d_v] logical output (bf16 values widened exactly)
  std::vector<double> lse;  // [B * s_q, H]
  // Raw strided output of bf16 backends, guard bands included (empty for float64 backends):
  // the bitwise invariants compare these bits.
  std::vector<uint16_t> out_raw;
  std::vector<float> lse_raw;
  // Guard elements the backend overwrote, counted once, where the outputs are collected
  // (collect_outputs: in a `mlafuzz worker` for a worker's backend, whose reply carries it).
  int64_t guard_violations = 0;
  // Set by collect_outputs: out and lse are not computed yet; widen_raw_outputs fills them from
  // the raw buffers.
  bool outputs_pending = false;
  double seconds = 0;  // wall time of the call, for reports
  CallPhases phases;   // where `seconds` went, as far as the layers measured it

  bool ok() const { return status == RunStatus::kOk; }
};

// One case of a batch (Backend::run_batch): the case's unsupported() verdict, and its result
// when the case is supported.
struct CheckedRun {
  std::optional<std::string> unsupported;  // set: the case was not run
  RunResult result;
  double seconds = 0;  // this case's wall time as the caller saw it (a batch's shared cost split)
};

// How Backend::run_batch runs a batch and hands its results over.
struct RunOptions {
  // false: every result's out and lse are filled (bf16 outputs widened exactly). true: a bf16
  // backend's results may keep only their raw outputs (RunResult::outputs_pending, their sizes
  // checked: check_raw_outputs), for a caller that compares some results bit
  // for bit on the raw buffers and widens only those it reads values from (widen_raw_outputs:
  // the properties), or sends them on (`mlafuzz worker`, whose campaign side widens them).
  bool raw_outputs = false;
  // Called with each case's result, in the batch's order, as soon as it is known (a worker
  // replies then); returning false stops the batch: the cases after k are not run and their
  // results stay empty.
  std::function<bool(size_t k, CheckedRun& c)> on_result;
  // Called with (k, true) before the backend reads case k's input vectors and with (k, false)
  // once it has read them, so that a caller may lend them (the worker's batch lends the first
  // case's vectors to the variants that equal them). A backend that overlaps calls reads them
  // when it begins the call, not when it finishes it.
  std::function<void(size_t k, bool lend)> on_inputs;
};

// A backend describes itself by one BackendTraits value (core/backend_traits.h says what each
// field means), which the worker protocol sends, the commands print and the properties read:
// traits(). A backend states it once, usually by being a TraitsBackend of it.
//
// Running: run_batch() is the one way to run a backend (a case's property variants, a worker's
// batch request, one case). A backend implements run_case() for one supported case; the default
// run_batch checks each case (unsupported()), runs it and converts its outputs as the options
// say. A worker proxy sends the whole batch in one request; a backend that overlaps two calls
// (the CUDA backends) is a PipelinedBackend.
class Backend {
 public:
  virtual ~Backend() = default;
  // What the backend says about itself; the reference lives as long as the backend.
  virtual const BackendTraits& traits() const = 0;
  // Reason the backend cannot run this case by design, or nullopt if it can (the final word,
  // inside or outside the envelope).
  virtual std::optional<std::string> unsupported(const MaterializedCase& m) const {
    (void)m;
    return std::nullopt;
  }
  // Runs every case in order: unsupported() and, when supported, the case, each result's
  // outputs as `o` asks. One result per case (fewer only when o.on_result stopped the batch).
  virtual std::vector<CheckedRun> run_batch(const std::vector<const MaterializedCase*>& cases,
                                            const RunOptions& o = {});
  // run_batch of the one case m, its verdict folded into the result (kUnsupported with the
  // reason when unsupported() refuses it).
  RunResult run(const MaterializedCase& m, const RunOptions& o = {});

 protected:
  // One case that unsupported() accepted. A bf16 backend's result may keep only its raw outputs
  // (collect_outputs); run_batch converts them as its options ask (finish_outputs).
  virtual RunResult run_case(const MaterializedCase& m) = 0;
  // What run_batch does with case k's result: its outputs converted as o asks, then
  // o.on_result. Returns false when on_result stopped the batch.
  static bool deliver(const MaterializedCase& m, size_t k, CheckedRun& c, const RunOptions& o);

  template <class>
  friend class ForwardingBackend;
};

// Converts a result's pending raw outputs as a batch's options ask: widened (raw_outputs false,
// widen_raw_outputs) or only their sizes checked (check_raw_outputs).
void finish_outputs(const MaterializedCase& m, RunResult& r, bool raw_outputs);

// A backend that runs two calls at once (the CUDA backends, harness/campaign's test worker):
// run_batch begins case k (its host staging, copies and kernel queued) before it finishes case
// k-1, so that k's host work overlaps k-1's device work; results keep their order. After
// begin_case returns, the call reads nothing of m but its scalar fields (the input vectors may
// be lent back: RunOptions::on_inputs), and m itself lives until finish_case. At most two
// calls are begun and not finished, finished in the order begun. A fault surfaces when its own
// case is finished (its result is delivered before the one queued behind it is finished).
class PipelinedBackend : public Backend {
 public:
  std::vector<CheckedRun> run_batch(const std::vector<const MaterializedCase*>& cases,
                                    const RunOptions& o = {}) override;

 protected:
  class Pending {
   public:
    virtual ~Pending() = default;
  };
  // Whether two calls may be in flight now (false: each case is finished before the next begins).
  virtual bool overlaps() const { return true; }
  virtual std::unique_ptr<Pending> begin_case(const MaterializedCase& m) = 0;
  // What run_case(m) would give for the call begun; its host time in RunResult::seconds.
  virtual RunResult finish_case(std::unique_ptr<Pending> pending) = 0;
  RunResult run_case(const MaterializedCase& m) override { return finish_case(begin_case(m)); }
};

// A wrapper that describes itself exactly as the backend it wraps (its traits) and runs through
// it; a wrapper overrides only what it changes. Base is Backend or an interface derived from it
// (campaign::IsolatedBackend, PipelinedBackend).
template <class Base = Backend>
class ForwardingBackend : public Base {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  const BackendTraits& traits() const override { return inner_->traits(); }
  std::optional<std::string> unsupported(const MaterializedCase& m) const override {
    return inner_->unsupported(m);
  }

 protected:
  RunResult run_case(const MaterializedCase& m) override { return inner_->run_case(m); }
  std::unique_ptr<Backend> inner_;
};

// A backend whose description is one BackendTraits value it holds (set by its constructor: the
// host models and oracles from what they are, a plugin from its declaration, a worker proxy
// from its worker's INFO reply). Base is Backend or an interface derived from it
// (campaign::IsolatedBackend).
template <class Base = Backend>
class TraitsBackend : public Base {
 public:
  TraitsBackend() = default;
  explicit TraitsBackend(BackendTraits traits) : traits_(std::move(traits)) {}
  const BackendTraits& traits() const override { return traits_; }

 protected:
  BackendTraits traits_;
};

// Helper for bf16 backends: a RunResult that holds the guarded output buffers as its raw
// outputs, their guard violations counted (outputs_pending; out and lse are computed by
// run_batch as its options ask: finish_outputs). The rvalue overload moves the buffers instead
// of copying them.
RunResult collect_outputs(const MaterializedCase& m, const OutputBuffers& bufs);
RunResult collect_outputs(const MaterializedCase& m, OutputBuffers&& bufs);

// Computes out and lse from out_raw and lse_raw (the bf16 values widened exactly) and clears
// outputs_pending; guard_violations stays as collect_outputs counted it. Raw buffers of the
// wrong sizes for m make r a kFault saying so. Does nothing when outputs_pending is not set.
void widen_raw_outputs(const MaterializedCase& m, RunResult& r);
// The cheap half of widen_raw_outputs for a pending result: the raw buffers' sizes checked (a
// mismatch makes r a kFault, as there); out and lse stay empty and outputs_pending set, for
// widen_raw_outputs later. Does nothing when nothing is pending.
void check_raw_outputs(const MaterializedCase& m, RunResult& r);

}  // namespace mlafuzz
