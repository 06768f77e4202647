// Backends of the two CUDA kernels (plain C++ header: the registry includes it without CUDA).
//
// "cuda-simt" (SIMT per-head kernel), "cuda-mma" (head-tiled MMA kernel, BLOCK_H 32),
// "cuda-mma-h64" (BLOCK_H 64) and the split-KV "cuda-mma-split*". Each run() allocates device
// buffers, copies the inputs and the canary-filled output buffers (so guard bands are checked),
// launches, synchronizes and copies back. Errors become RunStatus::kError; sticky device faults
// (illegal address, trap) become RunStatus::kFault: the CUDA context is then poisoned and the
// process must not launch again.
#pragma once

#include <memory>

#include "core/backend.h"

namespace mlafuzz {

std::unique_ptr<Backend> make_cuda_simt_backend();
// block_h: 32 ("cuda-mma") or 64 ("cuda-mma-h64"). "cuda-mma" runs the small configuration on a
// device whose shared memory the default does not fit (sm_120); its token_tile() then says 32.
std::unique_ptr<Backend> make_cuda_mma_backend(int block_h);
// "cuda-mma-small": the sm_120-sized configuration (32-token tiles, BLOCK_H 32, 97.25 KiB of
// shared memory; kernels/cuda/mma_head_tiled.cuh) on any device, so that the H200 fuzzes and
// measures it. Host model cpu-mma-small.
std::unique_ptr<Backend> make_cuda_mma_small_backend();
// The split-KV MMA kernel and its combine, BLOCK_H 32, until it has passed on the
// GPU a backend apart from cuda-mma: split 1 -> "cuda-mma-split1", 0 -> "cuda-mma-split" (the
// automatic rule), -1 -> "cuda-mma-split-max" (one split per tile), n > 1 ->
// "cuda-mma-split<n>". Throws std::invalid_argument below -1.
std::unique_ptr<Backend> make_cuda_mma_split_backend(int split);

}  // namespace mlafuzz
