// Transformations of materialized cases for the poison and metamorphic properties.
#include "properties/properties.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <sstream>

#include "core/rng.h"
#include "core/value_format.h"

namespace mlafuzz {
namespace {

int32_t row_length(const MaterializedCase& m, int b) {
  return m.topk_length.empty() ? -1 : m.topk_length[static_cast<size_t>(b)];
}

uint8_t poison_byte(int variant, const CounterRng& rng, size_t i) {
  switch (variant) {
    case 0:
      return 0xff;
    case 1:
      return static_cast<uint8_t>(rng.at(i / 8) >> (8 * (i % 8)));
    case 2:
      return (i % 2 == 0) ? 0x80 : 0x7f;  // little-endian bf16 0x7f80 = +inf
    default:
      return 0x7f;
  }
}

// bytes[i] = poison_byte(variant, rng, i) for begin <= i < end.
void fill_poison_run(int variant, const CounterRng& rng, uint8_t* bytes, size_t begin, size_t end) {
  switch (variant) {
    case 0:
    case 3:
      std::memset(bytes + begin, poison_byte(variant, rng, begin), end - begin);
      return;
    case 1:
      // Random bytes drawn a word (eight bytes) at a time, not once per byte; whole words
      // stored as one (byte k of the word at i + k: a little-endian store).
      for (size_t i = begin; i < end;) {
        const size_t word_end = std::min(end, (i / 8 + 1) * 8);
        const uint64_t word = rng.at(i / 8);
        if (i % 8 == 0 && word_end == i + 8) {
          for (int k = 0; k < 8; ++k) bytes[i + k] = static_cast<uint8_t>(word >> (8 * k));
          i = word_end;
          continue;
        }
        for (; i < word_end; ++i) bytes[i] = static_cast<uint8_t>(word >> (8 * (i % 8)));
      }
      return;
    case 2:
      for (size_t i = begin; i < end; ++i) bytes[i] = (i % 2 == 0) ? 0x80 : 0x7f;
      return;
    default:
      for (size_t i = begin; i < end; ++i) bytes[i] = poison_byte(variant, rng, i);
  }
}

// bytes[i] = poison_byte(variant, rng, i) for begin <= i < end, except where used[i] (used null:
// every i), run by run of unused bytes.
void fill_poison(int variant, const CounterRng& rng, uint8_t* bytes, size_t begin, size_t end,
                 const std::vector<uint8_t>* used) {
  if (used == nullptr) {
    fill_poison_run(variant, rng, bytes, begin, end);
    return;
  }
  const uint8_t* u = used->data();
  for (size_t i = begin; i < end;) {
    const auto from = static_cast<size_t>(std::find(u + i, u + end, uint8_t{0}) - u);
    const auto to = static_cast<size_t>(std::find(u + from, u + end, uint8_t{1}) - u);
    fill_poison_run(variant, rng, bytes, from, to);
    i = to;
  }
}

uint16_t poison_bf16(int variant, const CounterRng& rng, size_t i) {
  switch (variant) {
    case 0:
      return 0xffff;  // NaN
    case 1:
      return static_cast<uint16_t>(rng.at(i));
    case 2:
      return 0x7f80;  // +inf
    default:
      return 0x7f7f;  // largest finite
  }
}

void shuffle(std::vector<int32_t>& v, CounterRng& rng) {
  for (size_t i = v.size(); i > 1; --i) {
    const auto j = static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(i) - 1));
    std::swap(v[i - 1], v[j]);
  }
}

void set_shape(MaterializedCase& r) {
  r.recipe.batch = r.batch;
  r.recipe.heads = r.heads;
  r.recipe.topk = r.topk;
  r.recipe.s_q = r.s_q;
  r.recipe.indices.clear();  // the buffers are the truth now
  if (r.recipe.extra) {
    r.recipe.extra->topk = r.extra_topk;
    r.recipe.extra->indices.clear();
  }
}

}  // namespace

