// The canonical walk and cause sets (see canonical.h).
#include "properties/canonical.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "core/materialize.h"
#include "mla/tiling.h"
#include "oracle/oracle.h"
#include "properties/case_edits.h"

namespace mlafuzz {
namespace {

using namespace edits;

constexpr int32_t kCanonicalNope = 512;
constexpr int32_t kCanonicalRope = 64;
// The production nope of each layout that is not a power of two: where a failure that needs
// padded columns goes.
constexpr int32_t kPaddedNopeModel1 = 448;
constexpr int32_t kPaddedNopeV32 = 384;
// Page sizes from canonical to not: 64, then one that is not a power of two (FlashMLA's test
// 61), one token per page, two.
constexpr int32_t kPageSizes[] = {64, 61, 1, 2};
constexpr int kRanks = 4;  // the rank of a value on none of a feature's canonical rungs
// Cap on the per-entry moves of one step (the canonical case has a handful of entries).
constexpr int kMaxEntryMoves = 16;
// Valid entries of a row above which the walk first tries removing half of them at once.
constexpr int kManyValidEntries = 8;
// The canonical draws of the values (data_seed), from canonical to not.
constexpr uint64_t kRerolls[] = {0, 1, 2, 3, 4, 5};

const ValueSpec kSmallInt{ValueDist::kSmallInt, 1.0, 0.0};
// Small integers of 1/16: logits close together (softmax weights near each other, where the
// rounding of one weight shows most).
const ValueSpec kSmallIntSixteenth{ValueDist::kSmallInt, 1.0 / 16, 0.0};
const ValueSpec kNormal{ValueDist::kNormal, 1.0, 0.0};
// Random tile exponents around scale 1: tiles differ (two tiles of one token draw the same
// exponent now and then: three ranges, tried in turn), nothing saturates.
const ScaleSpec kCanonicalRandomScales[] = {
    {ScaleMode::kRandom, 124, 130}, {ScaleMode::kRandom, 120, 134}, {ScaleMode::kRandom, 110, 144}};

bool same_spec(const ValueSpec& a, const ValueSpec& b) {
  return a.dist == b.dist && a.magnitude == b.magnitude && a.special_fraction == b.special_fraction;
}

bool same_scales(const ScaleSpec& a, const ScaleSpec& b) {
  if (a.mode != b.mode || a.convention != b.convention || a.mantissa != b.mantissa) return false;
  if (a.mode == ScaleMode::kWriter) return true;
  return a.exp_lo == b.exp_lo && (a.mode == ScaleMode::kFixed || a.exp_hi == b.exp_hi);
}

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// Whether main-cache index v names one of its slots (out_of_range's invalid entries past the
// cache do not).
bool in_cache(const Case& c, int32_t v) { return v >= 0 && v < mla::num_slots(c.geom); }

int32_t round_up_to(int32_t v, int32_t m) { return (v + m - 1) / m * m; }

// Candidates for the rungs of a feature's ladder more canonical than the current one.
template <typename Make>
std::vector<Case> rungs_below(int current_rank, int rungs, Make make) {
  std::vector<Case> out;
  for (int r = 0; r < std::min(current_rank, rungs); ++r) {
    if (auto c = make(r)) out.push_back(std::move(*c));
  }
  return out;
}

// ---- sizes ----

std::vector<Case> fewer_of(int n, const std::function<Case(const std::vector<int>&)>& select) {
  std::vector<Case> out;
  for (const auto& s : subsets(n, 16)) out.push_back(select(s));
  for (const auto& s : all_but_one(n, 16)) out.push_back(select(s));
  return out;
}

std::vector<std::string> describe_rows(const Case& c) {
  if (c.batch == 1) return {};
  return {std::to_string(c.batch) + " batch rows"};
}
std::vector<Case> toward_rows(const Case& c) {
  return fewer_of(c.batch, [&](const std::vector<int>& v) { return select_rows(c, v); });
}

std::vector<std::string> describe_query_tokens(const Case& c) {
  if (c.s_q == 1) return {};
  return {"s_q = " + std::to_string(c.s_q)};
}
std::vector<Case> toward_query_tokens(const Case& c) {
  return fewer_of(c.s_q, [&](const std::vector<int>& v) { return select_tokens(c, v); });
}

std::vector<std::string> describe_heads(const Case& c) {
  if (c.heads == 1) return {};
  return {std::to_string(c.heads) + " heads"};
}
std::vector<Case> toward_heads(const Case& c) {
  return fewer_of(c.heads, [&](const std::vector<int>& v) { return select_heads(c, v); });
}

std::vector<std::string> describe_extra(const Case& c) {
  if (!c.extra) return {};
  std::vector<std::string> d{"extra cache"};
  if (c.extra->topk_length) {
    for (const int32_t len : *c.extra->topk_length) {
      if (len < c.extra->topk) {
        d.push_back("extra topk_length < extra topk");
        break;
      }
    }
  }
  return d;
}

// The extra list merged into the main list: each list becomes [extra entries counted, main
// entries counted, extra entries masked, main entries masked] (with own_tiles: [main counted, -1
// to a token-tile boundary, extra counted, ...], each list keeping its tiles), the length the
// counted ones (no length when nothing is masked); the extra tokens become main-cache tokens of
// the same pages and slots (the cache grown to hold them). The joint softmax over both lists is
// one softmax over the merged list, and a masked entry stays masked.
std::optional<Case> merged_extra(const Case& c, bool own_tiles) {
  if (!c.extra || !c.page_order.empty()) return std::nullopt;
  const ExtraCache& e = *c.extra;
  Case r = c;
  r.extra.reset();
  const bool lengths = c.topk_length.has_value() || e.topk_length.has_value();
  if (lengths) r.topk_length = std::vector<int32_t>(static_cast<size_t>(c.batch), 0);
  // With own_tiles, the main list's counted entries come first, padded with -1 to a whole
  // number of token tiles, then the extra list's: each list keeps the tiles (and so the
  // online-softmax steps and splits) it had. The pad is the same for every row.
  int32_t longest = 0, pad = 0;
  if (own_tiles) {
    for (int b = 0; b < c.batch; ++b) {
      longest =
          std::max(longest, c.topk_length ? (*c.topk_length)[static_cast<size_t>(b)] : c.topk);
    }
    pad = round_up_to(longest, mla::kMmaTokenTile) - longest;
  }
  r.topk = c.topk + e.topk + pad;
  int32_t largest = 0;
  for (int q = 0; q < c.query_rows(); ++q) {
    const auto b = static_cast<size_t>(q / c.s_q);
    const auto& main = c.indices[static_cast<size_t>(q)];
    const auto& extra_in = e.indices[static_cast<size_t>(q)];
    const int32_t m_len = c.topk_length ? (*c.topk_length)[b] : c.topk;
    const int32_t e_len = e.topk_length ? (*e.topk_length)[b] : e.topk;
    // An extra token keeps its page and slot (the last slot of a page stays the last).
    std::vector<int32_t> extra;
    for (const int32_t v : extra_in) {
      if (v < 0) {
        extra.push_back(v);
        continue;
      }
      const int32_t page = v / e.page_size, slot = v % e.page_size;
      const int32_t P = c.geom.page_size;
      // In 64 bits: an entry past the cache (out_of_range, up to INT32_MAX) may map past 2^31;
      // it stays past the cache's end as INT32_MAX.
      const int64_t moved =
          int64_t{page} * P +
          (slot == e.page_size - 1 && e.page_size > 1 ? P - 1 : std::min(slot, P - 1));
      extra.push_back(
          static_cast<int32_t>(std::min<int64_t>(moved, std::numeric_limits<int32_t>::max())));
    }
    std::vector<int32_t> row;
    if (own_tiles) {
      // Main counted, -1 up to the tile boundary of the longest main list, extra counted.
      row.assign(main.begin(), main.begin() + m_len);
      row.resize(static_cast<size_t>(longest + pad), -1);
      row.insert(row.end(), extra.begin(), extra.begin() + e_len);
    } else {
      row.assign(extra.begin(), extra.begin() + e_len);
      row.insert(row.end(), main.begin(), main.begin() + m_len);
    }
    const auto counted = static_cast<int32_t>(row.size());
    row.insert(row.end(), extra.begin() + e_len, extra.end());
    row.insert(row.end(), main.begin() + m_len, main.end());
    row.resize(static_cast<size_t>(r.topk), -1);
    for (const int32_t v : extra) largest = std::max(largest, v);
    r.indices[static_cast<size_t>(q)] = std::move(row);
    if (lengths) (*r.topk_length)[b] = counted;
  }
  r.geom.num_pages = std::max(c.geom.num_pages, largest / c.geom.page_size + 1);
  return r;
}

// The extra cache gone, merged into the main list (also with the extra cache's stride padding
// and page size, when they differ), or simpler.
std::vector<Case> toward_extra(const Case& c) {
  std::vector<Case> out = simpler_extra(c);
  std::vector<Case> merged;
  // Into the main cache as it is, or with the extra cache's page size first.
  std::vector<Case> targets{c};
  if (c.extra && c.extra->page_size != c.geom.page_size) {
    if (auto r = with_page_size(c, c.extra->page_size)) targets.push_back(std::move(*r));
  }
  for (const Case& t : targets) {
    for (const bool own_tiles : {false, true}) {
      auto m = merged_extra(t, own_tiles);
      if (!m) continue;
      merged.push_back(*m);
      const int64_t pad = stride_padding(c.extra_geom());
      if (pad > stride_padding(t.geom)) {
        Case padded = *m;
        padded.geom.page_stride = mla::min_page_stride(padded.geom) + pad;
        merged.push_back(padded);
      }
    }
  }
  out.insert(out.begin() + (out.empty() ? 0 : 1), merged.begin(), merged.end());
  return out;
}

// Valid entries of query row q, main list then extra list.
int valid_in_row(const Case& c, int q) {
  int n = 0;
  for (int k = 0; k < c.topk; ++k) n += entry_valid(c, q, k) ? 1 : 0;
  if (c.extra) {
    for (int k = 0; k < c.extra->topk; ++k) n += extra_entry_valid(c, q, k) ? 1 : 0;
  }
  return n;
}

std::vector<std::string> describe_tokens(const Case& c) {
  std::vector<std::string> d;
  int most = 0, tiles = 0;
  for (int q = 0; q < c.query_rows(); ++q) {
    most = std::max(most, valid_in_row(c, q));
    std::set<int> row_tiles;
    for (int k = 0; k < c.topk; ++k) {
      if (entry_valid(c, q, k)) row_tiles.insert(k / mla::kMmaTokenTile);
    }
    tiles = std::max(tiles, static_cast<int>(row_tiles.size()));
  }
  if (most >= 2) d.push_back("several valid entries");
  if (tiles >= 2) d.push_back("valid entries in several 64-token tiles");
  return d;
}

// Fewer valid entries: each one made -1 where it is (the others keep their positions and tiles),
// then fewer positions (fewer_tokens). A row with many valid entries (an extra list merged into
// the main one) first has the first or the second half of them made -1, so that the walk gets
// down to a few in a number of steps that grows with the logarithm of the list, not the list.
std::vector<Case> toward_tokens(const Case& c) {
  std::vector<Case> out;
  for (int q = 0; q < c.query_rows(); ++q) {
    std::vector<int> valid;
    for (int k = 0; k < c.topk; ++k) {
      if (entry_valid(c, q, k)) valid.push_back(k);
    }
    if (static_cast<int>(valid.size()) <= kManyValidEntries) continue;
    const size_t half = valid.size() / 2;
    for (const auto& [lo, hi] : {std::pair{size_t{0}, half}, std::pair{half, valid.size()}}) {
      Case r = c;
      for (size_t i = lo; i < hi; ++i) {
        r.indices[static_cast<size_t>(q)][static_cast<size_t>(valid[i])] = -1;
      }
      out.push_back(std::move(r));
    }
  }
  for (int q = 0; q < c.query_rows(); ++q) {
    if (valid_in_row(c, q) < 2) continue;
    for (int k = 0; k < c.topk && static_cast<int>(out.size()) < kMaxEntryMoves; ++k) {
      if (!entry_valid(c, q, k)) continue;
      Case r = c;
      r.indices[static_cast<size_t>(q)][static_cast<size_t>(k)] = -1;
      out.push_back(std::move(r));
    }
  }
  for (Case& r : fewer_tokens(c)) out.push_back(std::move(r));
  return out;
}

std::vector<Case> toward_pages(const Case& c) {
  if (auto r = compact_pages(c)) return {std::move(*r)};
  return {};
}

// ---- data ----

// data_seed 0, then 1; q values of the case's own positions.
std::vector<Case> toward_data(const Case& c) {
  std::vector<Case> out;
  if (c.q_source) {
    Case r = c;
    r.q_source.reset();
    out.push_back(std::move(r));
  }
  const int rank = c.data_seed <= 1 ? static_cast<int>(c.data_seed) : 2;
  for (int s = 0; s < rank; ++s) {
    Case r = c;
    r.data_seed = static_cast<uint64_t>(s);
    r.q_source.reset();
    out.push_back(std::move(r));
  }
  return out;
}

// Values: small integers, small integers of 1/16, normal, the case's distribution without
// special values, the case's.
int value_rank(const ValueSpec& v) {
  if (same_spec(v, kSmallInt)) return 0;
  if (same_spec(v, kSmallIntSixteenth)) return 1;
  if (same_spec(v, kNormal)) return 2;
  return v.special_fraction == 0 ? 3 : 4;
}

std::vector<std::string> describe_values(const Case& c) {
  std::vector<std::string> d;
  const struct {
    const ValueSpec& v;
    const char* what;
  } specs[] = {{c.q_values, "q"}, {c.kv_values, "K"}, {c.rope_values, "rope"}};
  for (const auto& s : specs) {
    if (s.v.dist == ValueDist::kZeros) d.push_back(std::string(s.what) + " all zero");
    if (s.v.dist == ValueDist::kTies) d.push_back(std::string("tied ") + s.what + " values");
    if (s.v.special_fraction > 0) d.push_back(std::string("special values in ") + s.what);
  }
  return d;
}

std::vector<Case> toward_values(const Case& c) {
  std::vector<Case> out;
  ValueSpec Case::*fields[] = {&Case::q_values, &Case::kv_values, &Case::rope_values};
  bool all_small = true;
  for (auto f : fields) all_small = all_small && value_rank(c.*f) == 0;
  if (!all_small) {
    Case r = c;
    for (auto f : fields) r.*f = kSmallInt;
    out.push_back(std::move(r));
  }
  for (auto f : fields) {
    const ValueSpec v = c.*f;
    for (Case& r : rungs_below(value_rank(v), 4, [&](int rung) -> std::optional<Case> {
           Case r = c;
           if (rung == 0) r.*f = kSmallInt;
           if (rung == 1) r.*f = kSmallIntSixteenth;
           if (rung == 2) r.*f = kNormal;
           if (rung == 3) (r.*f).special_fraction = 0;
           return r;
         })) {
      out.push_back(std::move(r));
    }
  }
  return out;
}

// ---- logit range ----

// The logits' range, decided on the logits themselves (whatever values and scales give them),
// and moved by scaling q by a power of two: the same draws, every logit scaled exactly.
constexpr double kLargeLogit = 64;       // exp(64) is within a factor 2^36 of fp32's overflow
constexpr double kSmallLogit = 1.0 / 4;  // every softmax weight within a factor e^0.5 of another
constexpr double kLogitStep = 8;         // one move scales q by 8 (or 1/8)

enum class LogitRange { kNormal, kLarge, kSmall };

LogitRange logit_range(double most) {
  if (most >= kLargeLogit) return LogitRange::kLarge;
  if (most > 0 && most <= kSmallLogit) return LogitRange::kSmall;
  return LogitRange::kNormal;
}

std::vector<std::string> describe_logits(const Case& c) {
  switch (logit_range(max_abs_logit(c))) {
    case LogitRange::kLarge:
      return {"large logits"};
    case LogitRange::kSmall:
      return {"small logits"};
    case LogitRange::kNormal:
      break;
  }
  return {};
}

Case with_q_scaled(const Case& c, double factor) {
  Case r = c;
  r.q_values.magnitude *= factor;
  return r;
}

// q scaled by 1/8 (large logits) or 8 (small logits).
std::vector<Case> toward_logits(const Case& c) {
  const double most = max_abs_logit(c);
  if (!std::isfinite(most)) return {};
  switch (logit_range(most)) {
    case LogitRange::kLarge:
      return {with_q_scaled(c, 1 / kLogitStep)};
    case LogitRange::kSmall:
      return {with_q_scaled(c, kLogitStep)};
    case LogitRange::kNormal:
      break;
  }
  return {};
}

// The simplest fixed scale of a convention: 1, or for fp32 V32 scales 1.5 (the simplest that is
// not a power of two).
ScaleSpec unit_scales(ScaleConvention conv) {
  return {ScaleMode::kFixed, 127, 127, conv, conv == ScaleConvention::kFp32 ? 1.5 : 1.0};
}

// `s` under convention `conv` (the mantissa only fixed fp32 scales have reset to 1).
ScaleSpec with_convention(ScaleSpec s, ScaleConvention conv) {
  s.convention = conv;
  if (conv != ScaleConvention::kFp32 || s.mode != ScaleMode::kFixed) s.mantissa = 1.0;
  return s;
}

// Scales, within their convention: 1 everywhere (1.5 for fp32 scales), random around 1 (tiles
// differ), the writer's, the case's.
int scale_rank(const ScaleSpec& s) {
  if (same_scales(s, unit_scales(s.convention))) return 0;
  for (const ScaleSpec& r : kCanonicalRandomScales) {
    if (same_scales(s, with_convention(r, s.convention))) return 1;
  }
  return s.mode == ScaleMode::kWriter ? 2 : 3;
}

std::vector<std::string> describe_scales(const Case& c) {
  const ScaleSpec& s = c.scales;
  switch (s.mode) {
    case ScaleMode::kFixed:
      if (scale_rank(s) == 0) return {};
      return {"one scale other than 1 for every tile"};
    case ScaleMode::kWriter:
      return {"writer scales"};
    case ScaleMode::kRandom:
      if (s.exp_lo >= 100 && s.exp_hi <= 160) return {"scales differ between tiles"};
      return {"extreme scales"};
  }
  return {};
}

std::vector<Case> toward_scales(const Case& c) {
  const int rank = scale_rank(c.scales);
  std::vector<Case> out;
  Case r = c;
  const ScaleConvention conv = c.scales.convention;
  if (rank > 0) {
    r.scales = unit_scales(conv);
    out.push_back(r);
  }
  if (rank > 1) {
    for (const ScaleSpec& s : kCanonicalRandomScales) {
      r.scales = with_convention(s, conv);
      out.push_back(r);
    }
  }
  if (rank > 2) {
    r.scales = with_convention({ScaleMode::kWriter, 127, 127}, conv);
    out.push_back(r);
  }
  return out;
}

// The V32 scale convention: power-of-two (ue8m0) scales, or fp32 ones; the scales keep their
// mode (a fixed fp32 scale becomes 1).
std::vector<std::string> describe_scale_convention(const Case& c) {
  if (c.scales.convention == ScaleConvention::kPowerOfTwo) return {};
  return {"fp32 V32 scales"};
}

std::vector<Case> toward_scale_convention(const Case& c) {
  if (c.scales.convention == ScaleConvention::kPowerOfTwo) return {};
  Case r = c;
  r.scales = with_convention(c.scales, ScaleConvention::kPowerOfTwo);
  return {r};
}

// ---- geometry ----

std::vector<std::string> describe_layout(const Case& c) {
  if (c.geom.layout == mla::Layout::kModel1) return {};
  return {"layout v32"};
}

std::vector<Case> toward_layout(const Case& c) {
  if (c.geom.layout == mla::Layout::kModel1) return {};
  return {with_dims(c, mla::Layout::kModel1, kCanonicalNope, kCanonicalRope),
          with_dims(c, mla::Layout::kModel1, kPaddedNopeModel1, kCanonicalRope)};
}

int32_t padded_nope_of(mla::Layout l) {
  return l == mla::Layout::kModel1 ? kPaddedNopeModel1 : kPaddedNopeV32;
}

std::vector<std::string> describe_dims(const Case& c) {
  std::vector<std::string> d;
  const int32_t nope = c.geom.nope_dim;
  if (mla::padded_nope(nope) != nope) {
    d.push_back("padded nope (nope_dim not a power of two)");
  } else if (nope != kCanonicalNope) {
    d.push_back("nope_dim " + std::to_string(nope));
  }
  if (c.geom.rope_dim != kCanonicalRope) d.push_back("rope_dim " + std::to_string(c.geom.rope_dim));
  return d;
}

std::vector<Case> toward_dims(const Case& c) {
  const mla::Layout l = c.geom.layout;
  const int32_t nope = c.geom.nope_dim, rope = c.geom.rope_dim;
  const int32_t padded = padded_nope_of(l);
  std::vector<Case> out;
  const bool nope_canonical = nope == kCanonicalNope;
  if (!nope_canonical && rope != kCanonicalRope) {
    out.push_back(with_dims(c, l, kCanonicalNope, kCanonicalRope));
  }
  if (!nope_canonical) out.push_back(with_dims(c, l, kCanonicalNope, rope));
  if (rope != kCanonicalRope) out.push_back(with_dims(c, l, nope, kCanonicalRope));
  if (!nope_canonical && nope != padded && mla::padded_nope(nope) != nope) {
    out.push_back(with_dims(c, l, padded, rope));
  }
  return out;
}

bool identity_order(const std::vector<int32_t>& order) {
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] != static_cast<int32_t>(i)) return false;
  }
  return true;
}

