// Transformations of materialized cases for the poison and metamorphic properties.
#include "properties/properties.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>
#include <sstream>

#include "harness/core/rng.h"

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
  r.recipe.indices.clear();  // the buffers are the truth now
}

}  // namespace

std::vector<uint8_t> used_cache_bytes(const MaterializedCase& m) {
  std::vector<uint8_t> used(m.cache.size(), 0);
  const mla::CacheGeometry& g = m.geom;
  const int64_t slots = mla::num_slots(g);
  auto mark = [&](int64_t from, int64_t len) {
    if (from < 0) return;
    const int64_t end = std::min<int64_t>(from + len, static_cast<int64_t>(used.size()));
    for (int64_t i = from; i < end; ++i) used[static_cast<size_t>(i)] = 1;
  };
  for (int32_t b = 0; b < m.batch; ++b) {
    const int32_t len = row_length(m, b);
    for (int32_t k = 0; k < m.topk; ++k) {
      const int32_t idx = m.indices[static_cast<size_t>(b) * m.topk + k];
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
  return used;
}

MaterializedCase poison_case(const MaterializedCase& m, int variant) {
  MaterializedCase r = m;
  const CounterRng rng(m.recipe.data_seed ^ static_cast<uint64_t>(variant), Stream::kPoison, 0);
  const std::vector<uint8_t> used = used_cache_bytes(m);
  for (size_t i = 0; i < r.cache.size(); ++i) {
    if (!used[i]) r.cache[i] = poison_byte(variant, rng, i);
  }
  const int32_t dqk = m.d_qk();
  const CounterRng qrng(m.recipe.data_seed ^ static_cast<uint64_t>(variant), Stream::kPoison, 1);
  for (size_t i = 0; i < r.q.size(); ++i) {
    if (static_cast<int64_t>(i) % m.q_head_stride >= dqk) r.q[i] = poison_bf16(variant, qrng, i);
  }
  // Entries masked by topk_length point at random (poisoned) slots: still in range, so a kernel
  // that loads before masking stays in bounds, but one that ignores topk_length reads poison.
  if (!m.topk_length.empty()) {
    CounterRng irng(m.recipe.data_seed ^ static_cast<uint64_t>(variant), Stream::kPoison, 2);
    const int64_t slots = mla::num_slots(m.geom);
    for (int32_t b = 0; b < m.batch; ++b) {
      for (int32_t k = std::max(0, m.topk_length[static_cast<size_t>(b)]); k < m.topk; ++k) {
        r.indices[static_cast<size_t>(b) * m.topk + k] =
            static_cast<int32_t>(irng.uniform_int(0, slots - 1));
      }
    }
  }
  return r;
}

MaterializedCase relocate_pages(const MaterializedCase& m, uint64_t seed, int64_t stride_multiple) {
  MaterializedCase r = m;
  CounterRng rng(seed, Stream::kPoison, 3);
  const mla::CacheGeometry& g = m.geom;
  const int32_t extra = static_cast<int32_t>(rng.uniform_int(0, 2));
  r.geom.num_pages = g.num_pages + extra;
  const int64_t min_stride = mla::min_page_stride(g);
  switch (rng.uniform_int(0, 2)) {
    case 0:
      r.geom.page_stride = min_stride;
      break;
    case 1:
      r.geom.page_stride = min_stride + rng.uniform_int(1, 700);
      break;
    default:  // SGLang-style padding to a multiple of 576 bytes beyond the minimum
      r.geom.page_stride = (min_stride / 576 + 1 + rng.uniform_int(0, 1)) * 576;
      break;
  }
  if (r.geom.page_stride == g.page_stride && extra == 0) r.geom.page_stride += 64;
  // Inside the backend's envelope: a stride it accepts (the smallest multiple at or above).
  if (stride_multiple > 1) {
    r.geom.page_stride =
        (r.geom.page_stride + stride_multiple - 1) / stride_multiple * stride_multiple;
  }
  std::vector<int32_t> perm(static_cast<size_t>(r.geom.num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  shuffle(perm, rng);
  if (perm.size() > 1 && extra == 0 &&
      std::is_sorted(perm.begin(), perm.end())) {  // make sure the order changes
    std::swap(perm[0], perm[1]);
  }
  r.cache.assign(static_cast<size_t>(mla::cache_bytes(r.geom)), 0);
  const CounterRng fill(seed, Stream::kPoison, 4);
  for (size_t i = 0; i < r.cache.size(); ++i) r.cache[i] = poison_byte(1, fill, i);
  for (int32_t p = 0; p < g.num_pages; ++p) {
    std::memcpy(
        r.cache.data() + static_cast<int64_t>(perm[static_cast<size_t>(p)]) * r.geom.page_stride,
        m.cache.data() + static_cast<int64_t>(p) * g.page_stride, static_cast<size_t>(min_stride));
  }
  for (int32_t& idx : r.indices) {
    if (idx < 0) continue;
    idx = perm[static_cast<size_t>(idx / g.page_size)] * g.page_size + idx % g.page_size;
  }
  r.recipe.geom = r.geom;
  r.recipe.page_order.clear();
  return r;
}

MaterializedCase batch_row_alone(const MaterializedCase& m, int b) {
  MaterializedCase r = m;
  r.batch = 1;
  const int64_t qrow = m.heads * m.q_head_stride;
  r.q.assign(m.q.begin() + b * qrow, m.q.begin() + (b + 1) * qrow);
  r.indices.assign(m.indices.begin() + static_cast<int64_t>(b) * m.topk,
                   m.indices.begin() + static_cast<int64_t>(b + 1) * m.topk);
  if (!m.topk_length.empty()) r.topk_length = {m.topk_length[static_cast<size_t>(b)]};
  if (r.recipe.topk_length) r.recipe.topk_length = r.topk_length;
  r.recipe.q_source = q_source_of_rows(m.recipe, {b});  // the recipe draws the buffer's q
  set_shape(r);
  return r;
}

MaterializedCase head_alone(const MaterializedCase& m, int h) {
  MaterializedCase r = m;
  r.heads = 1;
  r.q.clear();
  for (int32_t b = 0; b < m.batch; ++b) {
    const auto from = m.q.begin() + (static_cast<int64_t>(b) * m.heads + h) * m.q_head_stride;
    r.q.insert(r.q.end(), from, from + m.q_head_stride);
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
  for (int32_t b = 0; b < m.batch; ++b) {
    const int32_t len = row_length(m, b) < 0 ? m.topk : std::min(row_length(m, b), m.topk);
    auto* row = r.indices.data() + static_cast<int64_t>(b) * m.topk;
    std::vector<int32_t> head(row, row + len), tail(row + len, row + m.topk);
    shuffle(head, rng);
    shuffle(tail, rng);
    std::copy(head.begin(), head.end(), row);
    std::copy(tail.begin(), tail.end(), row + len);
  }
  set_shape(r);
  return r;
}

MaterializedCase insert_invalid(const MaterializedCase& m, uint64_t seed, int count) {
  MaterializedCase r = m;
  CounterRng rng(seed, Stream::kPoison, 6);
  r.topk = m.topk + count;
  r.indices.clear();
  for (int32_t b = 0; b < m.batch; ++b) {
    const int32_t len =
        row_length(m, b) < 0 ? m.topk : std::max(0, std::min(row_length(m, b), m.topk));
    std::vector<int32_t> row(m.indices.begin() + static_cast<int64_t>(b) * m.topk,
                             m.indices.begin() + static_cast<int64_t>(b + 1) * m.topk);
    for (int i = 0; i < count; ++i) {
      // Within the prefix that topk_length keeps (positions 0..len+i).
      const auto pos = rng.uniform_int(0, len + i);
      row.insert(row.begin() + pos, -1);
    }
    r.indices.insert(r.indices.end(), row.begin(), row.end());
    if (!r.topk_length.empty() && m.topk_length[static_cast<size_t>(b)] >= 0) {
      r.topk_length[static_cast<size_t>(b)] = len + count;
    }
  }
  if (r.recipe.topk_length) r.recipe.topk_length = r.topk_length;
  set_shape(r);
  return r;
}

namespace {

std::string element_name(int64_t flat, int32_t heads, int64_t head_stride, int64_t guard,
                         int64_t body, const char* what) {
  std::ostringstream os;
  const int64_t rel = flat - guard;
  if (rel < 0 || rel >= body) {
    os << what << " guard band [" << flat << "]";
    return os.str();
  }
  const int64_t row = rel / head_stride;
  os << what << "[b=" << row / heads << ",h=" << row % heads << ",d=" << rel % head_stride << "]";
  return os.str();
}

}  // namespace

bool bitwise_equal(const MaterializedCase& m, const RunResult& a, const RunResult& b,
                   std::string* where, int* wb, int* wh, int* wd) {
  auto set = [&](int bb, int hh, int dd) {
    if (wb) *wb = bb;
    if (wh) *wh = hh;
    if (wd) *wd = dd;
  };
  std::ostringstream os;
  if (!a.out_raw.empty() && !b.out_raw.empty()) {
    if (a.out_raw.size() != b.out_raw.size() || a.lse_raw.size() != b.lse_raw.size()) {
      *where = "raw output sizes differ";
      return false;
    }
    const int64_t g = OutputBuffers::kGuard;
    const int64_t body = int64_t{m.batch} * m.heads * m.out_head_stride;
    for (size_t i = 0; i < a.out_raw.size(); ++i) {
      if (a.out_raw[i] != b.out_raw[i]) {
        os << element_name(static_cast<int64_t>(i), m.heads, m.out_head_stride, g, body, "out")
           << std::hex << " 0x" << a.out_raw[i] << " vs 0x" << b.out_raw[i];
        *where = os.str();
        const int64_t rel = static_cast<int64_t>(i) - g;
        if (rel >= 0 && rel < body) {
          const int64_t row = rel / m.out_head_stride;
          set(static_cast<int>(row / m.heads), static_cast<int>(row % m.heads),
              static_cast<int>(rel % m.out_head_stride));
        }
        return false;
      }
    }
    for (size_t i = 0; i < a.lse_raw.size(); ++i) {
      const uint32_t x = std::bit_cast<uint32_t>(a.lse_raw[i]);
      const uint32_t y = std::bit_cast<uint32_t>(b.lse_raw[i]);
      if (x != y) {
        os << element_name(static_cast<int64_t>(i), m.heads, 1, g, int64_t{m.batch} * m.heads,
                           "lse")
           << " " << a.lse_raw[i] << " (0x" << std::hex << x << ") vs " << std::dec << b.lse_raw[i]
           << " (0x" << std::hex << y << ")";
        *where = os.str();
        const int64_t rel = static_cast<int64_t>(i) - g;
        if (rel >= 0 && rel < int64_t{m.batch} * m.heads) {
          set(static_cast<int>(rel / m.heads), static_cast<int>(rel % m.heads), -1);
        }
        return false;
      }
    }
    return true;
  }
  if (a.out.size() != b.out.size() || a.lse.size() != b.lse.size()) {
    *where = "output sizes differ";
    return false;
  }
  const int32_t dv = m.d_v();
  for (size_t i = 0; i < a.out.size(); ++i) {
    if (std::bit_cast<uint64_t>(a.out[i]) != std::bit_cast<uint64_t>(b.out[i])) {
      const auto row = static_cast<int64_t>(i) / dv;
      os << "out[b=" << row / m.heads << ",h=" << row % m.heads << ",d=" << i % dv << "] "
         << a.out[i] << " vs " << b.out[i];
      *where = os.str();
      set(static_cast<int>(row / m.heads), static_cast<int>(row % m.heads),
          static_cast<int>(i % dv));
      return false;
    }
  }
  for (size_t i = 0; i < a.lse.size(); ++i) {
    if (std::bit_cast<uint64_t>(a.lse[i]) != std::bit_cast<uint64_t>(b.lse[i])) {
      os << "lse[b=" << i / m.heads << ",h=" << i % m.heads << "] " << a.lse[i] << " vs "
         << b.lse[i];
      *where = os.str();
      set(static_cast<int>(i / m.heads), static_cast<int>(i % m.heads), -1);
      return false;
    }
  }
  return true;
}

bool rows_bitwise_equal(const RunResult& whole, int32_t heads, int32_t d_v, int b_whole,
                        int h_whole, const RunResult& part, int part_row, std::string* where) {
  const size_t wr = static_cast<size_t>(b_whole) * heads + h_whole;
  const auto pr = static_cast<size_t>(part_row);
  std::ostringstream os;
  for (int32_t d = 0; d < d_v; ++d) {
    const double x = whole.out[wr * d_v + d], y = part.out[pr * d_v + d];
    if (std::bit_cast<uint64_t>(x) != std::bit_cast<uint64_t>(y)) {
      os << "out[b=" << b_whole << ",h=" << h_whole << ",d=" << d << "] " << x << " in the full "
         << "case vs " << y << " alone";
      *where = os.str();
      return false;
    }
  }
  const double x = whole.lse[wr], y = part.lse[pr];
  if (std::bit_cast<uint64_t>(x) != std::bit_cast<uint64_t>(y)) {
    os << "lse[b=" << b_whole << ",h=" << h_whole << "] " << x << " in the full case vs " << y
       << " alone";
    *where = os.str();
    return false;
  }
  return true;
}

}  // namespace mlafuzz