namespace {

// One cache and its lists as the transformations see them (the main or the extra cache).
struct CacheView {
  mla::CacheGeometry* geom;
  CacheBytes* cache;
  std::vector<int32_t>* indices;
  std::vector<int32_t>* lengths;
  int32_t* topk;
  int64_t* token_stride;
  int64_t* batch_stride;
};

CacheView main_view(MaterializedCase& m) {
  return {&m.geom,
          &m.cache,
          &m.indices,
          &m.topk_length,
          &m.topk,
          &m.indices_token_stride,
          &m.indices_batch_stride};
}

CacheView extra_view(MaterializedCase& m) {
  return {&m.extra_geom,
          &m.extra_cache,
          &m.extra_indices,
          &m.extra_topk_length,
          &m.extra_topk,
          &m.extra_indices_token_stride,
          &m.extra_indices_batch_stride};
}

// Every cache of m: the main cache, and the extra cache when there is one.
std::vector<CacheView> caches(MaterializedCase& m) {
  std::vector<CacheView> v{main_view(m)};
  if (m.has_extra) v.push_back(extra_view(m));
  return v;
}

int32_t list_length(const CacheView& c, int b) {
  return c.lengths->empty() ? -1 : (*c.lengths)[static_cast<size_t>(b)];
}

int32_t* list_of(const CacheView& c, int b, int s) {
  return c.indices->data() + b * *c.batch_stride + s * *c.token_stride;
}

std::vector<uint8_t> used_bytes(const MaterializedCase& m, const CacheView& c) {
  std::vector<uint8_t> used(c.cache->size(), 0);
  const mla::CacheGeometry& g = *c.geom;
  const int64_t slots = mla::num_slots(g);
  auto mark = [&](int64_t from, int64_t len) {
    if (from < 0) return;
    const int64_t end = std::min<int64_t>(from + len, static_cast<int64_t>(used.size()));
    for (int64_t i = from; i < end; ++i) used[static_cast<size_t>(i)] = 1;
  };
  for (int32_t b = 0; b < m.batch; ++b) {
    const int32_t len = list_length(c, b);
    for (int32_t s = 0; s < m.s_q; ++s) {
      const int32_t* row = list_of(c, b, s);
      for (int32_t k = 0; k < *c.topk; ++k) {
        const int32_t idx = row[k];
        if (!mla::index_valid(idx, k, len, m.conv) || idx >= slots) continue;
        const mla::TokenAddress a = mla::token_address(g, idx);
        if (g.layout == mla::Layout::kModel1) {
          mark(a.nope, mla::model1_data_bytes(g));
          mark(a.scale, mla::num_scale_tiles(g));  // the pad byte(s) after the scales stay unused
        } else {
          mark(a.nope, mla::token_bytes(g));
        }
      }
    }
  }
  return used;
}

// Copies the bytes of token `from` of geometry gf to token `to` of geometry gt (same layout and
// dims): the data row and the scale row (MODEL1) or the whole token (V32).
void copy_token(const mla::CacheGeometry& gf, const uint8_t* src, int64_t from,
                const mla::CacheGeometry& gt, uint8_t* dst, int64_t to) {
  const mla::TokenAddress a = mla::token_address(gf, from), d = mla::token_address(gt, to);
  if (gf.layout == mla::Layout::kModel1) {
    std::memcpy(dst + d.nope, src + a.nope, static_cast<size_t>(mla::model1_data_bytes(gf)));
    std::memcpy(dst + d.scale, src + a.scale, static_cast<size_t>(mla::model1_scale_bytes(gf)));
  } else {
    std::memcpy(dst + d.nope, src + a.nope, static_cast<size_t>(mla::token_bytes(gf)));
  }
}

}  // namespace

std::vector<uint8_t> used_cache_bytes(const MaterializedCase& m) {
  MaterializedCase& mm = const_cast<MaterializedCase&>(m);  // read only: views need pointers
  return used_bytes(m, main_view(mm));
}

std::vector<uint8_t> used_extra_cache_bytes(const MaterializedCase& m) {
  if (!m.has_extra) return {};
  MaterializedCase& mm = const_cast<MaterializedCase&>(m);
  return used_bytes(m, extra_view(mm));
}

MaterializedCase poison_case(const MaterializedCase& m, int variant) {
  MaterializedCase r = m;
  const uint64_t seed = m.recipe.data_seed ^ static_cast<uint64_t>(variant);
  const std::vector<CacheView> views = caches(r);
  for (size_t c = 0; c < views.size(); ++c) {
    // Both caches (docs/SPEC.md section 8): every byte no valid selected token of that cache uses.
    const CounterRng rng(seed, Stream::kPoison, c == 0 ? 0 : 7);
    const std::vector<uint8_t> used = c == 0 ? used_cache_bytes(m) : used_extra_cache_bytes(m);
    SharedVector<uint8_t>& bytes = views[c].cache->mut();
    fill_poison(variant, rng, bytes.data(), 0, bytes.size(), &used);
  }
  // Head pads, the gap after the last head of a token and after the last token of a batch row:
  // q[i] = poison_bf16(variant, qrng, i) for each i there, range by range.
  const int64_t dqk = m.d_qk();
  const CounterRng qrng(seed, Stream::kPoison, 1);
  const int64_t heads_span = int64_t{m.heads} * m.q_head_stride;
  const int64_t tokens_span = int64_t{m.s_q} * m.q_token_stride;
  const auto q_size = static_cast<int64_t>(r.q.size());
  const auto poison_q = [&](int64_t from, int64_t to) {
    for (int64_t i = std::max<int64_t>(from, 0); i < std::min(to, q_size); ++i) {
      r.q[static_cast<size_t>(i)] = poison_bf16(variant, qrng, static_cast<size_t>(i));
    }
  };
  for (int64_t row = 0; row < q_size; row += m.q_batch_stride) {
    for (int64_t token = row; token < row + tokens_span; token += m.q_token_stride) {
      for (int64_t head = token; head < token + heads_span; head += m.q_head_stride) {
        poison_q(head + dqk, head + m.q_head_stride);
      }
      poison_q(token + heads_span, token + m.q_token_stride);
    }
    poison_q(row + tokens_span, row + m.q_batch_stride);
  }
  // Entries masked by topk_length point at random (poisoned) slots: still in range, so a kernel
  // that loads before masking stays in bounds, but one that ignores topk_length reads poison.
  for (size_t c = 0; c < views.size(); ++c) {
    const CacheView& v = views[c];
    if (v.lengths->empty()) continue;
    CounterRng irng(seed, Stream::kPoison, c == 0 ? 2 : 8);
    const int64_t slots = mla::num_slots(*v.geom);
    for (int32_t b = 0; b < m.batch; ++b) {
      for (int32_t s = 0; s < m.s_q; ++s) {
        int32_t* row = list_of(v, b, s);
        for (int32_t k = std::max(0, list_length(v, b)); k < *v.topk; ++k) {
          row[k] = static_cast<int32_t>(irng.uniform_int(0, slots - 1));
        }
      }
    }
  }
  // The gaps of each index row (of both caches): entries a kernel that honours the index strides
  // and topk never reads. Each variant fills them differently, always with values that change the
  // result if read: the last slot, random slots, slot 0 (valid-looking) or one past the cache.
  for (size_t c = 0; c < views.size(); ++c) {
    const CacheView& v = views[c];
    CounterRng grng(seed, Stream::kPoison, c == 0 ? 14 : 15);
    const int64_t slots = mla::num_slots(*v.geom);
    const int64_t tstride = *v.token_stride, bstride = *v.batch_stride;
    for (int32_t b = 0; b < m.batch; ++b) {
      for (int64_t at = 0; at < bstride; ++at) {
        if (at / tstride < m.s_q && at % tstride < *v.topk) continue;  // an entry, not a gap
        int32_t x = 0;
        switch (variant) {
          case 0:
            x = static_cast<int32_t>(std::max<int64_t>(0, slots - 1));
            break;
          case 1:
            x = static_cast<int32_t>(grng.uniform_int(0, std::max<int64_t>(0, slots - 1)));
            break;
          case 2:
            x = 0;
            break;
          default:
            x = static_cast<int32_t>(std::min<int64_t>(slots, std::numeric_limits<int32_t>::max()));
            break;
        }
        (*v.indices)[static_cast<size_t>(b * bstride + at)] = x;
      }
    }
  }
  return r;
}

