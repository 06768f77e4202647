// The normal (Mutant::kNone) instantiations of the head-tiled MMA kernel and its launcher.
#include "kernels/cuda/mma_head_tiled.cuh"

namespace mla::cuda {

std::optional<std::string> mma_unsupported(const DecodeParams& p, int block_h) {
  // cuda-mma on a device whose shared memory the default tiles do not fit: the small
  // configuration's checks (launch_mma_head_tiled runs it).
  if (block_h == kMmaDefaultBlockH && mma_small_selected()) return mma_small_unsupported(p);
  return mma_unsupported_impl(p, block_h);
}

std::optional<std::string> mma_small_unsupported(const DecodeParams& p) {
  return mma_unsupported_impl(p, kMmaSmallBlockH, kMmaSmallSmemBytes);
}

int mma_token_tile(int block_h) {
  return block_h == kMmaDefaultBlockH && mma_small_selected() ? kMmaSmallTile : kMmaTokenTile;
}

int launch_mma_head_tiled(const DecodeParams& p, int block_h, void* stream) {
  if (block_h == 32) {
    if (mma_small_selected()) return launch_mma_small_t<Mutant::kNone>(p, stream);
    return launch_mma_head_tiled_t<32, Mutant::kNone>(p, stream);
  }
  if (block_h == 64) return launch_mma_head_tiled_t<64, Mutant::kNone>(p, stream);
  return kErrUnsupported;
}

int launch_mma_head_tiled_small(const DecodeParams& p, void* stream) {
  return launch_mma_small_t<Mutant::kNone>(p, stream);
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
