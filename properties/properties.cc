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

#include "harness/core/rng.h"
#include "harness/core/value_format.h"

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
      const int32_t idx = m.index_at(b, k);
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
  const int64_t heads_span = int64_t{m.heads} * m.q_head_stride;
  for (size_t i = 0; i < r.q.size(); ++i) {
    // Head pads and the gap after the last head of a batch row.
    const int64_t in_row = static_cast<int64_t>(i) % m.q_batch_stride;
    if (in_row >= heads_span || in_row % m.q_head_stride >= dqk) {
      r.q[i] = poison_bf16(variant, qrng, i);
    }
  }
  // Entries masked by topk_length point at random (poisoned) slots: still in range, so a kernel
  // that loads before masking stays in bounds, but one that ignores topk_length reads poison.
  const int64_t slots = mla::num_slots(m.geom);
  if (!m.topk_length.empty()) {
    CounterRng irng(m.recipe.data_seed ^ static_cast<uint64_t>(variant), Stream::kPoison, 2);
    for (int32_t b = 0; b < m.batch; ++b) {
      for (int32_t k = std::max(0, m.topk_length[static_cast<size_t>(b)]); k < m.topk; ++k) {
        r.indices[static_cast<size_t>(b * m.indices_batch_stride + k)] =
            static_cast<int32_t>(irng.uniform_int(0, slots - 1));
      }
    }
  }
  // The gap after each index row: entries a kernel that honours indices_batch_stride and topk
  // never reads. Each variant fills it differently, always with values that change the result if
  // read: the last slot, random slots, slot 0 (valid-looking) or one past the cache.
  CounterRng grng(m.recipe.data_seed ^ static_cast<uint64_t>(variant), Stream::kPoison, 7);
  for (int32_t b = 0; b < m.batch; ++b) {
    for (int64_t k = m.topk; k < m.indices_batch_stride; ++k) {
      int32_t v = 0;
      switch (variant) {
        case 0:
          v = static_cast<int32_t>(slots - 1);
          break;
        case 1:
          v = static_cast<int32_t>(grng.uniform_int(0, slots - 1));
          break;
        case 2:
          v = 0;
          break;
        default:
          v = static_cast<int32_t>(std::min<int64_t>(slots, std::numeric_limits<int32_t>::max()));
          break;
      }
      r.indices[static_cast<size_t>(b * m.indices_batch_stride + k)] = v;
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
  // Only the entries of each row: the row gaps are no slots (they may be out of range).
  const int64_t slots = mla::num_slots(g);
  for (int32_t b = 0; b < m.batch; ++b) {
    for (int32_t k = 0; k < m.topk; ++k) {
      int32_t& idx = r.indices[static_cast<size_t>(b * m.indices_batch_stride + k)];
      if (idx < 0 || idx >= slots) continue;
      idx = perm[static_cast<size_t>(idx / g.page_size)] * g.page_size + idx % g.page_size;
    }
  }
  r.recipe.geom = r.geom;
  r.recipe.page_order.clear();
  return r;
}

MaterializedCase batch_row_alone(const MaterializedCase& m, int b) {
  MaterializedCase r = m;
  r.batch = 1;
  // The row with its gaps: the strides stay the case's.
  const int64_t qrow = m.q_batch_stride, irow = m.indices_batch_stride;
  r.q.assign(m.q.begin() + b * qrow, m.q.begin() + (b + 1) * qrow);
  r.indices.assign(m.indices.begin() + b * irow, m.indices.begin() + (b + 1) * irow);
  if (!m.topk_length.empty()) r.topk_length = {m.topk_length[static_cast<size_t>(b)]};
  if (r.recipe.topk_length) r.recipe.topk_length = r.topk_length;
  r.recipe.q_source = q_source_of_rows(m.recipe, {b});  // the recipe draws the buffer's q
  set_shape(r);
  return r;
}

MaterializedCase head_alone(const MaterializedCase& m, int h) {
  MaterializedCase r = m;
  r.heads = 1;
  // The batch rows keep their gaps (pads beyond the heads), so each stride shrinks by the heads
  // left out.
  const int64_t q_gap = m.q_batch_stride - int64_t{m.heads} * m.q_head_stride;
  r.q_batch_stride = m.q_head_stride + q_gap;
  r.out_batch_stride = m.out_batch_stride - int64_t{m.heads - 1} * m.out_head_stride;
  r.lse_batch_stride = m.lse_batch_stride - (m.heads - 1);
  r.q.clear();
  for (int32_t b = 0; b < m.batch; ++b) {
    const auto row = m.q.begin() + b * m.q_batch_stride;
    const auto from = row + h * m.q_head_stride;
    r.q.insert(r.q.end(), from, from + m.q_head_stride);
    r.q.insert(r.q.end(), row + m.heads * m.q_head_stride, row + m.q_batch_stride);
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
    auto* row = r.indices.data() + b * m.indices_batch_stride;
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
  r.indices_batch_stride = m.indices_batch_stride + count;  // the row gap keeps its size
  r.indices.clear();
  for (int32_t b = 0; b < m.batch; ++b) {
    const int32_t len =
        row_length(m, b) < 0 ? m.topk : std::max(0, std::min(row_length(m, b), m.topk));
    const auto from = m.indices.begin() + b * m.indices_batch_stride;
    std::vector<int32_t> row(from, from + m.topk);
    for (int i = 0; i < count; ++i) {
      // Within the prefix that topk_length keeps (positions 0..len+i).
      const auto pos = rng.uniform_int(0, len + i);
      row.insert(row.begin() + pos, -1);
    }
    r.indices.insert(r.indices.end(), row.begin(), row.end());
    r.indices.insert(r.indices.end(), from + m.topk, from + m.indices_batch_stride);
    if (!r.topk_length.empty() && m.topk_length[static_cast<size_t>(b)] >= 0) {
      r.topk_length[static_cast<size_t>(b)] = len + count;
    }
  }
  if (r.recipe.topk_length) r.recipe.topk_length = r.topk_length;
  set_shape(r);
  return r;
}

namespace {

// Position of element `flat` of a raw guarded buffer: [B, batch_stride] rows of `heads` heads
// `head_stride` apart after `guard` canaries; the rest of a row is its gap.
struct RawPos {
  bool guard = false;  // guard band before or after the body
  bool gap = false;    // a head pad or the row gap
  int64_t b = -1, h = -1, d = -1;
};

RawPos raw_pos(int64_t flat, int32_t heads, int64_t head_stride, int64_t batch_stride,
               int64_t guard, int64_t rows, int64_t width) {
  RawPos p;
  const int64_t rel = flat - guard;
  if (rel < 0 || rel >= rows * batch_stride) {
    p.guard = true;
    return p;
  }
  p.b = rel / batch_stride;
  const int64_t in_row = rel % batch_stride;
  p.h = in_row / head_stride;
  p.d = in_row % head_stride;
  p.gap = p.h >= heads || p.d >= width;
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
    const int64_t g = OutputBuffers::kGuard;
    for (size_t i = 0; i < a.out_raw.size(); ++i) {
      if (a.out_raw[i] != b.out_raw[i]) {
        const RawPos p = raw_pos(static_cast<int64_t>(i), m.heads, m.out_head_stride,
                                 m.out_batch_stride, g, m.batch, m.d_v());
        *where = raw_name(p, static_cast<int64_t>(i), "out", true) + " " +
                 bf16_pair(a.out_raw[i], b.out_raw[i]);
        if (!p.guard && !p.gap) set(p.b, p.h, p.d);
        return false;
      }
    }
    for (size_t i = 0; i < a.lse_raw.size(); ++i) {
      const uint32_t x = std::bit_cast<uint32_t>(a.lse_raw[i]);
      const uint32_t y = std::bit_cast<uint32_t>(b.lse_raw[i]);
      if (x != y) {
        const RawPos p =
            raw_pos(static_cast<int64_t>(i), m.heads, 1, m.lse_batch_stride, g, m.batch, 1);
        *where = raw_name(p, static_cast<int64_t>(i), "lse", false) + " " + fp32_pair(x, y);
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
  const int32_t dv = m.d_v();
  for (size_t i = 0; i < a.out.size(); ++i) {
    if (std::bit_cast<uint64_t>(a.out[i]) != std::bit_cast<uint64_t>(b.out[i])) {
      const auto row = static_cast<int64_t>(i) / dv;
      *where = fmt::format("out[b={},h={},d={}] ", row / m.heads, row % m.heads, i % dv) +
               widened_pair(a.out[i], b.out[i], ValueFormat::kFp64);
      set(row / m.heads, row % m.heads, static_cast<int64_t>(i % dv));
      return false;
    }
  }
  for (size_t i = 0; i < a.lse.size(); ++i) {
    if (std::bit_cast<uint64_t>(a.lse[i]) != std::bit_cast<uint64_t>(b.lse[i])) {
      *where = fmt::format("lse[b={},h={}] ", i / m.heads, i % m.heads) +
               widened_pair(a.lse[i], b.lse[i], ValueFormat::kFp64);
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
    if (std::bit_cast<uint64_t>(x) != std::bit_cast<uint64_t>(y)) {
      *where = fmt::format("out[b={},h={},d={}] ", b_whole, h_whole, d) +
               widened_pair(x, y, exact_format(x, y, ValueFormat::kBf16)) + " (full case vs alone)";
      return false;
    }
  }
  const double x = whole.lse[wr], y = part.lse[pr];
  if (std::bit_cast<uint64_t>(x) != std::bit_cast<uint64_t>(y)) {
    *where = fmt::format("lse[b={},h={}] ", b_whole, h_whole) +
             widened_pair(x, y, exact_format(x, y, ValueFormat::kFp32)) + " (full case vs alone)";
    return false;
  }
  return true;
}

}  // namespace mlafuzz