std::vector<std::string> describe_page_order(const Case& c) {
  if (identity_order(c.page_order)) return {};
  return {"pages out of order"};
}

// The identity order: every token on its logical page, or every token moved to the physical
// place it had (the same pages and slots in memory).
std::vector<Case> toward_page_order(const Case& c) {
  if (c.page_order.empty()) return {};
  Case r = c;
  r.page_order.clear();
  Case phys = r;
  for (auto& row : phys.indices) {
    for (int32_t& v : row) {
      if (in_cache(c, v)) v = static_cast<int32_t>(physical_slot(c, v));
    }
  }
  return {r, phys};
}

std::vector<std::string> describe_stride(const Case& c) {
  if (stride_padding(c.geom) == 0) return {};
  return {"padded page stride"};
}

std::vector<Case> toward_stride(const Case& c) {
  if (c.geom.page_stride == 0) return {};
  Case r = c;
  r.geom.page_stride = 0;
  return {r};
}

int page_size_rank(int32_t p) {
  for (int i = 0; i < static_cast<int>(std::size(kPageSizes)); ++i) {
    if (kPageSizes[i] == p) return i;
  }
  return kRanks;
}

std::vector<std::string> describe_page_size(const Case& c) {
  const int32_t p = c.geom.page_size;
  if (p == kPageSizes[0]) return {};
  if (p == 1) return {"page_size 1"};
  if (!is_pow2(p)) return {"page_size not a power of two"};
  return {"page_size " + std::to_string(p)};
}

