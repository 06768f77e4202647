// Host <-> device staging for one decode call: the CUDA side of every device backend that is not
// a built-in kernel (device plugins), in a plain C++ header so that host code calls it without
// including CUDA headers.
//
// run_staged uploads a MaterializedCase's inputs into fresh device buffers, fills device output
// buffers with the same canary layout as OutputBuffers (guard bands before, after and between
// heads), lets the caller launch on a stream, synchronizes, downloads the guarded buffers and
// converts them with collect_outputs(). Nothing is reused between calls, so stale memory cannot
// fake a pass.
#pragma once

#include <functional>
#include <string>

#include "harness/backend.h"

namespace mlafuzz::cuda {

// Whether a CUDA device can be used by this process, and why not (no device, driver too old).
Availability device_availability();

// The CUDA device this thread uses (cudaGetDevice), or -1 when none can be queried.
int current_device();

// Launches on `stream` (a cudaStream_t) with params holding DEVICE pointers; returns "" on
// success or an error message (it must not synchronize or exit; it may).
using DeviceLaunch =
    std::function<std::string(const mla::DecodeParams& device_params, void* stream)>;

// Runs one staged call. The result's status: kOk; kError when `launch` reports an error or a
// CUDA API call fails (the message names it); kFault when the device faulted (a sticky error
// such as an illegal address: the CUDA context is unusable afterwards, the caller's process
// should be restarted). Never throws for CUDA errors.
RunResult run_staged(const MaterializedCase& m, const DeviceLaunch& launch);

}  // namespace mlafuzz::cuda
