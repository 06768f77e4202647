// CUDA backends: device buffers around one kernel launch, errors turned into RunResults.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/settings.h"
#include "kernels/cuda/cuda_backends.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/device_run.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/size_class_pool.h"
#include "mla/split_kv.h"

namespace mlafuzz::cuda_detail {
namespace {

bool exact_allocations() {
  static const bool exact = settings::flag("MLAFUZZ_CUDA_EXACT_ALLOC", false);
  return exact;
}

// The most bytes each of a backend's two pools (device, pinned) keeps on its free lists:
// MLAFUZZ_CUDA_POOL_MB (default 2048).
size_t pool_cache_limit() {
  static const size_t bytes =
      static_cast<size_t>(std::max<int64_t>(settings::integer("MLAFUZZ_CUDA_POOL_MB", 2048), 0))
      << 20;
  return bytes;
}

struct DeviceBacking {
  int allocate(size_t bytes, void** p) { return static_cast<int>(cudaMalloc(p, bytes)); }
  void deallocate(void* p) { (void)cudaFree(p); }  // errors after a fault ignored
};
struct PinnedBacking {
  int allocate(size_t bytes, void** p) {
    return static_cast<int>(cudaHostAlloc(p, bytes, cudaHostAllocDefault));
  }
  void deallocate(void* p) { (void)cudaFreeHost(p); }
};
using DevicePool = mla::cuda::SizeClassPool<DeviceBacking>;
using PinnedPool = mla::cuda::SizeClassPool<PinnedBacking>;

// One buffer of a backend, kept between calls and swapped for a block of the backend's caching
// pool (size_class_pool.h) when a case needs more or much less: a campaign makes thousands of
// calls per second, and cudaMalloc/cudaFree (which synchronizes the device) cost more than the
// kernels. With MLAFUZZ_CUDA_EXACT_ALLOC=1 (device buffers only) every call allocates its
// buffers at their exact sizes with cudaMalloc and frees them afterwards, no pool, so that
// compute-sanitizer's memcheck sees a read one byte past a buffer (scripts/gpu_check.sh sets it).
template <typename Pool, typename Backing>
struct PooledMem {
  void* ptr = nullptr;
  size_t capacity = 0;
  Pool* pool = nullptr;  // where ptr came from; null: exact cudaMalloc
  PooledMem() = default;
  PooledMem(const PooledMem&) = delete;
  PooledMem& operator=(const PooledMem&) = delete;
  ~PooledMem() { release(); }
  void release() {
    if (ptr != nullptr) {
      if (pool != nullptr) {
        pool->release(ptr, capacity);
      } else {
        Backing{}.deallocate(ptr);
      }
    }
    ptr = nullptr;
    capacity = 0;
    pool = nullptr;
  }
  // At least `bytes` (1 for empty buffers) from `from`; exact sizes, no pool, when `exact`. A
  // block more than twice the need's size class goes back to the pool for a bigger case.
  cudaError_t reserve(size_t bytes, bool exact, Pool* from) {
    bytes = std::max<size_t>(bytes, 1);
    if (ptr != nullptr) {
      if (exact ? (pool == nullptr && capacity == bytes)
                : (pool != nullptr && capacity >= bytes &&
                   capacity <= 2 * mla::cuda::size_class(bytes))) {
        return cudaSuccess;
      }
    }
    release();
    if (exact || from == nullptr) {
      const int e = Backing{}.allocate(bytes, &ptr);
      if (e != 0) {
        ptr = nullptr;
        return static_cast<cudaError_t>(e);
      }
      capacity = bytes;
      return cudaSuccess;
    }
    const int e = from->acquire(bytes, &ptr, &capacity);
    if (e == 0) pool = from;
    return static_cast<cudaError_t>(e);
  }
  uint8_t* bytes_ptr() const { return static_cast<uint8_t*>(ptr); }
};
using DevMem = PooledMem<DevicePool, DeviceBacking>;
using PinnedMem = PooledMem<PinnedPool, PinnedBacking>;

// Fills the output block with the canaries (OutputBuffers::kCanaryBits, kLseCanaryBits) on the
// device: no host-side canary buffer, no upload of it.
__global__ void fill_canaries_kernel(uint16_t* out, size_t n_out, uint16_t out_bits, uint32_t* lse,
                                     size_t n_lse, uint32_t lse_bits) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_out;
       i += stride) {
    out[i] = out_bits;
  }
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_lse;
       i += stride) {
    lse[i] = lse_bits;
  }
}

