// The normal (Mutant::kNone) instantiations of the split-KV MMA kernel, its combine and their
// launcher (combine.cuh).
#include <cstddef>

#include "kernels/cuda/combine.cuh"

namespace mla::cuda {

size_t mma_split_workspace_bytes(const DecodeParams& p, int block_h, int split) {
  return split_workspace_bytes_impl(p, block_h, split);
}

int launch_mma_split(const DecodeParams& p, int block_h, int split, void* workspace,
                     size_t workspace_bytes, void* stream) {
  if (block_h == 32) {
    return launch_mma_split_t<32, Mutant::kNone>(p, split, workspace, workspace_bytes, stream);
  }
  if (block_h == 64) {
    return launch_mma_split_t<64, Mutant::kNone>(p, split, workspace, workspace_bytes, stream);
  }
  return kErrUnsupported;
}

}  // namespace mla::cuda
