// Online-softmax state shared by both CUDA kernels and both host models (docs/SPEC.md sections 3,
// 4).
//
// Tokens are folded in tiles: the running max m only grows; when it grows, every accumulator
// (the row sum l and the output O) is multiplied by alpha = exp(m_old - m_new) before the tile's
// p = exp(x - m_new) are added. All arithmetic is fp32, as in the kernels.
#pragma once

#include <cmath>

#include "mla_params.h"

namespace mla {

#if defined(__CUDA_ARCH__)
MLA_HD float softmax_exp(float x) { return expf(x); }
MLA_HD float softmax_log(float x) { return logf(x); }
MLA_HD float neg_inf() { return -__int_as_float(0x7f800000); }
MLA_HD float pos_inf() { return __int_as_float(0x7f800000); }
#else
MLA_HD float softmax_exp(float x) { return std::exp(x); }
MLA_HD float softmax_log(float x) { return std::log(x); }
MLA_HD float neg_inf() { return -HUGE_VALF; }
MLA_HD float pos_inf() { return HUGE_VALF; }
#endif

struct SoftmaxState {
  float m = neg_inf();  // running max of the valid logits seen so far (-inf: none yet)
  float l = 0.0f;       // running sum of exp(x - m) over valid logits (unrounded fp32 p)
};

// Moves the running max to cover a new tile whose max valid logit is tile_max (-inf when the
// tile has no valid token). Returns alpha, the factor every accumulator must be multiplied by.
// With no valid token so far, alpha is 0 (nothing accumulated), never exp(-inf - -inf) = NaN.
MLA_HD float softmax_advance(SoftmaxState& s, float tile_max) {
  const float m_new = tile_max > s.m ? tile_max : s.m;
  const float alpha = (s.m == neg_inf()) ? 0.0f : softmax_exp(s.m - m_new);
  s.m = m_new;
  s.l *= alpha;
  return alpha;
}

// Weight of a valid logit x after softmax_advance (x <= s.m).
MLA_HD float softmax_weight(const SoftmaxState& s, float x) { return softmax_exp(x - s.m); }

// Denominator of the output: l plus the sink term exp(sink - m). A +inf sink gives +inf (so
// out = 0); a -inf sink adds nothing. Only meaningful when the row has a valid token.
MLA_HD float softmax_denominator(const SoftmaxState& s, const float* sink, int head) {
  if (sink == nullptr) return s.l;
  return s.l + softmax_exp(sink[head] - s.m);
}

// Natural-log LSE of the row. Empty row (no valid token): the convention's value, sink or not
// (FlashMLA: +inf; SGLang/vLLM: -inf). sink_in_lse folds exp(sink) into the sum (SGLang Triton).
MLA_HD float softmax_lse(const SoftmaxState& s, const float* sink, int head, const Conventions& c) {
  if (s.m == neg_inf()) return c.empty_lse == EmptyRowLse::kPosInf ? pos_inf() : neg_inf();
  if (!c.sink_in_lse || sink == nullptr || sink[head] <= s.m) {
    const float sum = c.sink_in_lse ? softmax_denominator(s, sink, head) : s.l;
    return s.m + softmax_log(sum);
  }
  // A sink above the running max: shift by the sink instead, so exp(sink - m) cannot overflow
  // fp32 (a sink 89 above every logit gave lse = +inf; found by `mlafuzz fuzz --seed 5150`,
  // corpus/regression/sink-in-lse-overflow.json). A +inf sink still gives +inf.
  const float sk = sink[head];
  return sk + softmax_log(s.l * softmax_exp(s.m - sk) + 1.0f);
}

// True when the row had at least one valid token (out = O / denominator), false: out = 0.
MLA_HD bool softmax_has_tokens(const SoftmaxState& s) { return s.m != neg_inf(); }

}  // namespace mla