cudaError_t fill_canaries(uint16_t* out, size_t n_out, uint32_t* lse, size_t n_lse) {
  const size_t n = std::max(n_out, n_lse);
  const unsigned blocks = static_cast<unsigned>(std::clamp<size_t>((n + 255) / 256, 1, 1024));
  fill_canaries_kernel<<<blocks, 256, 0, 0>>>(out, n_out, OutputBuffers::kCanaryBits, lse, n_lse,
                                              OutputBuffers::kLseCanaryBits);
  return cudaGetLastError();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

RunResult failure(cudaError_t e, const std::string& what) {
  RunResult r;
  r.status = mla::cuda::sticky_error(e) ? RunStatus::kFault : RunStatus::kError;
  r.message = what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  return r;
}

// Whether the campaign path (inputs resident on the device, pinned staging, one synchronization
// per call) is on: MLAFUZZ_CUDA_RESIDENT=0 turns it off (every input copied from pageable memory
// with one synchronizing cudaMemcpy each, for before/after measurements).
bool resident_inputs_enabled() {
  static const bool on = settings::flag("MLAFUZZ_CUDA_RESIDENT", true);
  return on && !exact_allocations();
}

// The last few distinct contents of one input (q, the cache, ...) kept on the device, each with a
// pinned host copy of the bytes it holds. The property variants of a case share most of their
// inputs (relocation and poisoning change the cache, rows and heads alone q and the indices,
// permutation the indices), so a call uploads only the inputs no kept version matches byte for
// byte: equality is decided by memcmp against the pinned copy, never by a hash. A kernel only
// reads its inputs; one that wrote into them would change what later calls see (the device
// copy is not re-read), which MLAFUZZ_CUDA_RESIDENT=0 rules out when a finding looks odd.
class ResidentInput {
 public:
  static constexpr int kVersions = 4;
  // A host-to-device copy the caller issues (asynchronously, from pinned memory).
  struct Copy {
    void* dev;
    const void* host;
    size_t bytes;
  };
  // The device copy of `bytes` bytes at `src`: a kept version when one matches (hit), else the
  // least recently used version is refilled: its pinned copy now, the upload appended to
  // `uploads`.
  // The version used is marked in use (*used receives its number) until release(*used): a
  // call in flight keeps its versions (their device bytes, the pinned bytes its upload reads)
  // from being refilled by the next call's staging. `tag` (InputTags, 0: none) names the bytes:
  // a version holding the same nonzero tag matches without a comparison.
  cudaError_t stage(const void* src, size_t bytes, uint64_t tag, void** dev,
                    std::vector<Copy>* uploads, DevicePool* dev_pool, PinnedPool* pinned_pool,
                    double* alloc_s, int* used) {
    ++tick_;
    *used = -1;
    for (int i = 0; i < kVersions; ++i) {
      Version& v = versions_[i];
      const bool same =
          v.valid && v.bytes == bytes &&
          ((tag != 0 && v.tag == tag) || bytes == 0 || std::memcmp(v.host.ptr, src, bytes) == 0);
      if (same) {
        if (tag != 0) v.tag = tag;
        v.last_use = tick_;
        ++v.in_use;
        *used = i;
        *dev = v.dev.ptr;
        return cudaSuccess;
      }
    }
    Version* victim = nullptr;
    for (Version& v : versions_) {
      if (v.in_use > 0) continue;
      if (!v.valid) {
        victim = &v;
        break;
      }
      if (victim == nullptr || v.last_use < victim->last_use) victim = &v;
    }
    // At most two calls are in flight, each holding one version: one of four is free.
    if (victim == nullptr) return cudaErrorNotReady;
    victim->valid = false;
    const auto t0 = std::chrono::steady_clock::now();
    cudaError_t e = victim->host.reserve(bytes, false, pinned_pool);
    if (e == cudaSuccess) e = victim->dev.reserve(bytes, false, dev_pool);
    *alloc_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (e != cudaSuccess) return e;
    if (bytes > 0) {
      std::memcpy(victim->host.ptr, src, bytes);
      uploads->push_back({victim->dev.ptr, victim->host.ptr, bytes});
    }
    victim->bytes = bytes;
    victim->tag = tag;
    victim->last_use = tick_;
    victim->valid = true;  // the caller issues the upload (a failed call invalidates)
    ++victim->in_use;
    *used = static_cast<int>(victim - versions_);
    *dev = victim->dev.ptr;
    return cudaSuccess;
  }
  // The call that staged version `used` (stage's *used; -1: none) is done with it.
  void release(int used) {
    if (used >= 0 && versions_[used].in_use > 0) --versions_[used].in_use;
  }
  // Forgets every version (after a failed call: an upload may not have completed). Versions
  // still in use by a call in flight stay unrefillable until it releases them.
  void invalidate() {
    for (Version& v : versions_) v.valid = false;
  }

 private:
  struct Version {
    DevMem dev;
    PinnedMem host;
    size_t bytes = 0;
    uint64_t tag = 0;  // the InputTags name of the bytes it holds (0: none)
    uint64_t last_use = 0;
    int in_use = 0;  // calls begun and not finished that read this version
    bool valid = false;
  };
  Version versions_[kVersions];
  uint64_t tick_ = 0;
};

// CUDA events around the phases of one call: the device-side durations of the uploads, the
// kernel and the downloads, read after the call's one synchronization.
// Created at the first call (constructing a backend must not create a CUDA context).
struct PhaseEvents {
  cudaEvent_t e[4] = {nullptr, nullptr, nullptr, nullptr};
  bool ok = false;
  PhaseEvents() = default;
  PhaseEvents(const PhaseEvents&) = delete;
  PhaseEvents& operator=(const PhaseEvents&) = delete;
  cudaError_t create() {
    if (ok) return cudaSuccess;
    for (auto& x : e) {
      if (x == nullptr) {
        if (const cudaError_t err = cudaEventCreate(&x); err != cudaSuccess) return err;
      }
    }
    ok = true;
    return cudaSuccess;
  }
  ~PhaseEvents() {
    for (auto& x : e) {
      if (x != nullptr) (void)cudaEventDestroy(x);
    }
  }
  double seconds(int a, int b) const {
    float ms = 0;
    return ok && cudaEventElapsedTime(&ms, e[a], e[b]) == cudaSuccess ? ms * 1e-3 : 0.0;
  }
};

class CudaKernelBackend final : public PipelinedBackend {
 public:
  CudaKernelBackend(std::string name, Precision precision, std::string simt_partner,
                    UnsupportedFn unsupported, LaunchFn launch, bool resident,
                    Envelope envelope = cuda_kernel_envelope(), SplitLaunch split = {},
                    std::function<int()> token_tile = {})
      : envelope_(std::move(envelope)),
        name_(std::move(name)),
        precision_(precision),
        simt_partner_(std::move(simt_partner)),
        unsupported_(std::move(unsupported)),
        launch_(std::move(launch)),
        resident_(resident && resident_inputs_enabled()),
        split_(std::move(split)),
        token_tile_(std::move(token_tile)) {}

  // The envelope is the launchers' limits (launch.h, common_unsupported); the availability and
  // the token tile (0: the MMA default of 64, unless the device runs the small configuration)
  // are asked of the device at the first call, not when the backend is made.
  const BackendTraits& traits() const override {
    std::call_once(traits_once_, [this] {
      traits_.name = name_;
      traits_.precision = precision_;
      traits_.availability = device_availability();
      traits_.envelope = envelope_;
      traits_.on_device = true;
      traits_.needs_worker = true;
      traits_.simt_partner = simt_partner_;
      traits_.splits_kv = splits_kv();
      traits_.token_tile = token_tile_ ? token_tile_() : 0;
    });
    return traits_;
  }

  // The production decode (docs/SPEC.md section 8: s_q query tokens per row, the extra cache) is
  // staged like the rest: the launchers decide.
  std::optional<std::string> unsupported(const MaterializedCase& m) const override {
    mla::DecodeParams p = m.host_params();
    p.out_head_stride = m.out_head_stride;
    p.out_token_stride = m.out_token_stride;
    p.out_batch_stride = m.out_batch_stride;
    return unsupported_(p);
  }

 protected:
  // A batch (run_batch: the campaign's worker, harness/campaign/worker.cc) overlaps two calls:
  // the second one's host staging and queued copies while the first one's copies and kernel
  // run. Each call in flight has its own output block, pinned staging, events and split
  // workspace (slot 0 or 1), and keeps the input versions it reads (ResidentInput::release at
  // its finish).
  bool overlaps() const override { return resident_; }

  std::unique_ptr<Pending> begin_case(const MaterializedCase& m) override {
    const auto t0 = std::chrono::steady_clock::now();
    auto p = std::make_unique<Call>();
    p->m = &m;
    if (const Availability a = device_availability(); !a.available) {
      p->result.status = RunStatus::kError;
      p->result.message = name_ + ": " + a.reason;
    } else if (auto why = unsupported(m)) {
      p->result.status = RunStatus::kUnsupported;
      p->result.message = *why;
    } else if (!resident_) {
      p->result = run_per_call(m);
    } else {
      p->slot = next_slot_;
      next_slot_ ^= 1;
      p->result = begin_resident(m, *p);
      p->queued = p->result.status == RunStatus::kOk;
      if (!p->queued) after_failure(*p, p->result);
    }
    p->host_s = seconds_since(t0);
    return p;
  }

  RunResult finish_case(std::unique_ptr<Pending> pending) override {
    auto* p = dynamic_cast<Call*>(pending.get());
    if (p == nullptr) throw std::logic_error(name_ + ": finish_case of a call begun elsewhere");
    const auto t0 = std::chrono::steady_clock::now();
    RunResult r = p->queued ? finish_resident(*p) : std::move(p->result);
    if (p->queued && !r.ok()) after_failure(*p, r);
    for (int i = 0; i < kInputs; ++i) inputs_[i].release(p->used[i]);
    r.seconds = p->host_s + seconds_since(t0);  // the call's own host time, not the overlap
    return r;
  }

 private:
  // q, cache, indices, topk_length, sink, extra cache, extra indices, extra topk_length.
  static constexpr int kInputs = 8;
  // A call begun (begin_case): its slot, what it staged, and where its result lies.
  struct Call final : Pending {
    const MaterializedCase* m = nullptr;
    int slot = 0;
    bool queued = false;  // everything queued: finish_resident collects it; else `result`
    RunResult result;     // the early result, or the phases measured while queueing
    int used[kInputs] = {-1, -1, -1, -1, -1, -1, -1, -1};
    size_t out_n = 0, lse_n = 0, lse_at = 0, block_bytes = 0;
    double host_s = 0;
  };

  // After a failed call: the kept input versions are forgotten (an upload may not have
  // completed); an error or a fault (an out-of-memory among them) also gives the pools' free
  // blocks back, once the copies in flight are done (a fault: returns at once).
  void after_failure(const Call& p, const RunResult& r) {
    (void)p;
    for (ResidentInput& in : inputs_) in.invalidate();
    if (r.status == RunStatus::kError || r.status == RunStatus::kFault) {
      (void)cudaDeviceSynchronize();
      dev_pool_.trim();
      pinned_pool_.trim();
    }
  }

  // Launches on the default stream; kOk, or the launcher's rejection or error as a RunResult.
  // A split-KV backend launches with its setting (or the case's split_override) and its
  // workspace `ws`, grown when a case needs more and kept between calls (exact sizes, freed
  // after the call, under MLAFUZZ_CUDA_EXACT_ALLOC).
  RunResult launch_and_check(mla::DecodeParams& p, const MaterializedCase& m, DevMem& ws) {
    int rc = 0;
    if (splits_kv()) {
      const int setting = m.split_override != 0 ? m.split_override : split_.setting;
      const size_t bytes = split_.workspace_bytes(p, setting);
      if (const cudaError_t e = ws.reserve(bytes, exact_allocations(), &dev_pool_);
          e != cudaSuccess) {
        return failure(e, "split workspace (" + std::to_string(bytes) + " bytes)");
      }
      rc = split_.launch(p, setting, ws.ptr, ws.capacity);
    } else {
      rc = launch_(p);
    }
    if (rc == mla::cuda::kErrUnsupported) {
      RunResult r;
      r.status = RunStatus::kUnsupported;
      r.message = "launcher rejected the case";
      return r;
    }
    if (rc != 0) return failure(static_cast<cudaError_t>(rc), name_ + " launch");
    return RunResult{};
  }

  // Points p at device outputs laid out as OutputBuffers(m) (kGuard elements before the body).
  static void point_at_outputs(mla::DecodeParams& p, const MaterializedCase& m, uint16_t* d_out,
                               float* d_lse) {
    p.out = d_out + OutputBuffers::kGuard;
    p.out_head_stride = m.out_head_stride;
    p.out_token_stride = m.out_token_stride;
    p.out_batch_stride = m.out_batch_stride;
    p.lse = d_lse + OutputBuffers::kGuard;
    p.lse_token_stride = m.lse_token_stride;
    p.lse_batch_stride = m.lse_batch_stride;
  }

  // The device pointers of the inputs (in the order of kInputs) into p; the extra cache's only
  // when the case has one.
  static void point_at_inputs(mla::DecodeParams& p, const MaterializedCase& m, void* const* dev) {
    p.q = static_cast<const uint16_t*>(dev[0]);
    p.kv_cache = static_cast<const uint8_t*>(dev[1]);
    p.indices = static_cast<const int32_t*>(dev[2]);
    p.topk_length = m.topk_length.empty() ? nullptr : static_cast<const int32_t*>(dev[3]);
    p.sink = m.sink.empty() ? nullptr : static_cast<const float*>(dev[4]);
    if (m.has_extra) {
      p.extra_kv_cache = static_cast<const uint8_t*>(dev[5]);
      p.extra_indices = static_cast<const int32_t*>(dev[6]);
      p.extra_topk_length =
          m.extra_topk_length.empty() ? nullptr : static_cast<const int32_t*>(dev[7]);
    }
  }

  // The campaign path: inputs staged through ResidentInput (only changed ones uploaded, from
  // pinned memory), the output block (out, then lse 256-byte aligned) filled with the canaries
  // on the device, every copy and the kernels asynchronous on the default stream, one download
  // of the block into pinned memory, one synchronization (in finish_resident). Every buffer
  // comes from the backend's caching pools. Phases: `alloc` and `stage` are host wall time
  // (device and pinned blocks taken from the pools or the driver; comparing inputs with the
  // kept versions and copying changed ones into pinned memory), `upload` (the changed inputs
  // and the canary fill), `kernel` and `download` the device-side durations between CUDA events
  // (the first event runs when the stream reaches it: after the call before, when two overlap).
  // kOk when everything is queued (p.result holds the host phases), else the failure.
  RunResult begin_resident(const MaterializedCase& m, Call& p) {
    const int slot = p.slot;
    p.out_n = OutputBuffers::out_elements(m);
    p.lse_n = OutputBuffers::lse_elements(m);
    p.lse_at = (p.out_n * 2 + 255) / 256 * 256;
    p.block_bytes = p.lse_at + p.lse_n * 4;
    RunResult timing;
    cudaError_t e;
    auto t0 = std::chrono::steady_clock::now();
    if ((e = d_block_[slot].reserve(p.block_bytes, false, &dev_pool_)) != cudaSuccess) {
      return failure(e, "out and lse");
    }
    if ((e = pinned_block_[slot].reserve(p.block_bytes, false, &pinned_pool_)) != cudaSuccess) {
      return failure(e, "pinned staging");
    }
    PhaseEvents& ev = events_[slot];
    if ((e = ev.create()) != cudaSuccess) return failure(e, "cuda events");
    double alloc_s = seconds_since(t0);
    timing.phases[Phase::kAlloc] = alloc_s;
    t0 = std::chrono::steady_clock::now();
    struct Input {
      const void* src;
      size_t bytes;
      const char* what;
    };
    const Input in[kInputs] = {
        {m.q.data(), m.q.size() * 2, "q"},
        {m.cache.data(), m.cache.size(), "kv cache"},
        {m.indices.data(), m.indices.size() * 4, "indices"},
        {m.topk_length.data(), m.topk_length.size() * 4, "topk_length"},
        {m.sink.data(), m.sink.size() * 4, "sink"},
        {m.extra_cache.data(), m.extra_cache.size(), "extra kv cache"},
        {m.extra_indices.data(), m.extra_indices.size() * 4, "extra indices"},
        {m.extra_topk_length.data(), m.extra_topk_length.size() * 4, "extra topk_length"},
    };
    void* dev[kInputs] = {};
    uploads_.clear();
    for (int i = 0; i < kInputs; ++i) {
      if ((e = inputs_[i].stage(in[i].src, in[i].bytes, m.input_tags.tag[i], &dev[i], &uploads_,
                                &dev_pool_, &pinned_pool_, &alloc_s, &p.used[i])) != cudaSuccess) {
        return failure(e, in[i].what);
      }
    }
    // The inputs' pool allocations are alloc, not stage.
    const double stage_alloc_s = alloc_s - timing.phases[Phase::kAlloc];
    timing.phases[Phase::kAlloc] = alloc_s;
    timing.phases[Phase::kStage] = std::max(0.0, seconds_since(t0) - stage_alloc_s);
    // Host staging is done: the upload interval holds the copies and the canary fill alone.
    if ((e = cudaEventRecord(ev.e[0], 0)) != cudaSuccess) return failure(e, "event");
    for (const ResidentInput::Copy& c : uploads_) {
      if ((e = cudaMemcpyAsync(c.dev, c.host, c.bytes, cudaMemcpyHostToDevice, 0)) != cudaSuccess) {
        return failure(e, "upload");
      }
    }
    uint16_t* d_out = static_cast<uint16_t*>(d_block_[slot].ptr);
    float* d_lse = reinterpret_cast<float*>(d_block_[slot].bytes_ptr() + p.lse_at);
    if ((e = fill_canaries(d_out, p.out_n, reinterpret_cast<uint32_t*>(d_lse), p.lse_n)) !=
        cudaSuccess) {
      return failure(e, "canary fill");
    }
    if ((e = cudaEventRecord(ev.e[1], 0)) != cudaSuccess) return failure(e, "event");

    mla::DecodeParams params = m.host_params();
    point_at_inputs(params, m, dev);
    point_at_outputs(params, m, d_out, d_lse);
    if (RunResult l = launch_and_check(params, m, d_ws_[slot]); l.status != RunStatus::kOk) {
      return l;
    }
    if ((e = cudaEventRecord(ev.e[2], 0)) != cudaSuccess) return failure(e, "event");
    if ((e = cudaMemcpyAsync(pinned_block_[slot].ptr, d_block_[slot].ptr, p.block_bytes,
                             cudaMemcpyDeviceToHost, 0)) != cudaSuccess) {
      return failure(e, "copy outputs back");
    }
    if ((e = cudaEventRecord(ev.e[3], 0)) != cudaSuccess) return failure(e, "event");
    return timing;
  }

  // The call's one synchronization (a kernel fault surfaces here) and its outputs.
  RunResult finish_resident(Call& p) {
    const int slot = p.slot;
    PhaseEvents& ev = events_[slot];
    cudaError_t e;
    if ((e = cudaEventSynchronize(ev.e[3])) != cudaSuccess) return failure(e, name_ + " kernel");
    if ((e = cudaGetLastError()) != cudaSuccess) return failure(e, name_ + " kernel");
    RunResult& timing = p.result;
    timing.phases[Phase::kUpload] = ev.seconds(0, 1);
    timing.phases[Phase::kKernel] = ev.seconds(1, 2);
    timing.phases[Phase::kDownload] = ev.seconds(2, 3);
    // The result's raw buffers copied once out of the pinned block (no canary fill on the host).
    const PinnedMem& block = pinned_block_[slot];
    OutputBuffers bufs(*p.m, static_cast<const uint16_t*>(block.ptr),
                       reinterpret_cast<const float*>(block.bytes_ptr() + p.lse_at));
    RunResult r = collect_outputs(*p.m, std::move(bufs));
    r.phases = timing.phases;
    return r;
  }

  // Every buffer copied from pageable memory with its own synchronizing cudaMemcpy (plugins'
  // per-call staging, MLAFUZZ_CUDA_EXACT_ALLOC for compute-sanitizer, MLAFUZZ_CUDA_RESIDENT=0).
  RunResult run_per_call(const MaterializedCase& m) {
    OutputBuffers bufs(m);
    const bool exact = exact_allocations();
    struct Upload {
      DevMem& d;
      const void* src;
      size_t bytes;
      const char* what;
    };
    const Upload uploads[] = {
        {d_q_, m.q.data(), m.q.size() * 2, "q"},
        {d_cache_, m.cache.data(), m.cache.size(), "kv cache"},
        {d_idx_, m.indices.data(), m.indices.size() * 4, "indices"},
        {d_len_, m.topk_length.data(), m.topk_length.size() * 4, "topk_length"},
        {d_sink_, m.sink.data(), m.sink.size() * 4, "sink"},
        {d_xcache_, m.extra_cache.data(), m.extra_cache.size(), "extra kv cache"},
        {d_xidx_, m.extra_indices.data(), m.extra_indices.size() * 4, "extra indices"},
        {d_xlen_, m.extra_topk_length.data(), m.extra_topk_length.size() * 4, "extra topk_length"},
        {d_out_, bufs.out.data(), bufs.out.size() * 2, "out"},
        {d_lse_, bufs.lse.data(), bufs.lse.size() * 4, "lse"},
    };
    RunResult timing;
    auto t0 = std::chrono::steady_clock::now();
    cudaError_t e;
    for (const Upload& u : uploads) {
      if ((e = u.d.reserve(u.bytes, exact, &dev_pool_)) != cudaSuccess) return failure(e, u.what);
    }
    timing.phases[Phase::kAlloc] = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    for (const Upload& u : uploads) {
      if (u.bytes == 0) continue;
      if ((e = cudaMemcpy(u.d.ptr, u.src, u.bytes, cudaMemcpyHostToDevice)) != cudaSuccess) {
        return failure(e, u.what);
      }
    }
    timing.phases[Phase::kUpload] = seconds_since(t0);

    mla::DecodeParams p = m.host_params();
    void* const dev[kInputs] = {d_q_.ptr,    d_cache_.ptr,  d_idx_.ptr,  d_len_.ptr,
                                d_sink_.ptr, d_xcache_.ptr, d_xidx_.ptr, d_xlen_.ptr};
    point_at_inputs(p, m, dev);
    point_at_outputs(p, m, static_cast<uint16_t*>(d_out_.ptr), static_cast<float*>(d_lse_.ptr));

    t0 = std::chrono::steady_clock::now();
    if (RunResult l = launch_and_check(p, m, d_ws_[0]); l.status != RunStatus::kOk) return l;
    if ((e = cudaDeviceSynchronize()) != cudaSuccess) return failure(e, name_ + " kernel");
    timing.phases[Phase::kKernel] = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    if ((e = cudaMemcpy(bufs.out.data(), d_out_.ptr, bufs.out.size() * 2,
                        cudaMemcpyDeviceToHost)) != cudaSuccess)
      return failure(e, "copy out back");
    if ((e = cudaMemcpy(bufs.lse.data(), d_lse_.ptr, bufs.lse.size() * 4,
                        cudaMemcpyDeviceToHost)) != cudaSuccess)
      return failure(e, "copy lse back");
    timing.phases[Phase::kDownload] = seconds_since(t0);
    if (exact) {
      for (const Upload& u : uploads) u.d.release();
      d_ws_[0].release();
    }
    RunResult r = collect_outputs(m, bufs);
    r.phases = timing.phases;
    return r;
  }

  bool splits_kv() const { return split_.setting != mla::kSplitOff; }

  mutable std::once_flag traits_once_;
  mutable BackendTraits traits_;
  Envelope envelope_;
  std::string name_;
  Precision precision_;
  std::string simt_partner_;
  UnsupportedFn unsupported_;
  LaunchFn launch_;
  bool resident_;
  // The caching pools every buffer below comes from (declared first: destroyed last, after the
  // buffers went back to them); one backend object serves one thread.
  DevicePool dev_pool_{DeviceBacking{}, pool_cache_limit()};
  PinnedPool pinned_pool_{PinnedBacking{}, pool_cache_limit()};
  // Device buffers kept between calls (DevMem).
  DevMem d_q_, d_cache_, d_idx_, d_len_, d_sink_, d_xcache_, d_xidx_, d_xlen_, d_out_, d_lse_;
  // Split-KV: the launcher and its workspace (fp32 partials) per slot, kept between calls.
  SplitLaunch split_;
  DevMem d_ws_[2];
  std::function<int()> token_tile_;
  // The resident path's inputs (the kInputs above), output staging, events.
  ResidentInput inputs_[kInputs];
  std::vector<ResidentInput::Copy> uploads_;
  // Per slot (a call in flight): the device output block, its pinned copy, the events.
  DevMem d_block_[2];
  PinnedMem pinned_block_[2];
  PhaseEvents events_[2];
  int next_slot_ = 0;
};

}  // namespace

