// Recipe edits shared by shrinking and the canonical walk (see case_edits.h).
#include "properties/case_edits.h"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <set>

namespace mlafuzz::edits {

int32_t row_len(const Case& c, int q) {
  return c.topk_length ? (*c.topk_length)[static_cast<size_t>(q / c.s_q)] : -1;
}

bool entry_valid(const Case& c, int q, int k) {
  return mla::index_valid_in(c.indices[static_cast<size_t>(q)][static_cast<size_t>(k)], k,
                             row_len(c, q), c.conventions, mla::num_slots(c.geom));
}

bool extra_entry_valid(const Case& c, int q, int k) {
  const ExtraCache& e = *c.extra;
  const int32_t len = e.topk_length ? (*e.topk_length)[static_cast<size_t>(q / c.s_q)] : -1;
  return mla::index_valid_in(e.indices[static_cast<size_t>(q)][static_cast<size_t>(k)], k, len,
                             c.conventions, mla::num_slots(c.extra_geom()));
}

std::vector<int> all_of(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

std::vector<std::vector<int>> subsets(int n, int cap) {
  std::vector<std::vector<int>> out;
  if (n <= 1) return out;
  std::vector<int> lo(static_cast<size_t>(n / 2)), hi(static_cast<size_t>(n - n / 2));
  std::iota(lo.begin(), lo.end(), 0);
  std::iota(hi.begin(), hi.end(), n / 2);
  out.push_back(lo);
  out.push_back(hi);
  for (int i = 0; i < std::min(n, cap); ++i) out.push_back({i});
  return out;
}

std::vector<std::vector<int>> all_but_one(int n, int cap) {
  std::vector<std::vector<int>> out;
  if (n <= 2 || n > cap) return out;  // n = 2: the single items of subsets() already
  for (int drop = 0; drop < n; ++drop) {
    std::vector<int> keep;
    for (int i = 0; i < n; ++i) {
      if (i != drop) keep.push_back(i);
    }
    out.push_back(std::move(keep));
  }
  return out;
}

namespace {

std::vector<int32_t> pick_lengths(const std::vector<int32_t>& len, const std::vector<int>& rows) {
  std::vector<int32_t> v;
  for (int b : rows) v.push_back(len[static_cast<size_t>(b)]);
  return v;
}

// The lists of batch rows `rows` (all their query tokens, or `tokens` of each).
std::vector<std::vector<int32_t>> pick_lists(const std::vector<std::vector<int32_t>>& lists,
                                             int32_t s_q, const std::vector<int>& rows,
                                             const std::vector<int>& tokens) {
  std::vector<std::vector<int32_t>> v;
  for (int b : rows) {
    for (int s : tokens) v.push_back(lists[static_cast<size_t>(b * s_q + s)]);
  }
  return v;
}

}  // namespace

Case select_rows(const Case& c, const std::vector<int>& rows) {
  Case r = c;
  r.batch = static_cast<int32_t>(rows.size());
  r.indices = pick_lists(c.indices, c.s_q, rows, all_of(c.s_q));
  if (c.topk_length) r.topk_length = pick_lengths(*c.topk_length, rows);
  if (c.extra) {
    r.extra->indices = pick_lists(c.extra->indices, c.s_q, rows, all_of(c.s_q));
    if (c.extra->topk_length) r.extra->topk_length = pick_lengths(*c.extra->topk_length, rows);
  }
  r.q_source = q_source_of_rows(c, rows);
  return r;
}

Case select_tokens(const Case& c, const std::vector<int>& tokens) {
  Case r = c;
  r.s_q = static_cast<int32_t>(tokens.size());
  r.indices = pick_lists(c.indices, c.s_q, all_of(c.batch), tokens);
  if (c.extra) r.extra->indices = pick_lists(c.extra->indices, c.s_q, all_of(c.batch), tokens);
  r.q_source = q_source_of_tokens(c, tokens);
  return r;
}

Case select_heads(const Case& c, const std::vector<int>& heads) {
  Case r = c;
  r.heads = static_cast<int32_t>(heads.size());
  if (c.sink) {
    std::vector<double> s;
    for (int h : heads) s.push_back((*c.sink)[static_cast<size_t>(h)]);
    r.sink = s;
  }
  r.q_source = q_source_of_heads(c, heads);
  return r;
}

Case select_positions(const Case& c, const std::vector<int>& pos) {
  Case r = c;
  r.topk = static_cast<int32_t>(pos.size());
  for (int32_t q = 0; q < c.query_rows(); ++q) {
    std::vector<int32_t> row;
    int32_t len = 0;
    for (int k : pos) {
      row.push_back(c.indices[static_cast<size_t>(q)][static_cast<size_t>(k)]);
      if (k < row_len(c, q)) ++len;
    }
    r.indices[static_cast<size_t>(q)] = row;
    if (c.topk_length) (*r.topk_length)[static_cast<size_t>(q / c.s_q)] = len;
  }
  return r;
}

int32_t past_end(int32_t v, int64_t slots, int64_t new_slots) {
  return static_cast<int32_t>(
      std::min<int64_t>(int64_t{v} - slots + new_slots, std::numeric_limits<int32_t>::max()));
}

std::vector<Case> default_conventions(const Case& c) {
  std::vector<Case> out;
  Case r = c;
  r.conventions.invalid_index = mla::InvalidIndexRule::kMinusOneOnly;
  if (c.conventions.invalid_index == mla::InvalidIndexRule::kOutOfRange) {
    // Its invalid entries (negatives, entries past the cache) become -1.
    for (auto* lists : {&r.indices, r.extra ? &r.extra->indices : nullptr}) {
      if (lists == nullptr) continue;
      const int64_t slots = mla::num_slots(lists == &r.indices ? r.geom : r.extra_geom());
      for (auto& row : *lists) {
        for (int32_t& v : row) {
          if (v < 0 || v >= slots) v = -1;
        }
      }
    }
  }
  if (r.conventions.invalid_index != c.conventions.invalid_index) out.push_back(r);
  r = c;
  r.conventions.empty_lse = mla::EmptyRowLse::kPosInf;
  if (r.conventions.empty_lse != c.conventions.empty_lse) out.push_back(r);
  r = c;
  r.conventions.sink_in_lse = false;
  if (c.conventions.sink_in_lse) out.push_back(r);
  return out;
}

Case without_topk_length(const Case& c) {
  Case r = c;
  if (!c.topk_length) return r;
  for (int32_t q = 0; q < c.query_rows(); ++q) {
    for (int32_t k = std::max(0, row_len(c, q)); k < c.topk; ++k) {
      r.indices[static_cast<size_t>(q)][static_cast<size_t>(k)] = -1;
    }
  }
  r.topk_length.reset();
  return r;
}

std::optional<Case> compact_pages(const Case& c) {
  const int32_t P = c.geom.page_size;
  const int64_t slots = mla::num_slots(c.geom);
  std::map<int32_t, int32_t> used;  // logical page -> new logical page
  for (const auto& row : c.indices) {
    for (int32_t v : row) {
      if (v >= 0 && v < slots) used[v / P] = 0;
    }
  }
  const auto n_used = static_cast<int32_t>(used.size());
  if (n_used == 0 && c.geom.num_pages > 1) {
    Case r = c;
    r.geom.num_pages = 1;
    r.page_order.clear();
    return r;
  }
  if (n_used == 0 || n_used >= c.geom.num_pages) return std::nullopt;
  // New pages keep the relative physical order of the old ones.
  std::vector<std::pair<int32_t, int32_t>> phys;  // (old physical, old logical)
  for (auto& [lp, np] : used) {
    phys.push_back({c.page_order.empty() ? lp : c.page_order[static_cast<size_t>(lp)], lp});
  }
  int32_t next = 0;
  for (auto& [lp, np] : used) np = next++;
  std::sort(phys.begin(), phys.end());
  Case r = c;
  r.geom.num_pages = n_used;
  if (!c.page_order.empty()) {
    r.page_order.assign(static_cast<size_t>(n_used), 0);
    for (int32_t rank = 0; rank < n_used; ++rank) {
      r.page_order[static_cast<size_t>(used[phys[static_cast<size_t>(rank)].second])] = rank;
    }
  }
  for (auto& row : r.indices) {
    for (int32_t& v : row) {
      if (v >= slots) {
        v = past_end(v, slots, mla::num_slots(r.geom));
      } else if (v >= 0) {
        v = used[v / P] * P + v % P;
      }
    }
  }
  return r;
}

std::optional<Case> swapped_caches(const Case& c) {
  if (!c.extra) return std::nullopt;
  Case r = c;
  ExtraCache& e = *r.extra;
  std::swap(r.geom.page_size, e.page_size);
  std::swap(r.geom.page_stride, e.page_stride);
  std::swap(r.geom.num_pages, e.num_pages);
  std::swap(r.page_order, e.page_order);
  std::swap(r.topk, e.topk);
  std::swap(r.indices, e.indices);
  std::swap(r.topk_length, e.topk_length);
  e.same_values = false;
  return r;
}

int64_t stride_padding(const mla::CacheGeometry& g) {
  return g.page_stride == 0 ? 0 : std::max<int64_t>(0, g.page_stride - mla::min_page_stride(g));
}

namespace {

// g.page_stride set to g's minimum plus `padding` (0 stays "the minimum").
void set_padding(mla::CacheGeometry& g, int64_t padding) {
  g.page_stride = 0;
  if (padding > 0) g.page_stride = mla::min_page_stride(g) + padding;
}

}  // namespace

Case with_dims(const Case& c, mla::Layout layout, int32_t nope, int32_t rope) {
  Case r = c;
  const int64_t pad = stride_padding(c.geom);
  r.geom.layout = layout;
  r.geom.scale_tile = layout == mla::Layout::kModel1 ? 64 : 128;
  r.geom.nope_dim = nope;
  r.geom.rope_dim = rope;
  set_padding(r.geom, pad);
  if (c.extra) {
    const int64_t extra_pad = stride_padding(c.extra_geom());
    mla::CacheGeometry eg = r.extra_geom();
    set_padding(eg, extra_pad);
    r.extra->page_stride = eg.page_stride;
  }
  return r;
}

std::optional<Case> with_page_size(const Case& c, int32_t page_size) {
  if (!c.page_order.empty() || page_size <= 0) return std::nullopt;
  Case r = c;
  const int32_t P = c.geom.page_size;
  const int64_t slots = mla::num_slots(c.geom);
  int64_t largest = 0;
  std::vector<int32_t*> past;  // entries past the old cache's end
  for (auto& row : r.indices) {
    for (int32_t& v : row) {
      if (v < 0) continue;
      if (v >= slots) {
        past.push_back(&v);
        continue;
      }
      // The same page; the same slot, the last slot staying the last, clamped to the page.
      const int32_t page = v / P, slot = v % P;
      const int32_t to = slot == P - 1 && P > 1 ? page_size - 1 : std::min(slot, page_size - 1);
      v = page * page_size + to;
      largest = std::max<int64_t>(largest, v);
    }
  }
  const int64_t pad = stride_padding(c.geom);
  r.geom.page_size = page_size;
  r.geom.num_pages = static_cast<int32_t>(std::max<int64_t>(1, largest / page_size + 1));
  set_padding(r.geom, pad);
  // Entries past the cache (out_of_range's invalid ones) keep their distance past its end; an
  // entry moved above is in the new cache whatever its number.
  for (int32_t* v : past) *v = past_end(*v, slots, mla::num_slots(r.geom));
  return r;
}

int32_t unused_token(const Case& c) {
  std::set<int32_t> used;
  for (const auto& row : c.indices) {
    for (int32_t v : row) {
      if (v >= 0) used.insert(v);
    }
  }
  const int64_t slots = mla::num_slots(c.geom);
  for (int64_t t = 0; t < slots; ++t) {
    if (used.count(static_cast<int32_t>(t)) == 0) return static_cast<int32_t>(t);
  }
  return -1;
}

// The extra cache (docs/SPEC.md section 8): gone, or simpler.
std::vector<Case> simpler_extra(const Case& c) {
  std::vector<Case> out;
  if (!c.extra) return out;
  Case none = c;
  none.extra.reset();
  out.push_back(none);
  const ExtraCache& e = *c.extra;
  if (e.topk_length) {
    Case r = c;
    // Entries the length masked become -1: the same tokens stay selected.
    for (int32_t q = 0; q < c.query_rows(); ++q) {
      auto& row = r.extra->indices[static_cast<size_t>(q)];
      const int32_t len = (*e.topk_length)[static_cast<size_t>(q / c.s_q)];
      for (int32_t k = std::max(0, len); k < e.topk; ++k) row[static_cast<size_t>(k)] = -1;
    }
    r.extra->topk_length.reset();
    out.push_back(r);
  }
  if (e.topk > 1) {  // the first and the second half of every extra list
    for (int half = 0; half < 2; ++half) {
      Case r = c;
      const int32_t lo = half == 0 ? 0 : e.topk / 2, hi = half == 0 ? e.topk / 2 : e.topk;
      r.extra->topk = hi - lo;
      for (auto& row : r.extra->indices) {
        row = std::vector<int32_t>(row.begin() + lo, row.begin() + hi);
      }
      if (e.topk_length) {
        for (auto& l : *r.extra->topk_length) l = std::clamp(l - lo, 0, hi - lo);
      }
      out.push_back(r);
    }
  }
  if (!e.page_order.empty()) {
    // The identity order: every extra token on its logical page, or moved to the physical page
    // it had (the same pages and slots in memory, as the main cache's page-order move).
    Case r = c;
    r.extra->page_order.clear();
    out.push_back(r);
    const int32_t P = e.page_size;
    const int64_t slots = int64_t{P} * e.num_pages;
    for (auto& row : r.extra->indices) {
      for (int32_t& v : row) {
        if (v >= 0 && v < slots) v = e.page_order[static_cast<size_t>(v / P)] * P + v % P;
      }
    }
    if (r.extra->indices != c.extra->indices) out.push_back(std::move(r));
  }
  if (e.page_stride != 0) {
    Case r = c;
    r.extra->page_stride = 0;
    out.push_back(r);
  }
  if (e.same_values) {
    Case r = c;
    r.extra->same_values = false;
    out.push_back(r);
  }
  return out;
}

std::vector<Case> fewer_tokens(const Case& c) {
  std::vector<Case> out;
  const int n = c.topk;
  if (n <= 1) return out;
  // Positions invalid in every row carry nothing but the list length: drop them all at once.
  std::vector<int> useful;
  for (int k = 0; k < n; ++k) {
    bool any = false;
    for (int q = 0; q < c.query_rows() && !any; ++q) any = entry_valid(c, q, k);
    if (any) useful.push_back(k);
  }
  if (!useful.empty() && static_cast<int>(useful.size()) < n) {
    out.push_back(select_positions(c, useful));
  }
  std::vector<int> lo(static_cast<size_t>(n / 2)), hi(static_cast<size_t>(n - n / 2));
  std::iota(lo.begin(), lo.end(), 0);
  std::iota(hi.begin(), hi.end(), n / 2);
  out.push_back(select_positions(c, lo));
  out.push_back(select_positions(c, hi));
  if (n <= 32) {
    for (int drop = 0; drop < n; ++drop) {
      std::vector<int> keep;
      for (int k = 0; k < n; ++k) {
        if (k != drop) keep.push_back(k);
      }
      out.push_back(select_positions(c, keep));
    }
  }
  return out;
}

}  // namespace mlafuzz::edits
