// Mutant instantiations of the MMA kernel (BLOCK_H 32), one per entry of mutants.h.
#include <array>
#include <utility>

#include "core/envelope.h"
#include "kernels/cuda/combine.cuh"
#include "kernels/cuda/cuda_mutants.h"
#include "kernels/cuda/device_run.h"
#include "kernels/cuda/mma_head_tiled.cuh"
#include "mla/split_kv.h"

namespace mla::cuda {
namespace {

using MutantLaunch = int (*)(const DecodeParams&, void*);

template <size_t... I>
constexpr std::array<MutantLaunch, sizeof...(I)> mutant_table(std::index_sequence<I...>) {
  return {&launch_mma_head_tiled_t<32, static_cast<Mutant>(I)>...};
}

constexpr auto kMutantLaunches =
    mutant_table(std::make_index_sequence<static_cast<size_t>(Mutant::kCount)>());

using SplitMutantLaunch = int (*)(const DecodeParams&, int, void*, size_t, void*);

// The combine's mutants (the split pipeline; the others never run it).
template <Mutant M>
constexpr SplitMutantLaunch split_launch() {
  return &launch_mma_split_t<32, M>;
}

}  // namespace

int launch_mma_split_mutant(const DecodeParams& p, Mutant m, int split, void* workspace,
                            size_t workspace_bytes, void* stream) {
  SplitMutantLaunch f = nullptr;
  switch (m) {
    case Mutant::kSplitEmptyNaN:
      f = split_launch<Mutant::kSplitEmptyNaN>();
      break;
    case Mutant::kSinkPerSplit:
      f = split_launch<Mutant::kSinkPerSplit>();
      break;
    case Mutant::kSplitMergeLog2:
      f = split_launch<Mutant::kSplitMergeLog2>();
      break;
    default:
      return kErrUnsupported;
  }
  return f(p, split, workspace, workspace_bytes, stream);
}

int launch_mma_head_tiled_mutant(const DecodeParams& p, Mutant m, void* stream) {
  const auto i = static_cast<size_t>(m);
  if (i >= kMutantLaunches.size()) return kErrUnsupported;
  return kMutantLaunches[i](p, stream);
}

}  // namespace mla::cuda

namespace mlafuzz {
namespace {

// The kernels' envelope without the extra cache (the mutants' kernel has one cache).
Envelope mutant_envelope() {
  Envelope e = cuda_kernel_envelope();
  e.refuses |= kFeatureExtraCache | kFeatureExtraTopkLength;
  return e;
}

}  // namespace

std::unique_ptr<Backend> make_cuda_mma_mutant_backend(mla::Mutant m) {
  if (mla::is_combine_mutant(m)) {
    // The combine's mutants run the split pipeline with one split per tile (as cpu-mma's).
    cuda_detail::SplitLaunch sl;
    sl.setting = mla::kSplitMax;
    sl.workspace_bytes = [](const mla::DecodeParams& p, int s) {
      return mla::cuda::mma_split_workspace_bytes(p, 32, s);
    };
    sl.launch = [m](const mla::DecodeParams& p, int s, void* ws, size_t bytes) {
      return mla::cuda::launch_mma_split_mutant(p, m, s, ws, bytes, nullptr);
    };
    return cuda_detail::make_split_kernel_backend(
        std::string("cuda-mma~") + mla::mutant_name(m), Precision::kMmaBf16, "cuda-simt",
        [](const mla::DecodeParams& p) -> std::optional<std::string> {
          if (p.has_extra) return "the MMA mutants do not cover the extra cache";
          return mla::cuda::mma_unsupported(p, 32);
        },
        std::move(sl), /*resident=*/false, mutant_envelope());
  }
  return cuda_detail::make_kernel_backend(
      std::string("cuda-mma~") + mla::mutant_name(m), Precision::kMmaBf16, "cuda-simt",
      [m](const mla::DecodeParams& p) -> std::optional<std::string> {
        // The planted bugs are about one cache: the extra-cache kernel is not instantiated for
        // them (launch_mma_head_tiled_t refuses it).
        if (p.has_extra && m != mla::Mutant::kNone) {
          return "the MMA mutants do not cover the extra cache";
        }
        return mla::cuda::mma_unsupported(p, 32);
      },
      [m](const mla::DecodeParams& p) {
        return mla::cuda::launch_mma_head_tiled_mutant(p, m, nullptr);
      },
      m == mla::Mutant::kNone ? cuda_kernel_envelope() : mutant_envelope());
}

}  // namespace mlafuzz