std::vector<Case> toward_page_size(const Case& c) {
  return rungs_below(page_size_rank(c.geom.page_size), kRanks,
                     [&](int rung) { return with_page_size(c, kPageSizes[rung]); });
}

// ---- entries ----

// Tokens of entries: the valid main-list entries of every row.
std::vector<std::pair<int, int>> valid_entries(const Case& c) {
  std::vector<std::pair<int, int>> v;
  for (int q = 0; q < c.query_rows(); ++q) {
    for (int k = 0; k < c.topk; ++k) {
      if (entry_valid(c, q, k)) v.emplace_back(q, k);
    }
  }
  return v;
}

int32_t& entry(Case& c, int q, int k) {
  return c.indices[static_cast<size_t>(q)][static_cast<size_t>(k)];
}
int32_t entry(const Case& c, int q, int k) {
  return c.indices[static_cast<size_t>(q)][static_cast<size_t>(k)];
}

std::vector<std::string> describe_slots(const Case& c) {
  const int32_t P = c.geom.page_size;
  bool beyond = false, last = false;
  for (const auto& [q, k] : valid_entries(c)) {
    const int32_t t = entry(c, q, k);
    beyond = beyond || t >= P;
    last = last || (P > 1 && t % P == P - 1);
  }
  std::vector<std::string> d;
  if (beyond) d.push_back("entry beyond the first page");
  if (last) d.push_back("entry in the last slot of a page");
  return d;
}