namespace {

// An entry past a cache that grows from `old_slots` to `new_slots` (an invalid entry under
// out_of_range) moved as far past the new end, so that it stays invalid and keeps its
// distance from the cache ("num_slots", "num_slots + page_size"); INT_MAX at most.
int32_t past_the_end(int32_t idx, int64_t old_slots, int64_t new_slots) {
  return static_cast<int32_t>(
      std::min<int64_t>(int64_t{idx} - old_slots + new_slots, std::numeric_limits<int32_t>::max()));
}

// The cache's guard bytes (cache_guard_bytes) after its cache_bytes(g), as materialize writes
// them.
void add_guard(SharedVector<uint8_t>& bytes, const mla::CacheGeometry& g,
               const mla::Conventions& conv) {
  bytes.resize(static_cast<size_t>(mla::cache_bytes(g)));
  bytes.resize(bytes.size() + static_cast<size_t>(cache_guard_bytes(g, conv)), uint8_t{0xff});
}

// Relocates the cache of view v (of a copy of a case) whose bytes before were `old` (the
// original case's cache).
void relocate(const CacheView& v, const SharedVector<uint8_t>& old, CounterRng& rng, uint64_t seed,
              uint64_t fill_stream, int64_t stride_multiple, const mla::Conventions& conv) {
  const mla::CacheGeometry g = *v.geom;
  mla::CacheGeometry& ng = *v.geom;
  const int32_t extra = static_cast<int32_t>(rng.uniform_int(0, 2));
  ng.num_pages = g.num_pages + extra;
  const int64_t min_stride = mla::min_page_stride(g);
  switch (rng.uniform_int(0, 2)) {
    case 0:
      ng.page_stride = min_stride;
      break;
    case 1:
      ng.page_stride = min_stride + rng.uniform_int(1, 700);
      break;
    default:  // SGLang-style padding to a multiple of 576 bytes beyond the minimum
      ng.page_stride = (min_stride / 576 + 1 + rng.uniform_int(0, 1)) * 576;
      break;
  }
  if (ng.page_stride == g.page_stride && extra == 0) ng.page_stride += 64;
  // Inside the backend's envelope: a stride it accepts (the smallest multiple at or above).
  if (stride_multiple > 1) {
    ng.page_stride = (ng.page_stride + stride_multiple - 1) / stride_multiple * stride_multiple;
  }
  std::vector<int32_t> perm(static_cast<size_t>(ng.num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  shuffle(perm, rng);
  if (perm.size() > 1 && extra == 0 &&
      std::is_sorted(perm.begin(), perm.end())) {  // make sure the order changes
    std::swap(perm[0], perm[1]);
  }
  // Page perm[p] holds old page p's min_stride bytes; every other byte is random
  // (fill_poison(1) over the whole cache, taken where no page is copied to).
  SharedVector<uint8_t>& bytes = v.cache->replace();
  bytes.assign(static_cast<size_t>(mla::cache_bytes(ng)), 0);
  const CounterRng fill(seed, Stream::kPoison, fill_stream);
  std::vector<uint8_t> holds(static_cast<size_t>(ng.num_pages), 0);
  for (int32_t p = 0; p < g.num_pages; ++p)
    holds[static_cast<size_t>(perm[static_cast<size_t>(p)])] = 1;
  for (int32_t q = 0; q < ng.num_pages; ++q) {
    const auto page = static_cast<size_t>(q) * static_cast<size_t>(ng.page_stride);
    const size_t from =
        page + (holds[static_cast<size_t>(q)] ? static_cast<size_t>(min_stride) : 0);
    fill_poison(1, fill, bytes.data(), from, page + static_cast<size_t>(ng.page_stride), nullptr);
  }
  for (int32_t p = 0; p < g.num_pages; ++p) {
    std::memcpy(bytes.data() + static_cast<int64_t>(perm[static_cast<size_t>(p)]) * ng.page_stride,
                old.data() + static_cast<int64_t>(p) * g.page_stride,
                static_cast<size_t>(min_stride));
  }
  add_guard(bytes, ng, conv);
  // Only slots: the row gaps hold no index (they may be out of range). Entries past the cache
  // (invalid under out_of_range) stay past the grown one.
  const int64_t slots = mla::num_slots(g);
  const bool past_invalid = conv.invalid_index == mla::InvalidIndexRule::kOutOfRange;
  for (int32_t& idx : *v.indices) {
    if (idx >= slots && past_invalid) idx = past_the_end(idx, slots, mla::num_slots(ng));
    if (idx < 0 || idx >= slots) continue;
    idx = perm[static_cast<size_t>(idx / g.page_size)] * g.page_size + idx % g.page_size;
  }
}

}  // namespace

MaterializedCase relocate_pages(const MaterializedCase& m, uint64_t seed, int64_t stride_multiple) {
  MaterializedCase r = m;
  CounterRng rng(seed, Stream::kPoison, 3);
  relocate(main_view(r), m.cache.vec(), rng, seed, 4, stride_multiple, m.conv);
  // The extra cache moves too, with its own permutation and stride.
  if (r.has_extra) {
    relocate(extra_view(r), m.extra_cache.vec(), rng, seed, 9, stride_multiple, m.conv);
  }
  r.recipe.geom = r.geom;
  r.recipe.page_order.clear();
  if (r.recipe.extra) {
    r.recipe.extra->page_stride = r.extra_geom.page_stride;
    r.recipe.extra->num_pages = r.extra_geom.num_pages;
    r.recipe.extra->page_order.clear();
  }
  return r;
}

namespace {

// Batch row b of a [B, batch_stride] buffer of s_q tokens `token_stride` apart: token s only
// (every token when s < 0), then the row's gap (the elements after its last token).
template <typename Vec>  // std::vector or SharedVector
Vec row_tokens(const Vec& v, int64_t b, int s, int32_t s_q, int64_t token_stride,
               int64_t batch_stride) {
  Vec out;
  const auto row = v.begin() + b * batch_stride;
  for (int32_t t = s < 0 ? 0 : s; t < (s < 0 ? s_q : s + 1); ++t) {
    out.insert(out.end(), row + t * token_stride, row + (t + 1) * token_stride);
  }
  out.insert(out.end(), row + s_q * token_stride, row + batch_stride);
  return out;
}

// The batch stride of a row of `tokens` tokens keeping the row gap of m's rows.
int64_t kept_gap(int64_t batch_stride, int64_t token_stride, int32_t s_q, int32_t tokens) {
  return batch_stride - (s_q - tokens) * token_stride;
}

// Batch row b (and only token s when s >= 0) of m, alone.
MaterializedCase alone_case(const MaterializedCase& m, int b, int s) {
  MaterializedCase r = m;
  r.batch = 1;
  r.s_q = s < 0 ? m.s_q : 1;
  // The row with its gaps: the token strides and row pads stay the case's.
  r.q = row_tokens(m.q, b, s, m.s_q, m.q_token_stride, m.q_batch_stride);
  r.q_batch_stride = kept_gap(m.q_batch_stride, m.q_token_stride, m.s_q, r.s_q);
  r.indices = row_tokens(m.indices, b, s, m.s_q, m.indices_token_stride, m.indices_batch_stride);
  r.indices_batch_stride = kept_gap(m.indices_batch_stride, m.indices_token_stride, m.s_q, r.s_q);
  r.out_batch_stride = kept_gap(m.out_batch_stride, m.out_token_stride, m.s_q, r.s_q);
  r.lse_batch_stride = kept_gap(m.lse_batch_stride, m.lse_token_stride, m.s_q, r.s_q);
  if (!m.topk_length.empty()) r.topk_length = {m.topk_length[static_cast<size_t>(b)]};
  if (r.recipe.topk_length) r.recipe.topk_length = r.topk_length;
  if (m.has_extra) {
    r.extra_indices = row_tokens(m.extra_indices, b, s, m.s_q, m.extra_indices_token_stride,
                                 m.extra_indices_batch_stride);
    r.extra_indices_batch_stride =
        kept_gap(m.extra_indices_batch_stride, m.extra_indices_token_stride, m.s_q, r.s_q);
    if (!m.extra_topk_length.empty()) {
      r.extra_topk_length = {m.extra_topk_length[static_cast<size_t>(b)]};
    }
    if (r.recipe.extra && r.recipe.extra->topk_length) {
      r.recipe.extra->topk_length = r.extra_topk_length;
    }
  }
  // The recipe draws the buffer's q.
  Case::QSource qs = q_source_of_rows(m.recipe, {b});
  if (s >= 0) {
    Case tmp = m.recipe;
    tmp.q_source = qs;
    qs = q_source_of_tokens(tmp, {s});
  }
  r.recipe.q_source = qs;
  r.recipe.s_q = r.s_q;
  set_shape(r);
  return r;
}

}  // namespace

MaterializedCase batch_alone(const MaterializedCase& m, int b) { return alone_case(m, b, -1); }

MaterializedCase query_alone(const MaterializedCase& m, int b, int s) {
  return alone_case(m, b, s);
}

MaterializedCase head_alone(const MaterializedCase& m, int h) {
  MaterializedCase r = m;
  r.heads = 1;
  // The batch rows keep their gaps (pads after the last token); a token is one head now.
  const int64_t q_gap = m.q_batch_stride - m.s_q * m.q_token_stride;
  r.q_token_stride = m.q_head_stride;
  r.q_batch_stride = m.s_q * r.q_token_stride + q_gap;
  r.out_token_stride = m.out_head_stride;
  r.out_batch_stride =
      m.s_q * r.out_token_stride + (m.out_batch_stride - m.s_q * m.out_token_stride);
  r.lse_token_stride = 1;
  r.lse_batch_stride = m.s_q + (m.lse_batch_stride - m.s_q * m.lse_token_stride);
  r.q.clear();
  for (int32_t b = 0; b < m.batch; ++b) {
    const auto row = m.q.begin() + b * m.q_batch_stride;
    for (int32_t s = 0; s < m.s_q; ++s) {
      const auto from = row + s * m.q_token_stride + static_cast<int64_t>(h) * m.q_head_stride;
      r.q.insert(r.q.end(), from, from + m.q_head_stride);
    }
    r.q.insert(r.q.end(), row + m.s_q * m.q_token_stride, row + m.q_batch_stride);
  }
  if (!m.sink.empty()) r.sink = {m.sink[static_cast<size_t>(h)]};
  if (r.recipe.sink) r.recipe.sink = std::vector<double>{(*m.recipe.sink)[static_cast<size_t>(h)]};
  r.recipe.q_source = q_source_of_heads(m.recipe, {h});  // the recipe draws the buffer's q
  set_shape(r);
  return r;
}

MaterializedCase permute_indices(const MaterializedCase& m, uint64_t seed) {
  MaterializedCase r = m;
  CounterRng rng(seed, Stream::kPoison, 5);
  for (const CacheView& v : caches(r)) {
    for (int32_t b = 0; b < m.batch; ++b) {
      const int32_t topk = *v.topk;
      const int32_t len = list_length(v, b) < 0 ? topk : std::min(list_length(v, b), topk);
      for (int32_t s = 0; s < m.s_q; ++s) {
        int32_t* row = list_of(v, b, s);
        std::vector<int32_t> head(row, row + len), tail(row + len, row + topk);
        shuffle(head, rng);
        shuffle(tail, rng);
        std::copy(head.begin(), head.end(), row);
        std::copy(tail.begin(), tail.end(), row + len);
      }
    }
  }
  set_shape(r);
  return r;
}

MaterializedCase insert_invalid(const MaterializedCase& m, uint64_t seed, int count) {
  MaterializedCase r = m;
  CounterRng rng(seed, Stream::kPoison, 6);
  r.topk = m.topk + count;
  // The token and row gaps keep their sizes.
  const int64_t row_gap = m.indices_batch_stride - m.s_q * m.indices_token_stride;
  r.indices_token_stride = m.indices_token_stride + count;
  r.indices_batch_stride = m.s_q * r.indices_token_stride + row_gap;
  r.indices.clear();
  for (int32_t b = 0; b < m.batch; ++b) {
    const int32_t len =
        row_length(m, b) < 0 ? m.topk : std::max(0, std::min(row_length(m, b), m.topk));
    for (int32_t s = 0; s < m.s_q; ++s) {
      const int32_t* from =
          m.indices.data() + b * m.indices_batch_stride + s * m.indices_token_stride;
      std::vector<int32_t> row(from, from + m.topk);
      for (int i = 0; i < count; ++i) {
        // Within the prefix that topk_length keeps (positions 0..len+i).
        const auto pos = rng.uniform_int(0, len + i);
        row.insert(row.begin() + pos, -1);
      }
      r.indices.insert(r.indices.end(), row.begin(), row.end());
      r.indices.insert(r.indices.end(), from + m.topk, from + m.indices_token_stride);
    }
    const int32_t* gap =
        m.indices.data() + b * m.indices_batch_stride + m.s_q * m.indices_token_stride;
    r.indices.insert(r.indices.end(), gap, gap + row_gap);
    if (!r.topk_length.empty() && m.topk_length[static_cast<size_t>(b)] >= 0) {
      r.topk_length[static_cast<size_t>(b)] = len + count;
    }
  }
  if (r.recipe.topk_length) r.recipe.topk_length = r.topk_length;
  set_shape(r);
  return r;
}

namespace {

// Gives r a new, empty extra cache of its main cache's geometry with its own page size (drawn
// from rng).
void add_empty_extra_cache(MaterializedCase& r, CounterRng& rng) {
  r.has_extra = true;
  r.extra_geom = r.geom;
  r.extra_geom.page_size = static_cast<int32_t>(rng.uniform_int(1, 64));
  r.extra_geom.num_pages = 0;
  r.extra_geom.page_stride = mla::min_page_stride(r.extra_geom);
  r.extra_cache.clear();
  r.extra_topk = 0;
  r.extra_indices.clear();
  r.extra_topk_length.clear();
}

// Appends to r's extra cache the pages that hold `tokens` more tokens, their bytes poison (the
// fill stream of seed), and puts the guard back after them.
void add_extra_pages(MaterializedCase& r, uint64_t seed, int64_t tokens) {
  const mla::CacheGeometry old_extra = r.extra_geom;
  r.extra_geom.num_pages =
      old_extra.num_pages +
      static_cast<int32_t>((tokens + old_extra.page_size - 1) / old_extra.page_size);
  const size_t old_bytes = static_cast<size_t>(mla::cache_bytes(old_extra));
  SharedVector<uint8_t>& bytes = r.extra_cache.mut();
  bytes.resize(old_bytes);  // without its guard: the new pages come after the old ones
  bytes.resize(static_cast<size_t>(mla::cache_bytes(r.extra_geom)), 0);
  const CounterRng fill(seed, Stream::kPoison, 11);
  fill_poison(1, fill, bytes.data(), old_bytes, bytes.size(), nullptr);
  add_guard(bytes, r.extra_geom, r.conv);
}

// The recipe's extra cache from r's.
void set_extra_recipe(MaterializedCase& r) {
  r.recipe.extra = ExtraCache{};
  r.recipe.extra->page_size = r.extra_geom.page_size;
  r.recipe.extra->page_stride = r.extra_geom.page_stride;
  r.recipe.extra->num_pages = r.extra_geom.num_pages;
  r.recipe.extra->topk = r.extra_topk;
  if (!r.extra_topk_length.empty()) r.recipe.extra->topk_length = r.extra_topk_length;
}

}  // namespace

int move_to_extra_topk(const MaterializedCase& m, int count) {
  return (m.has_extra ? m.extra_topk : 0) + count;
}

MaterializedCase move_to_extra(const MaterializedCase& m, uint64_t seed, int count) {
  MaterializedCase r = m;
  CounterRng rng(seed, Stream::kPoison, 10);
  if (!r.has_extra) add_empty_extra_cache(r, rng);
  // New pages after the extra cache's own hold a copy of every moved token.
  const int64_t base_slot = mla::num_slots(r.extra_geom);
  add_extra_pages(r, seed, int64_t{m.query_rows()} * count);
  uint8_t* const extra_bytes = r.extra_cache.mut().data();  // r's own since add_extra_pages
  const bool past_invalid = m.conv.invalid_index == mla::InvalidIndexRule::kOutOfRange;
  const int64_t main_slots = mla::num_slots(m.geom);
  int64_t next_slot = base_slot;
  const int64_t row_pad = m.indices_batch_stride - int64_t{m.s_q} * m.indices_token_stride;
  const int32_t old_topk = r.extra_topk;
  std::vector<int32_t> new_extra;
  r.extra_topk = move_to_extra_topk(m, count);
  for (int32_t b = 0; b < m.batch; ++b) {
    const int32_t len = row_length(m, b) < 0 ? m.topk : std::min(row_length(m, b), m.topk);
    const int32_t elen = r.extra_topk_length.empty()
                             ? old_topk
                             : std::min(r.extra_topk_length[static_cast<size_t>(b)], old_topk);
    for (int32_t s = 0; s < m.s_q; ++s) {
      int32_t* mrow = r.indices.data() + b * r.indices_batch_stride + s * r.indices_token_stride;
      std::vector<int32_t> valid;
      for (int32_t k = 0; k < len; ++k) {
        if (mla::index_valid_in(mrow[k], k, -1, m.conv, main_slots)) valid.push_back(k);
      }
      shuffle(valid, rng);
      std::vector<int32_t> erow;
      if (old_topk > 0) {
        const int32_t* from = m.extra_indices.data() + b * m.extra_indices_batch_stride +
                              s * m.extra_indices_token_stride;
        erow.assign(from, from + old_topk);
        // Entries past the old extra cache stay past the grown one.
        for (int32_t& e : erow) {
          if (past_invalid && e >= base_slot) {
            e = past_the_end(e, base_slot, mla::num_slots(r.extra_geom));
          }
        }
      }
      for (int i = 0; i < count; ++i) {
        int32_t entry = -1;
        if (i < static_cast<int>(valid.size())) {
          const int32_t k = valid[static_cast<size_t>(i)];
          copy_token(m.geom, m.cache.data(), mrow[k], r.extra_geom, extra_bytes, next_slot);
          entry = static_cast<int32_t>(next_slot++);
          mrow[k] = -1;  // invalid under both conventions
        }
        // Inside the prefix the extra topk_length keeps (it grows by count).
        const auto pos = rng.uniform_int(0, elen + i);
        erow.insert(erow.begin() + pos, entry);
      }
      new_extra.insert(new_extra.end(), erow.begin(), erow.end());
    }
    // The row gap of the main lists (indices_row_pad) after the extra lists too (-1: no slot).
    new_extra.insert(new_extra.end(), static_cast<size_t>(row_pad), -1);
    if (!r.extra_topk_length.empty()) r.extra_topk_length[static_cast<size_t>(b)] = elen + count;
  }
  r.extra_indices = std::move(new_extra);
  // The main lists keep their layout; the extra lists are contiguous per token.
  r.extra_indices_token_stride = r.extra_topk;
  r.extra_indices_batch_stride = int64_t{m.s_q} * r.extra_topk + row_pad;
  set_extra_recipe(r);
  set_shape(r);
  return r;
}

MaterializedCase swap_caches(const MaterializedCase& m) {
  MaterializedCase r = m;
  if (!m.has_extra) return r;
  std::swap(r.geom, r.extra_geom);
  std::swap(r.cache, r.extra_cache);
  std::swap(r.indices, r.extra_indices);
  std::swap(r.topk_length, r.extra_topk_length);
  std::swap(r.topk, r.extra_topk);
  std::swap(r.indices_token_stride, r.extra_indices_token_stride);
  std::swap(r.indices_batch_stride, r.extra_indices_batch_stride);
  r.recipe.geom = r.geom;
  r.recipe.page_order.clear();
  r.recipe.topk_length =
      r.topk_length.empty() ? std::nullopt : std::optional<std::vector<int32_t>>(r.topk_length);
  ExtraCache e;
  e.page_size = r.extra_geom.page_size;
  e.page_stride = r.extra_geom.page_stride;
  e.num_pages = r.extra_geom.num_pages;
  e.topk = r.extra_topk;
  if (!r.extra_topk_length.empty()) e.topk_length = r.extra_topk_length;
  r.recipe.extra = e;
  set_shape(r);
  return r;
}

namespace {

// Position of element `flat` of a raw guarded buffer: [B, batch_stride] rows of s_q tokens
// `token_stride` apart, each of `heads` heads `head_stride` apart, after `guard` canaries; the
// rest of a row (or token) is its gap. b is the query row b * s_q + s.
struct RawPos {
  bool guard = false;  // guard band before or after the body
  bool gap = false;    // a head pad or a token/row gap
  int64_t b = -1, h = -1, d = -1;
};

RawPos raw_pos(int64_t flat, int32_t heads, int64_t head_stride, int64_t token_stride, int32_t s_q,
               int64_t batch_stride, int64_t guard, int64_t rows, int64_t width) {
  RawPos p;
  const int64_t rel = flat - guard;
  if (rel < 0 || rel >= rows * batch_stride) {
    p.guard = true;
    return p;
  }
  const int64_t in_row = rel % batch_stride;
  const int64_t s = std::min<int64_t>(in_row / token_stride, s_q);
  p.b = rel / batch_stride * s_q + std::min<int64_t>(s, s_q - 1);
  const int64_t in_token = in_row - std::min<int64_t>(s, s_q - 1) * token_stride;
  p.h = in_token / head_stride;
  p.d = in_token % head_stride;
  p.gap = s >= s_q || p.h >= heads || p.d >= width;
  return p;
}

std::string raw_name(const RawPos& p, int64_t flat, const char* what, bool with_d) {
  if (p.guard) return fmt::format("{} guard band [{}]", what, flat);
  if (p.h >= 0 && p.gap && !with_d) return fmt::format("{} row gap [b={},{}]", what, p.b, p.h);
  if (p.gap) return fmt::format("{} gap [b={},h={},d={}]", what, p.b, p.h, p.d);
  if (!with_d) return fmt::format("{}[b={},h={}]", what, p.b, p.h);
  return fmt::format("{}[b={},h={},d={}]", what, p.b, p.h, p.d);
}

std::string ulp_text(int64_t distance) {
  return distance < 0 ? std::string("NaN") : std::to_string(distance);
}

// "x vs y, N ulp (fmt)": both values with all their digits and bits.
std::string bf16_pair(uint16_t x, uint16_t y) {
  return fmt::format("{} vs {}, {} ulp (bf16)", format_bf16_bits(x), format_bf16_bits(y),
                     ulp_text(ulp_distance_bf16(x, y)));
}

std::string fp32_pair(uint32_t x, uint32_t y) {
  return fmt::format("{} vs {}, {} ulp (fp32)", format_fp32_bits(x), format_fp32_bits(y),
                     ulp_text(ulp_distance_fp32(x, y)));
}

// A widened pair: the format it was produced in when exact there, else float64.
std::string widened_pair(double x, double y, ValueFormat f) {
  if (f == ValueFormat::kBf16) {
    return bf16_pair(mla::float_to_bf16(static_cast<float>(x)),
                     mla::float_to_bf16(static_cast<float>(y)));
  }
  if (f == ValueFormat::kFp32) {
    return fp32_pair(mla::float_to_bits(static_cast<float>(x)),
                     mla::float_to_bits(static_cast<float>(y)));
  }
  return fmt::format("{} vs {}", format_value(x, ValueFormat::kFp64),
                     format_value(y, ValueFormat::kFp64));
}

// The format a widened value came from: bf16 (out) or fp32 (lse) when it is exact there.
ValueFormat exact_format(double x, double y, ValueFormat narrow) {
  auto fits = [&](double v) {
    if (std::isnan(v)) return true;
    const float f = static_cast<float>(v);
    if (static_cast<double>(f) != v) return false;
    return narrow != ValueFormat::kBf16 ||
           static_cast<double>(mla::bf16_to_float(mla::float_to_bf16(f))) == v;
  };
  return fits(x) && fits(y) ? narrow : ValueFormat::kFp64;
}

// Bitwise equality as the bitwise properties mean it: NaNs of any sign or payload are equal (the
// NaN is what matters, not its bits), everything else compares bit for bit.
constexpr const char* kNanNote = "; NaNs of any sign or payload count as equal";
bool same_bf16(uint16_t x, uint16_t y) {
  return x == y || ((x & 0x7fffu) > 0x7f80u && (y & 0x7fffu) > 0x7f80u);
}
bool same_fp32(uint32_t x, uint32_t y) {
  return x == y || ((x & 0x7fffffffu) > 0x7f800000u && (y & 0x7fffffffu) > 0x7f800000u);
}
bool same_fp64(double x, double y) {
  return std::bit_cast<uint64_t>(x) == std::bit_cast<uint64_t>(y) ||
         (std::isnan(x) && std::isnan(y));
}

// Whether two vectors of the same size hold the same bytes.
template <typename V>
bool same_bytes(const V& x, const V& y) {
  return x.size() == y.size() &&
         (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0);
}

}  // namespace

bool bitwise_equal(const MaterializedCase& m, const RunResult& a, const RunResult& b,
                   std::string* where, int* wb, int* wh, int* wd) {
  auto set = [&](int64_t bb, int64_t hh, int64_t dd) {
    if (wb) *wb = static_cast<int>(bb);
    if (wh) *wh = static_cast<int>(hh);
    if (wd) *wd = static_cast<int>(dd);
  };
  if (!a.out_raw.empty() && !b.out_raw.empty()) {
    if (a.out_raw.size() != b.out_raw.size() || a.lse_raw.size() != b.lse_raw.size()) {
      *where = "raw output sizes differ";
      return false;
    }
    // Identical bytes: equal (the element loops below look for the first difference).
    if (same_bytes(a.out_raw, b.out_raw) && same_bytes(a.lse_raw, b.lse_raw)) return true;
    const int64_t g = OutputBuffers::kGuard;
    for (size_t i = 0; i < a.out_raw.size(); ++i) {
      if (!same_bf16(a.out_raw[i], b.out_raw[i])) {
        const RawPos p =
            raw_pos(static_cast<int64_t>(i), m.heads, m.out_head_stride, m.out_token_stride, m.s_q,
                    m.out_batch_stride, g, m.batch, m.d_v());
        *where = raw_name(p, static_cast<int64_t>(i), "out", true) + " " +
                 bf16_pair(a.out_raw[i], b.out_raw[i]) + kNanNote;
        if (!p.guard && !p.gap) set(p.b, p.h, p.d);
        return false;
      }
    }
    for (size_t i = 0; i < a.lse_raw.size(); ++i) {
      const uint32_t x = std::bit_cast<uint32_t>(a.lse_raw[i]);
      const uint32_t y = std::bit_cast<uint32_t>(b.lse_raw[i]);
      if (!same_fp32(x, y)) {
        const RawPos p = raw_pos(static_cast<int64_t>(i), m.heads, 1, m.lse_token_stride, m.s_q,
                                 m.lse_batch_stride, g, m.batch, 1);
        *where =
            raw_name(p, static_cast<int64_t>(i), "lse", false) + " " + fp32_pair(x, y) + kNanNote;
        if (!p.guard && !p.gap) set(p.b, p.h, -1);
        return false;
      }
    }
    return true;
  }
  if (a.out.size() != b.out.size() || a.lse.size() != b.lse.size()) {
    *where = "output sizes differ";
    return false;
  }
  if (same_bytes(a.out, b.out) && same_bytes(a.lse, b.lse)) return true;
  const int32_t dv = m.d_v();
  for (size_t i = 0; i < a.out.size(); ++i) {
    if (!same_fp64(a.out[i], b.out[i])) {
      const auto row = static_cast<int64_t>(i) / dv;
      *where = fmt::format("out[b={},h={},d={}] ", row / m.heads, row % m.heads, i % dv) +
               widened_pair(a.out[i], b.out[i], ValueFormat::kFp64) + kNanNote;
      set(row / m.heads, row % m.heads, static_cast<int64_t>(i % dv));
      return false;
    }
  }
  for (size_t i = 0; i < a.lse.size(); ++i) {
    if (!same_fp64(a.lse[i], b.lse[i])) {
      *where = fmt::format("lse[b={},h={}] ", i / m.heads, i % m.heads) +
               widened_pair(a.lse[i], b.lse[i], ValueFormat::kFp64) + kNanNote;
      set(static_cast<int64_t>(i / m.heads), static_cast<int64_t>(i % m.heads), -1);
      return false;
    }
  }
  return true;
}

bool rows_bitwise_equal(const RunResult& whole, int32_t heads, int32_t d_v, int b_whole,
                        int h_whole, const RunResult& part, int part_row, std::string* where) {
  const size_t wr = static_cast<size_t>(b_whole) * heads + h_whole;
  const auto pr = static_cast<size_t>(part_row);
  for (int32_t d = 0; d < d_v; ++d) {
    const double x = whole.out[wr * d_v + d], y = part.out[pr * d_v + d];
    if (!same_fp64(x, y)) {
      *where = fmt::format("out[b={},h={},d={}] ", b_whole, h_whole, d) +
               widened_pair(x, y, exact_format(x, y, ValueFormat::kBf16)) + " (full case vs alone" +
               kNanNote + ")";
      return false;
    }
  }
  const double x = whole.lse[wr], y = part.lse[pr];
  if (!same_fp64(x, y)) {
    *where = fmt::format("lse[b={},h={}] ", b_whole, h_whole) +
             widened_pair(x, y, exact_format(x, y, ValueFormat::kFp32)) + " (full case vs alone" +
             kNanNote + ")";
    return false;
  }
  return true;
}

}  // namespace mlafuzz
