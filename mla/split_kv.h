// Split-KV for the MMA kernel and its host model: a query row's token tiles (the main
// list's, then the extra list's: one "virtual" tile range) are cut into splits that different
// thread blocks fold through their own online softmax, each writing an fp32 partial (m_i, l_i,
// O_i: running max, row sum and unnormalized output, exactly the state the unsplit kernel holds
// before its epilogue); a combine merges them and applies the sink and the LSE conventions.
//
// The split rule (split_count below) depends only on the row's own tile count (its topk,
// topk_length, extra_topk and extra_topk_length) and on a device constant (the SM count), never
// on the batch size, the head count or another row. A row computed alone is therefore cut at
// the same tile boundaries, folded in the same order and merged in the same order as inside its
// batch: `batch-alone` and `head-alone` stay exact (FlashMLA's scheduler balances splits over
// the whole batch, so a row's bits depend on its neighbours there).
//
// The merge: M = max_i m_i over the splits that hold a valid token (m_i > -inf; the others are
// skipped, which is exact: their weight is 0 and their O_i and l_i are 0), a_i = exp(m_i - M),
// L = sum_i a_i l_i, O = sum_i a_i O_i (products and sums in split order, never fused), then the
// unsplit kernel's epilogue on (M, L, O): out = O * (1 / (L + exp(sink - M))) rounded to bf16,
// lse = softmax_lse({M, L}). With one split a_0 = exp(0) = 1 exactly, so the merge returns the
// unsplit state bit for bit: split count 1 equals the unsplit kernel. Rows whose splits are all
// empty keep M = -inf: out 0 and the convention's LSE, as unsplit. The error this adds to the
// unsplit pipeline (one more rescale per token and 2 roundings per split) is in
// properties/tolerance.h.
#pragma once

#include <cmath>
#include <cstdint>

#include "mla/mla_params.h"
#include "mla/mutants.h"
#include "mla/online_softmax.h"

namespace mla {

// Split settings (a backend's own, or a case's `split_override`): n > 0 forces n splits per row
// (at most the row's tiles and kMaxSplits); kSplitAuto the rule below; kSplitMax one split per
// tile (at most kMaxSplits); kSplitOff the unsplit kernel (one block per row, bf16 epilogue).
inline constexpr int kSplitAuto = 0;
inline constexpr int kSplitMax = -1;
inline constexpr int kSplitOff = -2;
inline constexpr int kMaxSplits = 32;
// Automatic rule: up to sm_count / kAutoSmPerSplit splits per row (8 on a 132-SM H200), never
// more than the row has tiles. A constant to tune on the GPU; whatever it is, it reads the row
// and the device only.
inline constexpr int kAutoSmPerSplit = 16;
// The SM count the host models use for the automatic rule (the H200's).
inline constexpr int kHostModelSmCount = 132;

MLA_HD int split_count(int n_tiles, int setting, int sm_count) {
  if (n_tiles <= 1 || setting == kSplitOff) return 1;
  int ns = setting;
  if (setting == kSplitMax) {
    ns = n_tiles;
  } else if (setting <= 0) {
    ns = sm_count / kAutoSmPerSplit;
  }
  if (ns < 1) ns = 1;
  if (ns > n_tiles) ns = n_tiles;
  if (ns > kMaxSplits) ns = kMaxSplits;
  return ns;
}

// First tile of split i of ns over n_tiles (split i holds [begin(i), begin(i + 1))): balanced,
// every split at least one tile when ns <= n_tiles.
MLA_HD int split_tile_begin(int n_tiles, int ns, int i) {
  return static_cast<int>(static_cast<int64_t>(i) * n_tiles / ns);
}

// Token tiles of one list that the kernel folds: ceil(n_eff / tile), n_eff = min(topk,
// topk_length) (tiles past topk_length hold no valid token). The mutants change it as the
// kernel's: kTopkLengthIgnored keeps topk, kDropPartialTile drops a partial last tile of topk.
template <Mutant M>
MLA_HD int list_tiles(int topk, int topk_len, int tile) {
  int n_eff = topk;
  if constexpr (M != Mutant::kTopkLengthIgnored) {
    if (topk_len >= 0) n_eff = topk_len < topk ? (topk_len > 0 ? topk_len : 0) : topk;
  }
  int n = (n_eff + tile - 1) / tile;
  if constexpr (M == Mutant::kDropPartialTile) {
    if (n > topk / tile) n = topk / tile;
  }
  return n;
}

// fp32 product and sum, correctly rounded and never contracted into an FMA (host and device
// then merge alike; the host build uses -ffp-contract=off).
MLA_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
MLA_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// The partial row sum a split writes: l; kSinkPerSplit adds the sink term exp(sink - m_i) to
// every split that holds a token (the combine then adds none: the sink counts once per split).
template <Mutant M>
MLA_HD float split_partial_l(const SoftmaxState& s, const float* sink, int head) {
  if constexpr (M == Mutant::kSinkPerSplit) {
    return sink != nullptr && s.m != neg_inf() ? softmax_denominator(s, sink, head) : s.l;
  } else {
    (void)sink;
    (void)head;
    return s.l;
  }
}

// The weight a_i of split i in the merge: exp(m_i - M), 0 for a split without a valid token.
// kSplitMergeLog2 takes exp2 of the natural-log maxima (the LSE merged in the wrong base);
// kSplitEmptyNaN drops the empty-split guard (harmless here: exp(-inf) = 0; the NaN comes from
// its 0/0 normalization in the combine loops).
template <Mutant M>
MLA_HD float split_weight(float m_i, float m_max) {
  if constexpr (M != Mutant::kSplitEmptyNaN) {
    if (m_i == neg_inf()) return 0.0f;
  }
  if constexpr (M == Mutant::kSplitMergeLog2) {
#if defined(__CUDA_ARCH__)
    return exp2f(m_i - m_max);
#else
    return std::exp2(m_i - m_max);
#endif
  } else {
    return softmax_exp(m_i - m_max);
  }
}

// The merged state {M, L} of ns partial states (m[i * stride], l[i * stride]).
template <Mutant M>
MLA_HD SoftmaxState merge_split_states(const float* m, const float* l, int ns, int stride) {
  SoftmaxState s;
  for (int i = 0; i < ns; ++i) s.m = m[i * stride] > s.m ? m[i * stride] : s.m;
  if (s.m == neg_inf()) return s;  // every split empty: the row is empty
  bool first = true;
  for (int i = 0; i < ns; ++i) {
    if (m[i * stride] == neg_inf()) continue;
    const float t = mul_rn(split_weight<M>(m[i * stride], s.m), l[i * stride]);
    s.l = first ? t : add_rn(s.l, t);
    first = false;
  }
  return s;
}

}  // namespace mla