// A token moved to logical slot `to` (the cache grown to hold it).
std::optional<Case> moved(const Case& c, int q, int k, int32_t to) {
  if (to < 0) return std::nullopt;
  Case r = c;
  const int32_t P = c.geom.page_size;
  const int32_t pages = to / P + 1;
  if (pages > c.geom.num_pages) {
    if (!c.page_order.empty()) return std::nullopt;
    r.geom.num_pages = pages;
  }
  entry(r, q, k) = to;
  return r;
}

std::vector<Case> toward_slots(const Case& c) {
  std::vector<Case> out;
  const auto valid = valid_entries(c);
  // Every valid token renumbered 0, 1, 2, ... in order of first appearance.
  {
    Case r = c;
    std::map<int32_t, int32_t> renumber;
    for (const auto& [q, k] : valid) {
      const int32_t t = entry(c, q, k);
      if (renumber.count(t) == 0) {
        const auto next = static_cast<int32_t>(renumber.size());
        renumber[t] = next;
      }
      entry(r, q, k) = renumber[t];
    }
    // Masked entries that would now collide stay where they are: a masked entry is never read.
    // r writes another file than c exactly when its lists differ (it differs in nothing else).
    if (!SameCaseFile::same_lists(r, c)) out.push_back(std::move(r));
  }
  const int32_t P = c.geom.page_size;
  int moves = 0;
  for (const auto& [q, k] : valid) {
    if (++moves > kMaxEntryMoves) break;
    Case others = c;
    entry(others, q, k) = -1;
    const int32_t t = entry(c, q, k);
    // Rungs: the lowest slot no other entry uses, the last slot of page 0, the first and the
    // last slot of page 1.
    const int32_t rung_slot[] = {unused_token(others), P - 1, P, 2 * P - 1};
    int rank = kRanks;
    for (int i = 0; i < kRanks; ++i) {
      if (rung_slot[i] == t) {
        rank = i;
        break;
      }
    }
    for (Case& r : rungs_below(rank, kRanks, [&](int rung) -> std::optional<Case> {
           const int32_t to = rung_slot[rung];
           if (to == t) return std::nullopt;
           // A slot another valid entry holds would make a duplicate: not a move toward canonical.
           for (const auto& [q2, k2] : valid) {
             if ((q2 != q || k2 != k) && entry(c, q2, k2) == to) return std::nullopt;
           }
           return moved(c, q, k, to);
         })) {
      out.push_back(std::move(r));
    }
  }
  return out;
}