Availability device_availability() {
  static const Availability a = [] {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
      return Availability{false, std::string("no CUDA device: ") + cudaGetErrorString(e)};
    if (n == 0) return Availability{false, "no CUDA device: device count is 0"};
    return Availability{true, ""};
  }();
  return a;
}

std::unique_ptr<Backend> make_kernel_backend(std::string name, Precision precision,
                                             std::string simt_partner, UnsupportedFn unsupported,
                                             LaunchFn launch, Envelope envelope) {
  return std::make_unique<CudaKernelBackend>(std::move(name), precision, std::move(simt_partner),
                                             std::move(unsupported), std::move(launch), false,
                                             std::move(envelope));
}

std::unique_ptr<Backend> make_split_kernel_backend(std::string name, Precision precision,
                                                   std::string simt_partner,
                                                   UnsupportedFn unsupported, SplitLaunch split,
                                                   bool resident, Envelope envelope) {
  return std::make_unique<CudaKernelBackend>(std::move(name), precision, std::move(simt_partner),
                                             std::move(unsupported), LaunchFn{}, resident,
                                             std::move(envelope), std::move(split));
}

std::unique_ptr<Backend> make_resident_kernel_backend(std::string name, Precision precision,
                                                      std::string simt_partner,
                                                      UnsupportedFn unsupported, LaunchFn launch,
                                                      std::function<int()> token_tile = {}) {
  return std::make_unique<CudaKernelBackend>(
      std::move(name), precision, std::move(simt_partner), std::move(unsupported),
      std::move(launch), true, cuda_kernel_envelope(), SplitLaunch{}, std::move(token_tile));
}

}  // namespace mlafuzz::cuda_detail

