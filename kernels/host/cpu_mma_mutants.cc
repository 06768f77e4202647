// Planted-bug instantiations of the cpu-mma host model (mutation testing only; built when
// MLAFUZZ_MUTANTS is ON). Each mutant's mechanics are documented at its `if constexpr`.
#include "kernels/host/cpu_mma.h"
#include "kernels/host/host_mutants.h"

namespace mlafuzz {
namespace {

// The combine's mutants live in the split pipeline: they run it with one split per tile.
template <mla::Mutant M>
std::unique_ptr<Backend> make() {
  return std::make_unique<host::CpuMmaBackend<M>>(
      mla::kMmaDefaultBlockH, /*lse_merged=*/false,
      mla::is_combine_mutant(M) ? mla::kSplitMax : mla::kSplitOff);
}

}  // namespace

bool host_mutant_supported(mla::Mutant m) {
  return m != mla::Mutant::kNone && m != mla::Mutant::kMissingBarrier && m != mla::Mutant::kCount &&
         static_cast<int32_t>(m) > 0 &&
         static_cast<int32_t>(m) < static_cast<int32_t>(mla::Mutant::kCount);
}

std::unique_ptr<Backend> make_cpu_mma_mutant_backend(mla::Mutant m) {
  using mla::Mutant;
  switch (m) {
    case Mutant::kUnmaskedPadColumns:
      return make<Mutant::kUnmaskedPadColumns>();
    case Mutant::kWrongScaleGroup:
      return make<Mutant::kWrongScaleGroup>();
    case Mutant::kPageStrideIgnored:
      return make<Mutant::kPageStrideIgnored>();
    case Mutant::kPageSizePow2:
      return make<Mutant::kPageSizePow2>();
    case Mutant::kInvalidIndexUnmasked:
      return make<Mutant::kInvalidIndexUnmasked>();
    case Mutant::kTopkLengthIgnored:
      return make<Mutant::kTopkLengthIgnored>();
    case Mutant::kNoRescale:
      return make<Mutant::kNoRescale>();
    case Mutant::kRowSumBf16:
      return make<Mutant::kRowSumBf16>();
    case Mutant::kLseLog2:
      return make<Mutant::kLseLog2>();
    case Mutant::kSinkInLse:
      return make<Mutant::kSinkInLse>();
    case Mutant::kSinkIgnored:
      return make<Mutant::kSinkIgnored>();
    case Mutant::kEmptyRowNaN:
      return make<Mutant::kEmptyRowNaN>();
    case Mutant::kDropPartialTile:
      return make<Mutant::kDropPartialTile>();
    case Mutant::kStorePaddedColumns:
      return make<Mutant::kStorePaddedColumns>();
    case Mutant::kSplitEmptyNaN:
      return make<Mutant::kSplitEmptyNaN>();
    case Mutant::kSinkPerSplit:
      return make<Mutant::kSinkPerSplit>();
    case Mutant::kSplitMergeLog2:
      return make<Mutant::kSplitMergeLog2>();
    case Mutant::kNone:
    case Mutant::kMissingBarrier:
    case Mutant::kCount:
      break;
  }
  return nullptr;
}

}  // namespace mlafuzz
