// Shared plumbing of the CUDA backends (kernels/cuda only; plain C++, no CUDA types).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/backend.h"

namespace mlafuzz::cuda_detail {

// Launches a kernel on device-pointer params; returns 0 or a cudaError_t value
// (mla::cuda::kErrUnsupported for cases outside the envelope).
using LaunchFn = std::function<int(const mla::DecodeParams&)>;
using UnsupportedFn = std::function<std::optional<std::string>(const mla::DecodeParams&)>;

// A split-KV launcher: the workspace size a split setting needs, and the launch with
// the setting (the backend's own, or the case's split_override) and a device workspace the
// backend keeps between calls (mla::cuda::launch_mma_split).
struct SplitLaunch {
  int setting = -2;  // mla::kSplitOff: the backend does not split
  std::function<size_t(const mla::DecodeParams&, int)> workspace_bytes;
  std::function<int(const mla::DecodeParams&, int, void*, size_t)> launch;
};

// Whether a CUDA device exists (reason otherwise), probed once per process.
Availability device_availability();

// A Backend that runs `launch` on device copies of a case's buffers; `simt_partner` names the
// backend mma-vs-simt compares it with ("" for none).
// `envelope`: what the backend declares (cuda_kernel_envelope() for the normal kernels).
std::unique_ptr<Backend> make_kernel_backend(std::string name, Precision precision,
                                             std::string simt_partner, UnsupportedFn unsupported,
                                             LaunchFn launch,
                                             Envelope envelope = cuda_kernel_envelope());
// The same for a split-KV launcher.
std::unique_ptr<Backend> make_split_kernel_backend(std::string name, Precision precision,
                                                   std::string simt_partner,
                                                   UnsupportedFn unsupported, SplitLaunch split,
                                                   bool resident,
                                                   Envelope envelope = cuda_kernel_envelope());

}  // namespace mlafuzz::cuda_detail