// Rows with a valid entry somewhere (main or extra list).
bool row_has_valid(const Case& c, int q) { return valid_in_row(c, q) > 0; }

std::vector<std::string> describe_invalid(const Case& c) {
  bool minus_one = false, other = false, past = false;
  const int64_t slots = mla::num_slots(c.geom);
  for (int q = 0; q < c.query_rows(); ++q) {
    // An empty row is its own feature; an entry past the cache is named in it too (it is what
    // an empty row of -1 entries lacks).
    const bool empty = !row_has_valid(c, q);
    const int32_t len = row_len(c, q);
    for (int k = 0; k < (len < 0 ? c.topk : len); ++k) {
      const int32_t v = entry(c, q, k);
      minus_one = minus_one || (v == -1 && !empty);
      other = other || (v < -1 && !empty);
      past = past || v >= slots;
    }
  }
  std::vector<std::string> d;
  if (minus_one) d.push_back("-1 entry");
  if (other) d.push_back("negative entry other than -1");
  if (past) d.push_back("entry past the cache");
  return d;
}

// Main-list positions that hold an invalid entry (negative, or past the cache) in every row.
std::vector<int> invalid_positions(const Case& c) {
  std::vector<int> pos;
  for (int k = 0; k < c.topk; ++k) {
    bool all = true;
    for (int q = 0; q < c.query_rows() && all; ++q) all = !in_cache(c, entry(c, q, k));
    if (all) pos.push_back(k);
  }
  return pos;
}

