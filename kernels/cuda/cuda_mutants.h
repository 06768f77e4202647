// Planted-bug variants of the MMA kernel for mutation testing (target mlafuzz_cuda_mutants, built
// only with MLAFUZZ_MUTANTS=ON). Plain C++ header.
#pragma once

#include <cstddef>
#include <memory>

#include "core/backend.h"
#include "mla/mutants.h"

namespace mla::cuda {
// Launches the BLOCK_H = 32 MMA kernel instantiated with mutant m (kNone gives the normal
// kernel). Returns 0 or a cudaError_t value; kErrUnsupported outside the envelope.
int launch_mma_head_tiled_mutant(const DecodeParams& p, Mutant m, void* stream);
// The split-KV kernel and combine with one of the combine's mutants (mla::is_combine_mutant);
// kErrUnsupported for any other mutant.
int launch_mma_split_mutant(const DecodeParams& p, Mutant m, int split, void* workspace,
                            size_t workspace_bytes, void* stream);
}  // namespace mla::cuda

namespace mlafuzz {
// Backend "cuda-mma~<mutant name>" (the campaign's lookup name) running
// launch_mma_head_tiled_mutant (Precision kMmaBf16).
std::unique_ptr<Backend> make_cuda_mma_mutant_backend(mla::Mutant m);
}  // namespace mlafuzz
