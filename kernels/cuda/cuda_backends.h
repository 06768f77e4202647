// Backends of the two CUDA kernels (plain C++ header: the registry includes it without CUDA).
//
// "cuda-simt" (SIMT per-head kernel), "cuda-mma" (head-tiled MMA kernel, BLOCK_H 32) and
// "cuda-mma-h64" (BLOCK_H 64). Each run() allocates device buffers, copies the inputs and the
// canary-filled output buffers (so guard bands are checked), launches, synchronizes and copies
// back. Errors become RunStatus::kError; sticky device faults (illegal address, trap) become
// RunStatus::kFault: the CUDA context is then poisoned and the process must not launch again.
#pragma once

#include <memory>

#include "harness/core/backend.h"

namespace mlafuzz {

std::unique_ptr<Backend> make_cuda_simt_backend();
// block_h: 32 ("cuda-mma") or 64 ("cuda-mma-h64").
std::unique_ptr<Backend> make_cuda_mma_backend(int block_h);

}  // namespace mlafuzz