std::vector<int> without(int n, const std::vector<int>& drop) {
  std::vector<int> keep;
  for (int k = 0; k < n; ++k) {
    if (std::find(drop.begin(), drop.end(), k) == drop.end()) keep.push_back(k);
  }
  return keep;
}

std::vector<Case> toward_invalid(const Case& c) {
  std::vector<Case> out;
  const std::vector<int> pos = invalid_positions(c);
  if (!pos.empty() && static_cast<int>(pos.size()) < c.topk) {
    out.push_back(select_positions(c, without(c.topk, pos)));
    if (pos.size() > 1) {
      int moves = 0;
      for (int k : pos) {
        if (++moves > kMaxEntryMoves) break;
        out.push_back(select_positions(c, without(c.topk, {k})));
      }
    }
  }
  // Other negatives and entries past the cache written as -1 (the conventions that allow them
  // make -1 invalid too).
  Case r = c;
  bool changed = false;
  const int64_t slots = mla::num_slots(c.geom);
  for (auto& row : r.indices) {
    for (int32_t& v : row) {
      if (v < -1 || v >= slots) {
        v = -1;
        changed = true;
      }
    }
  }
  if (changed) out.push_back(std::move(r));
  // Entries past the cache moved to its first slot past the end: how far past the end an entry
  // lies is not a feature (a kernel that reads one reads the bytes after the cache there, where
  // farther ones may fault or not by the process's memory layout).
  Case near = c;
  changed = false;
  for (auto& row : near.indices) {
    for (int32_t& v : row) {
      if (v > slots) {
        v = static_cast<int32_t>(slots);
        changed = true;
      }
    }
  }
  if (changed) out.push_back(std::move(near));
  return out;
}

std::vector<std::string> describe_empty_rows(const Case& c) {
  for (int q = 0; q < c.query_rows(); ++q) {
    if (!row_has_valid(c, q)) return {"row without a valid entry"};
  }
  return {};
}

// An empty row's first entry made a valid, unused token (when its length lets it count).
std::vector<Case> toward_empty_rows(const Case& c) {
  std::vector<Case> out;
  for (int q = 0; q < c.query_rows() && static_cast<int>(out.size()) < kMaxEntryMoves; ++q) {
    if (row_has_valid(c, q) || row_len(c, q) == 0) continue;
    if (auto r = moved(c, q, 0, unused_token(c))) out.push_back(std::move(*r));
  }
  return out;
}

std::vector<std::string> describe_duplicates(const Case& c) {
  for (int q = 0; q < c.query_rows(); ++q) {
    std::set<int32_t> seen;
    for (int k = 0; k < c.topk; ++k) {
      if (!entry_valid(c, q, k)) continue;
      if (!seen.insert(entry(c, q, k)).second) return {"duplicate entry"};
    }
  }
  return {};
}

std::vector<Case> toward_duplicates(const Case& c) {
  std::vector<Case> out;
  for (int q = 0; q < c.query_rows(); ++q) {
    std::set<int32_t> seen;
    for (int k = 0; k < c.topk && static_cast<int>(out.size()) < kMaxEntryMoves; ++k) {
      if (!entry_valid(c, q, k) || seen.insert(entry(c, q, k)).second) continue;
      if (c.query_rows() == 1 && c.topk > 1)
        out.push_back(select_positions(c, without(c.topk, {k})));
      if (auto r = moved(c, q, k, unused_token(c))) out.push_back(std::move(*r));
    }
  }
  return out;
}

std::vector<std::string> describe_topk_length(const Case& c) {
  if (!c.topk_length) return {};
  bool shorter = false, masked_valid = false;
  for (int q = 0; q < c.query_rows(); ++q) {
    const int32_t len = row_len(c, q);
    shorter = shorter || len < c.topk;
    for (int k = std::max(0, len); k < c.topk; ++k)
      masked_valid = masked_valid || in_cache(c, entry(c, q, k));
  }
  if (!shorter) return {"topk_length = topk"};
  if (masked_valid) return {"topk_length < topk, valid index beyond topk_length"};
  return {"topk_length < topk"};
}

// topk_length gone (the entries it masked made -1), the positions no length reaches dropped, or
// a masked -1 made a valid index: the canonical masked entry is one a kernel that reads masked
// entries reads as a token (the way poison reads them), so that such a kernel fails the direct
// comparison with the oracle whichever property found it.
std::vector<Case> toward_topk_length(const Case& c) {
  if (!c.topk_length) return {};
  std::vector<Case> out{without_topk_length(c)};
  int32_t longest = 0;
  for (int q = 0; q < c.query_rows(); ++q) longest = std::max(longest, row_len(c, q));
  int moves = 0;
  for (int q = 0; q < c.query_rows(); ++q) {
    for (int k = std::max(0, row_len(c, q)); k < c.topk && moves < kMaxEntryMoves; ++k) {
      // A masked -1 made a valid index, a masked index made the lowest one no other entry uses.
      Case others = c;
      entry(others, q, k) = -1;
      const int32_t lowest = unused_token(others);
      if (in_cache(c, entry(c, q, k)) && entry(c, q, k) <= lowest) continue;
      ++moves;
      if (auto r = moved(c, q, k, lowest)) out.push_back(std::move(*r));
    }
  }
  // The positions no row's length reaches dropped.
  if (longest >= 1 && longest < c.topk) out.push_back(select_positions(c, all_of(longest)));
  return out;
}

// ---- sinks, scale, conventions ----

// Sinks: none, 0, -inf, +inf (every head), the case's.
int sink_rank(const Case& c) {
  if (!c.sink) return 0;
  const auto all = [&](double v) {
    return std::all_of(c.sink->begin(), c.sink->end(), [&](double s) { return s == v; });
  };
  if (all(0.0)) return 1;
  if (all(-HUGE_VAL)) return 2;
  if (all(HUGE_VAL)) return 3;
  return kRanks;
}

