// The normal (Mutant::kNone) instantiations of the head-tiled MMA kernel and its launcher.
#include "kernels/cuda/mma_head_tiled.cuh"

namespace mla::cuda {

std::optional<std::string> mma_unsupported(const DecodeParams& p, int block_h) {
  return mma_unsupported_impl(p, block_h);
}

int launch_mma_head_tiled(const DecodeParams& p, int block_h, void* stream) {
  if (block_h == 32) return launch_mma_head_tiled_t<32, Mutant::kNone>(p, stream);
  if (block_h == 64) return launch_mma_head_tiled_t<64, Mutant::kNone>(p, stream);
  return kErrUnsupported;
}

}  // namespace mla::cuda
