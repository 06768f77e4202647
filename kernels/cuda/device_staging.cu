// Host <-> device staging for one decode call (see device_staging.h).
#include <cuda_runtime.h>

#include <chrono>
#include <string>
#include <vector>

#include "kernels/cuda/device_staging.h"

namespace mlafuzz::cuda {
namespace {

// Errors after which the context is unusable (the process must restart): device faults.
bool is_sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
      return true;
    default:
      return false;
  }
}

struct CudaFailure {
  cudaError_t code;
  std::string what;
};

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CudaFailure{e, what};
}

// One device allocation, freed on scope exit (errors while freeing are ignored: the call has
// already reported the first error).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    if (bytes > 0) check(cudaMalloc(&ptr_, bytes), "cudaMalloc");
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_) { o.ptr_ = nullptr; }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

template <typename T>
size_t bytes_of(const std::vector<T>& v) {
  return v.size() * sizeof(T);
}

// Allocates a device copy of `v` (null when v is empty) and uploads it on `stream`.
template <typename T>
DeviceBuffer upload(const std::vector<T>& v, cudaStream_t stream) {
  DeviceBuffer d(bytes_of(v));
  if (!v.empty()) {
    check(cudaMemcpyAsync(d.as<void>(), v.data(), bytes_of(v), cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync (upload)");
  }
  return d;
}

class Stream {
 public:
  Stream() { check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~Stream() {
    if (s_ != nullptr) cudaStreamDestroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

RunResult failure(RunStatus status, std::string message) {
  RunResult r;
  r.status = status;
  r.message = std::move(message);
  return r;
}

}  // namespace

Availability device_availability() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess)
    return {false, std::string("no usable CUDA device: ") + cudaGetErrorString(e)};
  if (count == 0) return {false, "no CUDA device found"};
  return {};
}

int current_device() {
  int d = -1;
  return cudaGetDevice(&d) == cudaSuccess ? d : -1;
}

RunResult run_staged(const MaterializedCase& m, const DeviceLaunch& launch) {
  try {
    Stream stream;
    OutputBuffers host_out(m);  // canaries everywhere; the device buffers start as a copy
    const DeviceBuffer q = upload(m.q, stream.get());
    const DeviceBuffer cache = upload(m.cache, stream.get());
    const DeviceBuffer indices = upload(m.indices, stream.get());
    const DeviceBuffer topk_length = upload(m.topk_length, stream.get());
    const DeviceBuffer sink = upload(m.sink, stream.get());
    const DeviceBuffer out = upload(host_out.out, stream.get());
    const DeviceBuffer lse = upload(host_out.lse, stream.get());

    mla::DecodeParams p = m.host_params();
    p.q = q.as<const uint16_t>();
    p.kv_cache = cache.as<const uint8_t>();
    p.indices = indices.as<const int32_t>();
    p.topk_length = m.topk_length.empty() ? nullptr : topk_length.as<const int32_t>();
    p.sink = m.sink.empty() ? nullptr : sink.as<const float>();
    p.out = out.as<uint16_t>() + OutputBuffers::kGuard;
    p.out_head_stride = host_out.out_head_stride;
    p.out_batch_stride = host_out.out_batch_stride;
    p.lse = lse.as<float>() + OutputBuffers::kGuard;
    check(cudaStreamSynchronize(stream.get()), "upload");

    const auto t0 = std::chrono::steady_clock::now();
    const std::string err = launch(p, stream.get());
    const cudaError_t launch_error = cudaGetLastError();
    const cudaError_t sync_error = cudaStreamSynchronize(stream.get());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (is_sticky(sync_error) || is_sticky(launch_error)) {
      const cudaError_t e = is_sticky(sync_error) ? sync_error : launch_error;
      return failure(RunStatus::kFault, std::string("device fault: ") + cudaGetErrorName(e) + " (" +
                                            cudaGetErrorString(e) + ")");
    }
    if (!err.empty()) return failure(RunStatus::kError, err);
    check(launch_error, "kernel launch");
    check(sync_error, "cudaStreamSynchronize after the launch");

    check(cudaMemcpy(host_out.out.data(), out.as<void>(), bytes_of(host_out.out),
                     cudaMemcpyDeviceToHost),
          "cudaMemcpy (download out)");
    check(cudaMemcpy(host_out.lse.data(), lse.as<void>(), bytes_of(host_out.lse),
                     cudaMemcpyDeviceToHost),
          "cudaMemcpy (download lse)");
    RunResult r = collect_outputs(m, host_out);
    r.seconds = seconds;
    return r;
  } catch (const CudaFailure& f) {
    return failure(
        is_sticky(f.code) ? RunStatus::kFault : RunStatus::kError,
        f.what + ": " + cudaGetErrorName(f.code) + " (" + cudaGetErrorString(f.code) + ")");
  }
}

}  // namespace mlafuzz::cuda