std::vector<std::string> describe_sink(const Case& c) {
  if (!c.sink) return {};
  bool pinf = false, finite = false;
  for (double v : *c.sink) {
    pinf = pinf || v == HUGE_VAL;
    finite = finite || std::isfinite(v);
  }
  if (pinf) return {"sink = +inf"};
  if (finite) return {"finite sink"};
  return {"sink = -inf"};
}

std::vector<Case> toward_sink(const Case& c) {
  return rungs_below(sink_rank(c), kRanks, [&](int rung) -> std::optional<Case> {
    Case r = c;
    const double v[] = {0.0, 0.0, -HUGE_VAL, HUGE_VAL};
    if (rung == 0) {
      r.sink.reset();
    } else {
      r.sink = std::vector<double>(static_cast<size_t>(c.heads), v[rung]);
    }
    return r;
  });
}

std::vector<std::string> describe_sm_scale(const Case& c) {
  if (!c.sm_scale) return {};
  return {"explicit sm_scale"};
}

std::vector<Case> toward_sm_scale(const Case& c) {
  if (!c.sm_scale) return {};
  Case r = c;
  r.sm_scale.reset();
  return {r};
}

std::vector<std::string> describe_conventions(const Case& c) {
  std::vector<std::string> d;
  if (c.conventions.invalid_index == mla::InvalidIndexRule::kAnyNegative) {
    d.push_back("any negative index invalid");
  } else if (c.conventions.invalid_index == mla::InvalidIndexRule::kOutOfRange) {
    d.push_back("any index outside the cache invalid");
  }
  if (c.conventions.empty_lse != mla::EmptyRowLse::kPosInf) d.push_back("empty-row LSE -inf");
  if (c.conventions.sink_in_lse) d.push_back("sink in the LSE");
  return d;
}

// ---- fills and padding ----

std::vector<std::string> describe_fill(const Case& c) {
  if (c.pad_fill == Fill::kZero) return {};
  return {std::string(fill_name(c.pad_fill)) + " pad fill"};
}

std::vector<Case> toward_fill(const Case& c) {
  if (c.pad_fill == Fill::kZero) return {};
  Case r = c;
  r.pad_fill = Fill::kZero;
  return {r};
}

struct Pad {
  int32_t Case::*field;
  const char* what;
};
constexpr Pad kPads[] = {
    {&Case::q_head_pad, "q head padding"},     {&Case::out_head_pad, "out head padding"},
    {&Case::q_batch_pad, "q row gap"},         {&Case::out_batch_pad, "out row gap"},
    {&Case::indices_row_pad, "index row gap"}, {&Case::lse_row_pad, "lse row gap"}};

std::vector<std::string> describe_pads(const Case& c) {
  std::vector<std::string> d;
  for (const Pad& p : kPads) {
    if (c.*(p.field) != 0) d.push_back(p.what);
  }
  return d;
}

std::vector<Case> toward_pads(const Case& c) {
  std::vector<Case> out;
  Case none = c;
  int present = 0;
  for (const Pad& p : kPads) {
    present += c.*(p.field) != 0 ? 1 : 0;
    none.*(p.field) = 0;
  }
  if (present > 1) out.push_back(none);
  for (const Pad& p : kPads) {
    if (c.*(p.field) == 0) continue;
    Case r = c;
    r.*(p.field) = 0;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::string> nothing(const Case&) { return {}; }

// The features in the order cause sets list them, each with its place in the walk.
struct Entry {
  CanonicalFeature feature;
  int walk;
};

std::vector<Entry> make_features() {
  constexpr bool kValues = true;
  return {
      {{"layout", describe_layout, toward_layout, kValues}, 20},
      {{"dims", describe_dims, toward_dims, kValues}, 21},
      {{"page size", describe_page_size, toward_page_size, kValues}, 24},
      {{"page stride", describe_stride, toward_stride}, 23},
      {{"page order", describe_page_order, toward_page_order}, 22},
      {{"slots", describe_slots, toward_slots, kValues}, 25},
      {{"topk_length", describe_topk_length, toward_topk_length}, 30},
      {{"empty rows", describe_empty_rows, toward_empty_rows}, 32},
      {{"invalid entries", describe_invalid, toward_invalid}, 31},
      {{"duplicates", describe_duplicates, toward_duplicates, kValues}, 33},
      {{"tokens", describe_tokens, toward_tokens}, 4},
      {{"sink", describe_sink, toward_sink}, 40},
      {{"sm_scale", describe_sm_scale, toward_sm_scale}, 41},
      {{"conventions", describe_conventions, default_conventions}, 42},
      {{"values", describe_values, toward_values, kValues}, 11},
      {{"logit range", describe_logits, toward_logits}, 14},
      {{"scales", describe_scales, toward_scales, kValues}, 12},
      {{"scale convention", describe_scale_convention, toward_scale_convention, kValues}, 13},
      {{"pad fill", describe_fill, toward_fill}, 43},
      {{"padding", describe_pads, toward_pads}, 44},
      {{"extra cache", describe_extra, toward_extra, kValues}, 1},
      {{"rows", describe_rows, toward_rows}, 0},
      {{"query tokens", describe_query_tokens, toward_query_tokens}, 2},
      {{"heads", describe_heads, toward_heads}, 3},
      {{"pages", nothing, toward_pages, kValues}, 5},
      {{"data", nothing, toward_data}, 10},
  };
}

const std::vector<Entry>& feature_entries() {
  static const std::vector<Entry> e = make_features();
  return e;
}

}  // namespace

const std::vector<CanonicalFeature>& canonical_features() {
  static const std::vector<CanonicalFeature> f = [] {
    std::vector<CanonicalFeature> v;
    for (const Entry& e : feature_entries()) v.push_back(e.feature);
    return v;
  }();
  return f;
}

std::vector<ShrinkStep> canonical_steps() {
  std::vector<const Entry*> order;
  for (const Entry& e : feature_entries()) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(),
                   [](const Entry* a, const Entry* b) { return a->walk < b->walk; });
  std::vector<ShrinkStep> steps;
  for (const Entry* e : order) {
    if (!e->feature.changes_values) {
      steps.push_back({e->feature.name, e->feature.toward});
      continue;
    }
    // A move that changes values may lose a failure that needs particular values: each
    // candidate also with the canonical draws (data_seed 0 to 5), so that the walk can take
    // the move where the failure needs the feature's values only by chance.
    // Where the case's logits are large or small, each candidate also with q scaled back to
    // that range (keeping_logit_range): a failure that needs the range, not the values, keeps it.
    auto toward = e->feature.toward;
    steps.push_back({e->feature.name, [toward](const Case& c) {
                       std::vector<Case> out;
                       const double most = max_abs_logit(c);
                       const auto add = [&](Case m) {
                         std::optional<Case> kept = keeping_logit_range(most, m);
                         out.push_back(std::move(m));
                         if (kept) out.push_back(std::move(*kept));
                       };
                       for (Case& m : toward(c)) {
                         add(m);
                         for (const uint64_t s : kRerolls) {
                           if (s == m.data_seed) continue;
                           Case r = m;
                           r.data_seed = s;
                           r.q_source.reset();
                           add(std::move(r));
                         }
                       }
                       return out;
                     }});
  }
  return steps;
}

