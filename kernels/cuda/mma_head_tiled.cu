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

int launch_mma_head_tiled_warps(const DecodeParams& p, int block_h, int warps_per_group,
                                void* stream) {
  if (block_h == 32 && warps_per_group == 8)
    return launch_mma_head_tiled_t<32, Mutant::kNone, 8>(p, stream);
  if (block_h == 32 && warps_per_group == 4)
    return launch_mma_head_tiled_t<32, Mutant::kNone, 4>(p, stream);
  if (block_h == 64 && warps_per_group == 4)
    return launch_mma_head_tiled_t<64, Mutant::kNone, 4>(p, stream);
  return kErrUnsupported;
}

}  // namespace mla::cuda
