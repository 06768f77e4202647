// Catalogue of planted bugs for mutation testing (`mlafuzz mutants`).
//
// Kernels and host models take the mutant as a template parameter and test it with
// `if constexpr`, so the normal build instantiates only Mutant::kNone: no mutant code is compiled
// into a normal code path. The mutant instantiations live in separate targets built only for
// mutation testing (CMake option MLAFUZZ_MUTANTS).
#pragma once

#include <cstdint>

namespace mla {

enum class Mutant : int32_t {
  kNone = 0,
  kUnmaskedPadColumns,    // nope padded to a power of two, padded columns (448..511) not masked
  kWrongScaleGroup,       // the last nope tile (beside the padding) uses the previous tile's scale
  kPageStrideIgnored,     // page base computed with the minimum stride P*token_bytes, not S0
  kPageSizePow2,          // page = idx / next_pow2(P): wrong for page sizes like 61
  kInvalidIndexUnmasked,  // -1 entries clamped to slot 0 but not masked
  kTopkLengthIgnored,     // topk_length not applied
  kNoRescale,             // online softmax forgets to rescale O and l when the max grows
  kRowSumBf16,            // row sum l taken over bf16-rounded p instead of fp32 p
  kLseLog2,               // LSE returned in log2 units
  kSinkInLse,             // sink folded into the LSE although the convention excludes it
  kSinkIgnored,           // sink term left out of the denominator
  kEmptyRowNaN,           // empty row computes 0/0 = NaN instead of out = 0
  kDropPartialTile,       // the partial last token tile is skipped
  kMissingBarrier,        // the __syncthreads before a tile refills Ks removed (GPU only: race)
  kStorePaddedColumns,    // padded output columns stored past d_v (clobbers the guard / next row)
  // Split-KV combine (mla/split_kv.h). Only the split pipeline has them:
  // their backends run it with one split per tile.
  kSplitEmptyNaN,   // the combine normalizes each split by its own l: 0/0 for an empty split
  kSinkPerSplit,    // every split adds the sink to its partial l (counted once per split)
  kSplitMergeLog2,  // the merge weights exp2(m_i - M) of natural-log maxima (wrong base)
  kCount
};

inline const char* mutant_name(Mutant m) {
  switch (m) {
    case Mutant::kNone:
      return "none";
    case Mutant::kUnmaskedPadColumns:
      return "unmasked-pad-columns";
    case Mutant::kWrongScaleGroup:
      return "wrong-scale-group";
    case Mutant::kPageStrideIgnored:
      return "page-stride-ignored";
    case Mutant::kPageSizePow2:
      return "page-size-pow2";
    case Mutant::kInvalidIndexUnmasked:
      return "invalid-index-unmasked";
    case Mutant::kTopkLengthIgnored:
      return "topk-length-ignored";
    case Mutant::kNoRescale:
      return "no-rescale";
    case Mutant::kRowSumBf16:
      return "row-sum-bf16";
    case Mutant::kLseLog2:
      return "lse-log2";
    case Mutant::kSinkInLse:
      return "sink-in-lse";
    case Mutant::kSinkIgnored:
      return "sink-ignored";
    case Mutant::kEmptyRowNaN:
      return "empty-row-nan";
    case Mutant::kDropPartialTile:
      return "drop-partial-tile";
    case Mutant::kMissingBarrier:
      return "missing-barrier";
    case Mutant::kStorePaddedColumns:
      return "store-padded-columns";
    case Mutant::kSplitEmptyNaN:
      return "split-empty-nan";
    case Mutant::kSinkPerSplit:
      return "sink-per-split";
    case Mutant::kSplitMergeLog2:
      return "split-merge-log2";
    case Mutant::kCount:
      break;
  }
  return "?";
}

// The combine's planted bugs: they live in the split pipeline only (the unsplit kernel has no
// combine), so their backends run it with one split per tile (mla::kSplitMax).
inline bool is_combine_mutant(Mutant m) {
  return m == Mutant::kSplitEmptyNaN || m == Mutant::kSinkPerSplit || m == Mutant::kSplitMergeLog2;
}

}  // namespace mla
