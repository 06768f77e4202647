// cpu-mma factory: the kNone instantiation of the head-tiled host model (cpu_mma.h).
#include "kernels/host/cpu_mma.h"

#include <stdexcept>

#include "kernels/host/host_models.h"

namespace mlafuzz {

std::unique_ptr<Backend> make_cpu_mma_backend(int block_h) {
  return std::make_unique<host::CpuMmaBackend<mla::Mutant::kNone>>(block_h);
}

std::unique_ptr<Backend> make_cpu_mma_small_backend() {
  return std::make_unique<host::CpuMmaBackend<mla::Mutant::kNone>>(
      mla::kMmaSmallBlockH, /*lse_merged=*/false, mla::kSplitOff, mla::kMmaSmallTokenTile);
}

std::unique_ptr<Backend> make_cpu_mma_lse_merged_backend() {
  return std::make_unique<host::CpuMmaBackend<mla::Mutant::kNone>>(mla::kMmaDefaultBlockH,
                                                                   /*lse_merged=*/true);
}

std::unique_ptr<Backend> make_cpu_mma_split_backend(int split) {
  if (split < mla::kSplitMax) {
    throw std::invalid_argument("split count " + std::to_string(split) +
                                ": give n >= 1, 0 (automatic) or -1 (one split per tile)");
  }
  return std::make_unique<host::CpuMmaBackend<mla::Mutant::kNone>>(mla::kMmaDefaultBlockH,
                                                                   /*lse_merged=*/false, split);
}

}  // namespace mlafuzz