namespace {

double compute_max_abs_logit(const Case& c) {
  double most = 0;
  try {
    const MaterializedCase m = materialize_named_tokens(c);  // the logits read nothing else
    for (int r = 0; r < c.query_rows(); ++r) {
      const OracleRow row = gather_row(m, r);
      if (row.k.empty()) continue;
      const Eigen::MatrixXd x = row_logits(m, r, row);
      for (Eigen::Index i = 0; i < x.size(); ++i) {
        const double v = std::abs(x.data()[i]);
        most = std::isfinite(v) ? std::max(most, v) : HUGE_VAL;
      }
    }
  } catch (const std::exception&) {
    return 0;
  }
  return most;
}

}  // namespace

// The largest |x| over the valid entries of every query row (x = sm_scale q . K, the oracle's
// logits): +inf when one is not finite, 0 for none or a case that cannot be materialized.
// Materializing the case (q and the tokens its lists name) is most of the cost, and the
// canonical walk asks again for the same case (once per value-changing step of a pass, then
// triage's cause set): the last few answers are kept per thread, keyed by the case's JSON (the
// whole case, as its file holds it).
double max_abs_logit(const Case& c) {
  constexpr size_t kKept = 8;
  thread_local std::deque<std::pair<std::string, double>> kept;
  std::string key = to_json(c);
  for (const auto& [k, v] : kept) {
    if (k == key) return v;
  }
  const double most = compute_max_abs_logit(c);
  if (kept.size() == kKept) kept.pop_front();
  kept.emplace_back(std::move(key), most);
  return most;
}

std::optional<Case> keeping_logit_range(double most, const Case& m) {
  const LogitRange range = logit_range(most);
  if (range == LogitRange::kNormal || !std::isfinite(most)) return std::nullopt;
  const double now = max_abs_logit(m);
  if (now <= 0 || !std::isfinite(now) || logit_range(now) == range) return std::nullopt;
  // The power of two that brings m's largest logit back to the case's (at least, for large
  // logits; at most, for small ones).
  const double k = range == LogitRange::kLarge ? std::ceil(std::log2(most / now))
                                               : std::floor(std::log2(most / now));
  return with_q_scaled(m, std::exp2(k));
}

ShrinkResult canonicalize_case(const Case& c, const std::function<bool(const Case&)>& still_fails,
                               const ShrinkLimits& limits, const Envelope& envelope,
                               std::set<std::string>* rejected, const ShrinkHooks& hooks) {
  std::set<std::string> own;
  return greedy_shrink(c, canonical_steps(), still_fails, limits, envelope,
                       rejected != nullptr ? rejected : &own, hooks);
}

namespace {

Case without_index_lists(Case c) {
  c.indices.clear();
  if (c.extra) c.extra->indices.clear();
  return c;
}

}  // namespace

SameCaseFile::SameCaseFile(const Case& c) : c_(c), rest_(to_json(without_index_lists(c))) {}

bool SameCaseFile::same_lists(const Case& a, const Case& b) {
  return a.indices == b.indices && a.extra.has_value() == b.extra.has_value() &&
         (!a.extra || a.extra->indices == b.extra->indices);
}

bool SameCaseFile::operator()(const Case& other) const {
  return same_lists(other, c_) && to_json(without_index_lists(other)) == rest_;
}

std::vector<std::string> cause_set(const Case& c, const Envelope& envelope) {
  const Case e = with_explicit_indices(c);
  const SameCaseFile same_as_e(e);
  std::vector<std::string> causes;
  for (const CanonicalFeature& f : canonical_features()) {
    const std::vector<std::string> d = f.describe(e);
    if (d.empty()) continue;
    // A cause only where some move inside the envelope would take it away.
    bool movable = false;
    for (const Case& cand : f.toward(e)) {
      try {
        validate(cand);
        if (same_as_e(cand) || envelope.rejects(cand)) continue;
      } catch (const CaseError&) {
        continue;
      }
      movable = true;
      break;
    }
    if (movable) causes.insert(causes.end(), d.begin(), d.end());
  }
  return causes;
}

}  // namespace mlafuzz