namespace mlafuzz {

std::unique_ptr<Backend> make_cuda_simt_backend() {
  return cuda_detail::make_resident_kernel_backend(
      "cuda-simt", Precision::kSimtFp32, "",
      [](const mla::DecodeParams& p) { return mla::cuda::simt_unsupported(p); },
      [](const mla::DecodeParams& p) { return mla::cuda::launch_simt_per_head(p, nullptr); });
}

std::unique_ptr<Backend> make_cuda_mma_backend(int block_h) {
  return cuda_detail::make_resident_kernel_backend(
      block_h == 64   ? "cuda-mma-h64"
      : block_h == 32 ? "cuda-mma"
                      : "cuda-mma-h" + std::to_string(block_h),
      Precision::kMmaBf16, "cuda-simt",
      [block_h](const mla::DecodeParams& p) { return mla::cuda::mma_unsupported(p, block_h); },
      [block_h](const mla::DecodeParams& p) {
        return mla::cuda::launch_mma_head_tiled(p, block_h, nullptr);
      },
      // 32 where the device runs the small configuration for cuda-mma (sm_120), else 0 (64).
      [block_h] {
        const int t = mla::cuda::mma_token_tile(block_h);
        return t == mla::kMmaTokenTile ? 0 : t;
      });
}

std::unique_ptr<Backend> make_cuda_mma_small_backend() {
  return cuda_detail::make_resident_kernel_backend(
      "cuda-mma-small", Precision::kMmaBf16, "cuda-simt",
      [](const mla::DecodeParams& p) { return mla::cuda::mma_small_unsupported(p); },
      [](const mla::DecodeParams& p) { return mla::cuda::launch_mma_head_tiled_small(p, nullptr); },
      [] { return mla::kMmaSmallTokenTile; });
}

std::unique_ptr<Backend> make_cuda_mma_split_backend(int split) {
  if (split < mla::kSplitMax) {
    throw std::invalid_argument("split count " + std::to_string(split) +
                                ": give n >= 1, 0 (automatic) or -1 (one split per tile)");
  }
  std::string name = "cuda-mma-split";
  if (split == mla::kSplitMax) {
    name += "-max";
  } else if (split != mla::kSplitAuto) {
    name += std::to_string(split);
  }
  cuda_detail::SplitLaunch sl;
  sl.setting = split;
  sl.workspace_bytes = [](const mla::DecodeParams& p, int s) {
    return mla::cuda::mma_split_workspace_bytes(p, 32, s);
  };
  sl.launch = [](const mla::DecodeParams& p, int s, void* ws, size_t bytes) {
    return mla::cuda::launch_mma_split(p, 32, s, ws, bytes, nullptr);
  };
  return cuda_detail::make_split_kernel_backend(
      std::move(name), Precision::kMmaBf16, "cuda-simt",
      [](const mla::DecodeParams& p) { return mla::cuda::mma_unsupported(p, 32); }, std::move(sl),
      /*resident=*/true);
}

}  // namespace mlafuzz
