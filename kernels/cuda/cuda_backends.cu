// CUDA backends: device buffers around one kernel launch, errors turned into RunResults.
#include <chrono>
#include <cstring>
#include <vector>

#include "kernels/cuda/cuda_backends.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/device_run.h"
#include "kernels/cuda/launch.h"

namespace mlafuzz::cuda_detail {
namespace {

// Owns one device allocation; freed on scope exit (errors of cudaFree after a fault ignored).
struct DevMem {
  void* ptr = nullptr;
  DevMem() = default;
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  ~DevMem() {
    if (ptr != nullptr) (void)cudaFree(ptr);
  }
};

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
    p.out_batch_stride = m.out_head_stride * m.heads;
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
    DevMem d_q, d_cache, d_idx, d_len, d_sink, d_out, d_lse;
    // Copies a host vector to a fresh device buffer (1 byte allocated for empty vectors).
    auto upload = [](DevMem& d, const void* src, size_t bytes) -> cudaError_t {
      cudaError_t e = cudaMalloc(&d.ptr, bytes > 0 ? bytes : 1);
      if (e != cudaSuccess) return e;
      if (bytes == 0) return cudaSuccess;
      return cudaMemcpy(d.ptr, src, bytes, cudaMemcpyHostToDevice);
    };
    cudaError_t e;
    if ((e = upload(d_q, m.q.data(), m.q.size() * 2)) != cudaSuccess) return failure(e, "q");
    if ((e = upload(d_cache, m.cache.data(), m.cache.size())) != cudaSuccess)
      return failure(e, "kv cache");
    if ((e = upload(d_idx, m.indices.data(), m.indices.size() * 4)) != cudaSuccess)
      return failure(e, "indices");
    if (!m.topk_length.empty() &&
        (e = upload(d_len, m.topk_length.data(), m.topk_length.size() * 4)) != cudaSuccess)
      return failure(e, "topk_length");
    if (!m.sink.empty() && (e = upload(d_sink, m.sink.data(), m.sink.size() * 4)) != cudaSuccess)
      return failure(e, "sink");
    if ((e = upload(d_out, bufs.out.data(), bufs.out.size() * 2)) != cudaSuccess)
      return failure(e, "out");
    if ((e = upload(d_lse, bufs.lse.data(), bufs.lse.size() * 4)) != cudaSuccess)
      return failure(e, "lse");

    mla::DecodeParams p = m.host_params();
    p.q = static_cast<const uint16_t*>(d_q.ptr);
    p.kv_cache = static_cast<const uint8_t*>(d_cache.ptr);
    p.indices = static_cast<const int32_t*>(d_idx.ptr);
    p.topk_length = m.topk_length.empty() ? nullptr : static_cast<const int32_t*>(d_len.ptr);
    p.sink = m.sink.empty() ? nullptr : static_cast<const float*>(d_sink.ptr);
    p.out = static_cast<uint16_t*>(d_out.ptr) + OutputBuffers::kGuard;
    p.out_head_stride = bufs.out_head_stride;
    p.out_batch_stride = bufs.out_batch_stride;
    p.lse = static_cast<float*>(d_lse.ptr) + OutputBuffers::kGuard;

    const int rc = launch_(p);
    if (rc == mla::cuda::kErrUnsupported) {
      RunResult r;
      r.status = RunStatus::kUnsupported;
      r.message = "launcher rejected the case";
      return r;
    }
    if (rc != 0) return failure(static_cast<cudaError_t>(rc), name_ + " launch");
    if ((e = cudaDeviceSynchronize()) != cudaSuccess) return failure(e, name_ + " kernel");
    if ((e = cudaMemcpy(bufs.out.data(), d_out.ptr, bufs.out.size() * 2, cudaMemcpyDeviceToHost)) !=
        cudaSuccess)
      return failure(e, "copy out back");
    if ((e = cudaMemcpy(bufs.lse.data(), d_lse.ptr, bufs.lse.size() * 4, cudaMemcpyDeviceToHost)) !=
        cudaSuccess)
      return failure(e, "copy lse back");
    return collect_outputs(m, bufs);
  }

  std::string name_;
  Precision precision_;
  std::string simt_partner_;
  UnsupportedFn unsupported_;
  LaunchFn launch_;
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
