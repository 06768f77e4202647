// Envelope constraints of the generator (see gen_envelope.h).
#include "properties/gen_envelope.h"

#include <numeric>
#include <stdexcept>
#include <string>

namespace mlafuzz::genv {
namespace {

constexpr int32_t kMaxNope = 512;  // the generator's widest nope (and the kernels')

int32_t tile_of(mla::Layout l) { return l == mla::Layout::kModel1 ? 64 : 128; }

IntSet nope_set(const Envelope& e, mla::Layout l) {
  IntSet s = e.nope_dim;
  const int32_t t = tile_of(l);
  s.multiple_of = s.multiple_of > 1 ? std::lcm(s.multiple_of, t) : t;
  return s;
}

[[noreturn]] void none(const char* what, const IntSet& s, int64_t lo, int64_t hi) {
  throw std::invalid_argument(std::string("envelope: ") + what + " admits no value in [" +
                              std::to_string(lo) + ", " + std::to_string(hi) + "] (" +
                              s.describe() + ")");
}

}  // namespace

std::vector<int> layouts(const Envelope& e, bool model1, bool v32) {
  std::vector<int> out;
  for (const int l : {0, 1}) {
    if ((l == 0 && !model1) || (l == 1 && !v32)) continue;
    const auto layout = static_cast<mla::Layout>(l);
    if (!e.allows(layout) || !e.scale_tile.contains(tile_of(layout))) continue;
    if (l == 1 && (e.v32_scales & kBothValues) == 0) continue;  // no V32 scale convention
    if (!nope_set(e, layout).nearest(tile_of(layout), tile_of(layout), kMaxNope)) continue;
    out.push_back(l);
  }
  if (out.empty()) {
    throw std::invalid_argument(
        "envelope: no layout left (the configuration's layouts, with the scale tile 64 for model1 "
        "and 128 for v32 and a nope dim <= 512)");
  }
  return out;
}

int32_t nope_dim(const Envelope& e, mla::Layout layout, int32_t drawn) {
  const IntSet s = nope_set(e, layout);
  const auto v = s.nearest(drawn, tile_of(layout), kMaxNope);
  if (!v) none("nope_dim", s, tile_of(layout), kMaxNope);
  return *v;
}

int32_t rope_dim(const Envelope& e, int32_t drawn) {
  const auto v = e.rope_dim.nearest(drawn, 0, 64);
  if (!v) none("rope_dim", e.rope_dim, 0, 64);
  return *v;
}

int32_t dim(const IntSet& s, int32_t drawn, int32_t hi, const char* what) {
  const auto v = s.nearest(drawn, 1, std::max(1, hi));
  if (!v) none(what, s, 1, std::max(1, hi));
  return *v;
}

int64_t page_stride(const Envelope& e, const mla::CacheGeometry& g, int64_t drawn) {
  if (e.page_stride_multiple <= 1) return drawn;
  const int64_t mins = mla::min_page_stride(g);
  const int64_t s = e.stride_at_least(drawn == 0 ? mins : drawn);
  return s == mins ? 0 : s;
}

mla::InvalidIndexRule invalid_index(const Envelope& e, mla::InvalidIndexRule drawn) {
  using R = mla::InvalidIndexRule;
  if (e.allows(drawn)) return drawn;
  // The other sign rule first, then the remaining one.
  const R order[2] = {drawn == R::kMinusOneOnly ? R::kAnyNegative : R::kMinusOneOnly,
                      drawn == R::kOutOfRange ? R::kAnyNegative : R::kOutOfRange};
  for (const R r : order) {
    if (e.allows(r)) return r;
  }
  return order[0];  // empty_reason has rejected an envelope without any rule
}

ScaleConvention v32_scales(const Envelope& e, ScaleConvention drawn) {
  if (e.allows(drawn)) return drawn;
  return drawn == ScaleConvention::kFp32 ? ScaleConvention::kPowerOfTwo : ScaleConvention::kFp32;
}

void conventions(const Envelope& e, mla::Conventions& c) {
  c.invalid_index = invalid_index(e, c.invalid_index);
  if (!e.allows(c.empty_lse)) {
    c.empty_lse = c.empty_lse == mla::EmptyRowLse::kPosInf ? mla::EmptyRowLse::kNegInf
                                                           : mla::EmptyRowLse::kPosInf;
  }
  if (!e.allows_sink_in_lse(c.sink_in_lse)) c.sink_in_lse = !c.sink_in_lse;
}

int sink_kind(const Envelope& e, int drawn) {
  if (e.refuses_feature(kFeatureSink)) return 0;
  if (drawn == 2 && e.refuses_feature(kFeatureInfiniteSink)) return 1;
  return drawn;
}

bool topk_length(const Envelope& e) { return !e.refuses_feature(kFeatureTopkLength); }

void head_padding(const Envelope& e, Case& c) {
  if (e.refuses_feature(kFeatureQHeadPad)) c.q_head_pad = 0;
  if (e.refuses_feature(kFeatureOutHeadPad)) c.out_head_pad = 0;
}

void row_padding(const Envelope& e, Case& c) {
  if (!e.refuses_feature(kFeatureRowPad)) return;
  c.q_batch_pad = c.out_batch_pad = c.indices_row_pad = c.lse_row_pad = 0;
}

}  // namespace mlafuzz::genv
