// CUDA backends: device buffers around one kernel launch, errors turned into RunResults.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cuda/cuda_backends.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/device_run.h"
#include "kernels/cuda/launch.h"

namespace mlafuzz::cuda_detail {
namespace {

// One device buffer of a backend, kept between calls and grown when a case needs more: a
// campaign makes thousands of calls per second, and cudaMalloc/cudaFree (which synchronizes the
// device) cost more than the kernels. With MLAFUZZ_CUDA_EXACT_ALLOC=1 every call allocates its
// buffers at their exact sizes and frees them afterwards, so that compute-sanitizer's memcheck
// sees a read one byte past a buffer (scripts/gpu_check.sh sets it).
struct DevMem {
  void* ptr = nullptr;
  size_t capacity = 0;
  DevMem() = default;
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  ~DevMem() { release(); }
  void release() {
    if (ptr != nullptr) (void)cudaFree(ptr);  // errors after a fault ignored
    ptr = nullptr;
    capacity = 0;
  }
  // At least `bytes` (1 for empty buffers); exact sizes when `exact`.
  cudaError_t reserve(size_t bytes, bool exact) {
    bytes = std::max<size_t>(bytes, 1);
    if (ptr != nullptr && (exact ? capacity == bytes : capacity >= bytes)) return cudaSuccess;
    release();
    const size_t want = exact ? bytes : std::max<size_t>(bytes + bytes / 4, 4096);
    const cudaError_t e = cudaMalloc(&ptr, want);
    if (e == cudaSuccess) capacity = want;
    return e;
  }
};

bool exact_allocations() {
  static const bool exact = [] {
    const char* v = std::getenv("MLAFUZZ_CUDA_EXACT_ALLOC");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return exact;
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

class CudaKernelBackend final : public Backend {
 public:
  CudaKernelBackend(std::string name, Precision precision, std::string simt_partner,
                    UnsupportedFn unsupported, LaunchFn launch)
      : name_(std::move(name)),
        precision_(precision),
        simt_partner_(std::move(simt_partner)),
        unsupported_(std::move(unsupported)),
        launch_(std::move(launch)) {}

  std::string name() const override { return name_; }
  Precision precision() const override { return precision_; }
  Availability availability() const override { return device_availability(); }
  bool on_device() const override { return true; }
  std::string simt_partner() const override { return simt_partner_; }

  std::optional<std::string> unsupported(const MaterializedCase& m) const override {
    mla::DecodeParams p = m.host_params();
    p.out_head_stride = m.out_head_stride;
    p.out_batch_stride = m.out_batch_stride;
    return unsupported_(p);
  }

  RunResult run(const MaterializedCase& m) override {
    const auto t0 = std::chrono::steady_clock::now();
    RunResult r = run_impl(m);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

 private:
  RunResult run_impl(const MaterializedCase& m) {
    if (const Availability a = availability(); !a.available) {
      RunResult r;
      r.status = RunStatus::kError;
      r.message = name_ + ": " + a.reason;
      return r;
    }
    if (auto why = unsupported(m)) {
      RunResult r;
      r.status = RunStatus::kUnsupported;
      r.message = *why;
      return r;
    }
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
        {d_out_, bufs.out.data(), bufs.out.size() * 2, "out"},
        {d_lse_, bufs.lse.data(), bufs.lse.size() * 4, "lse"},
    };
    RunResult timing;
    auto t0 = std::chrono::steady_clock::now();
    cudaError_t e;
    for (const Upload& u : uploads) {
      if ((e = u.d.reserve(u.bytes, exact)) != cudaSuccess) return failure(e, u.what);
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
    p.q = static_cast<const uint16_t*>(d_q_.ptr);
    p.kv_cache = static_cast<const uint8_t*>(d_cache_.ptr);
    p.indices = static_cast<const int32_t*>(d_idx_.ptr);
    p.topk_length = m.topk_length.empty() ? nullptr : static_cast<const int32_t*>(d_len_.ptr);
    p.sink = m.sink.empty() ? nullptr : static_cast<const float*>(d_sink_.ptr);
    p.out = static_cast<uint16_t*>(d_out_.ptr) + OutputBuffers::kGuard;
    p.out_head_stride = bufs.out_head_stride;
    p.out_batch_stride = bufs.out_batch_stride;
    p.lse = static_cast<float*>(d_lse_.ptr) + OutputBuffers::kGuard;
    p.lse_batch_stride = bufs.lse_batch_stride;

    t0 = std::chrono::steady_clock::now();
    const int rc = launch_(p);
    if (rc == mla::cuda::kErrUnsupported) {
      RunResult r;
      r.status = RunStatus::kUnsupported;
      r.message = "launcher rejected the case";
      return r;
    }
    if (rc != 0) return failure(static_cast<cudaError_t>(rc), name_ + " launch");
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
    }
    RunResult r = collect_outputs(m, bufs);
    r.phases = timing.phases;
    return r;
  }

  std::string name_;
  Precision precision_;
  std::string simt_partner_;
  UnsupportedFn unsupported_;
  LaunchFn launch_;
  // Device buffers kept between calls (DevMem); one backend object serves one thread.
  DevMem d_q_, d_cache_, d_idx_, d_len_, d_sink_, d_out_, d_lse_;
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
                                             LaunchFn launch) {
  return std::make_unique<CudaKernelBackend>(std::move(name), precision, std::move(simt_partner),
                                             std::move(unsupported), std::move(launch));
}

}  // namespace mlafuzz::cuda_detail

namespace mlafuzz {

std::unique_ptr<Backend> make_cuda_simt_backend() {
  return cuda_detail::make_kernel_backend(
      "cuda-simt", Precision::kSimtFp32, "",
      [](const mla::DecodeParams& p) { return mla::cuda::simt_unsupported(p); },
      [](const mla::DecodeParams& p) { return mla::cuda::launch_simt_per_head(p, nullptr); });
}

std::unique_ptr<Backend> make_cuda_mma_backend(int block_h) {
  return cuda_detail::make_kernel_backend(
      block_h == 64   ? "cuda-mma-h64"
      : block_h == 32 ? "cuda-mma"
                      : "cuda-mma-h" + std::to_string(block_h),
      Precision::kMmaBf16, "cuda-simt",
      [block_h](const mla::DecodeParams& p) { return mla::cuda::mma_unsupported(p, block_h); },
      [block_h](const mla::DecodeParams& p) {
        return mla::cuda::launch_mma_head_tiled(p, block_h, nullptr);
      });
}

}  // namespace mlafuzz
