// Materialization: determinism, golden hashes, index rules, logical-to-physical mapping,
// pad fills.
#include "core/materialize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "tests/core/test_util.h"

namespace mlafuzz {
namespace {

using testing::small_case;

// Golden cases: one per layout plus one that exercises every generator option. Small, so the
// test is fast, but every code path of materialize() contributes to a hash.
Case golden_model1() {
  Case c = small_case();
  c.name = "golden-model1";
  c.topk_length = std::vector<int32_t>{7, 3};
  c.sink = std::vector<double>{0.5, -HUGE_VAL, HUGE_VAL};
  return c;
}

Case golden_v32() {
  Case c;
  c.geom.layout = mla::Layout::kV32;
  c.geom.nope_dim = 512;
  c.geom.scale_tile = 128;
  c.geom.page_size = 61;
  c.geom.num_pages = 3;
  c.geom.page_stride = 61 * 656 + 100;
  c.page_order = {1, 2, 0};
  c.batch = 3;
  c.heads = 2;
  c.topk = 70;
  c.pad_fill = Fill::kGarbage;
  c.q_head_pad = 3;
  c.data_seed = 7;
  return c;
}

Case golden_options() {
  Case c = small_case();
  c.geom.page_size = 69;
  c.geom.num_pages = 2;
  c.geom.page_stride = 69 * 584 + 8;
  c.page_order = {1, 0};
  c.topk = 100;
  c.index_spec = {IndexRule::kPageRuns, 0.1, 0.2};
  c.q_values = {ValueDist::kUniform, 3.0, 0.05};
  c.kv_values = {ValueDist::kNormal, 1000.0, 0.1};
  c.rope_values = {ValueDist::kSmallInt, 0.25, 0.1};
  c.scales = {ScaleMode::kRandom, 110, 135};
  c.pad_fill = Fill::kNaN;
  c.q_head_pad = 5;
  c.data_seed = 0xfeedfacecafebeefull;
  return c;
}

// Golden content hashes, computed once and pinned. If one changes, materialization changed:
// every stored corpus case and every reported finding would then reproduce different bytes.
// Only update these constants for a deliberate, announced change of the materialization
// format (and bump kCaseFormatVersion if old corpus files must not be misread).
constexpr uint64_t kGoldenModel1 = 0xe9c4765f0460a2e0ull;
constexpr uint64_t kGoldenV32 = 0x3919074f28dfc172ull;
constexpr uint64_t kGoldenOptions = 0x0e36700cbc0ffac3ull;

TEST(Materialize, GoldenHashes) {
  EXPECT_EQ(content_hash(materialize(golden_model1())), kGoldenModel1)
      << std::hex << content_hash(materialize(golden_model1()));
  EXPECT_EQ(content_hash(materialize(golden_v32())), kGoldenV32)
      << std::hex << content_hash(materialize(golden_v32()));
  EXPECT_EQ(content_hash(materialize(golden_options())), kGoldenOptions)
      << std::hex << content_hash(materialize(golden_options()));
}

// The cache bytes of the token at global slot `slot`: its e4m3 codes, scales and bf16 rope.
std::vector<uint8_t> token_bytes(const std::vector<uint8_t>& cache, const mla::CacheGeometry& g,
                                 int64_t slot) {
  const mla::TokenAddress a = mla::token_address(g, slot);
  const int64_t scale_bytes =
      int64_t{mla::num_scale_tiles(g)} * (g.layout == mla::Layout::kModel1 ? 1 : 4);
  std::vector<uint8_t> out;
  for (const auto& [at, n] :
       {std::pair{a.nope, int64_t{g.nope_dim}}, std::pair{a.scale, scale_bytes},
        std::pair{a.rope, int64_t{2} * g.rope_dim}}) {
    out.insert(out.end(), cache.begin() + at, cache.begin() + at + n);
  }
  return out;
}

// materialize_named_tokens writes the tokens the index lists name as materialize does and no
// other: the same q and indices, the same bytes at every named token of the main and the extra
// cache (MODEL1 and V32, random scales, page orders, garbage and NaN fills), and tokens no list
// names left unwritten.
TEST(Materialize, NamedTokensHoldTheWholeMaterializationsBytes) {
  Case with_extra = golden_options();
  with_extra.extra = ExtraCache{};
  with_extra.extra->page_size = 16;
  with_extra.extra->num_pages = 4;
  with_extra.extra->page_order = {2, 0, 3, 1};
  with_extra.extra->topk = 8;
  int named = 0, unnamed_differ = 0;
  for (const Case& c : {golden_model1(), golden_v32(), golden_options(), with_extra}) {
    const MaterializedCase whole = materialize(c), part = materialize_named_tokens(c);
    ASSERT_EQ(part.q, whole.q);
    ASSERT_EQ(part.indices, whole.indices);
    ASSERT_EQ(part.extra_indices, whole.extra_indices);
    ASSERT_EQ(part.cache.vec().size(), whole.cache.vec().size());
    for (const bool extra : {false, true}) {
      if (extra && !c.extra) continue;
      const mla::CacheGeometry& g = extra ? whole.extra_geom : whole.geom;
      const auto& lists = extra ? whole.recipe.extra->indices : whole.recipe.indices;
      std::set<int32_t> in_lists;
      for (const auto& l : lists) in_lists.insert(l.begin(), l.end());
      const auto bytes = [](const CacheBytes& cb) {
        return std::vector<uint8_t>(cb.vec().begin(), cb.vec().end());
      };
      const std::vector<uint8_t> a = bytes(extra ? whole.extra_cache : whole.cache);
      const std::vector<uint8_t> b = bytes(extra ? part.extra_cache : part.cache);
      for (int64_t t = 0; t < mla::num_slots(g); ++t) {
        const int64_t slot = extra ? extra_physical_slot(c, t) : physical_slot(c, t);
        if (in_lists.count(static_cast<int32_t>(t)) != 0) {
          ASSERT_EQ(token_bytes(b, g, slot), token_bytes(a, g, slot))
              << "token " << t << (extra ? " of the extra cache" : "");
          ++named;
        } else {
          unnamed_differ += token_bytes(b, g, slot) != token_bytes(a, g, slot);
        }
      }
    }
  }
  EXPECT_GT(named, 300);
  EXPECT_GT(unnamed_differ, 10);
}

// Inside a ReuseCaches scope, a case whose caches have the same recipe as the last one's shares
// them (and holds the bytes materialize gives it alone); another recipe draws its own; a write
// to a shared cache copies it first; after the scope nothing is shared.
TEST(Materialize, ReusedCachesAreTheCasesOwnBytes) {
  Case base = golden_options();
  base.extra = ExtraCache{};
  base.extra->page_size = 16;
  base.extra->num_pages = 4;
  base.extra->topk = 8;
  Case same = base;  // another case over the same caches
  same.batch = 1;
  same.heads = 3;
  same.topk = 40;
  same.q_values.magnitude = 0.5;
  same.sink = std::vector<double>{0.5, -1, 2};
  same.extra->topk = 3;
  Case other = same;
  other.kv_values.magnitude = 2.0;
  const auto expect_own_bytes = [](const MaterializedCase& m, const Case& c) {
    const MaterializedCase alone = materialize(c);
    EXPECT_TRUE(m.cache == alone.cache && m.extra_cache == alone.extra_cache && m.q == alone.q &&
                m.indices == alone.indices && m.extra_indices == alone.extra_indices);
  };
  {
    const ReuseCaches outer;
    const MaterializedCase a = materialize(base);
    MaterializedCase b;
    {
      const ReuseCaches inner;  // nested: the outer scope's caches stay
      b = materialize(same);
    }
    EXPECT_TRUE(b.cache.shares(a.cache) && b.extra_cache.shares(a.extra_cache));
    expect_own_bytes(b, same);
    const MaterializedCase o = materialize(other);
    EXPECT_FALSE(o.cache.shares(a.cache));
    expect_own_bytes(o, other);
    MaterializedCase again = materialize(other);  // `other` is now the kept recipe
    EXPECT_TRUE(again.cache.shares(o.cache));
    again.cache.mut()[0] ^= 1;
    EXPECT_FALSE(again.cache.shares(o.cache));
    expect_own_bytes(o, other);
  }
  const MaterializedCase x = materialize(base), y = materialize(base);
  EXPECT_FALSE(x.cache.shares(y.cache));
}

// encode_e4m3 (no branch per element) gives float_to_e4m3_sat(v / scale)'s byte: every float
// whose low 16 bits are one of a few patterns (all exponents, signs, NaN and infinities), each
// e4m3 value and each midpoint between neighbours with their float neighbours, under scales of
// each path (0, 254 and 255 take the division; 1..253 the reciprocal), and encode_e4m3_scaled's
// under float scales of every kind.
TEST(Materialize, BatchedE4m3EncodingEqualsTheScalarOne) {
  std::vector<float> v;
  for (uint32_t hi = 0; hi < 0x10000u; ++hi) {
    for (const uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      v.push_back(std::bit_cast<float>(hi << 16 | lo));
    }
  }
  for (int code = 0; code < 256; ++code) {
    const float x = mla::e4m3_to_float(static_cast<uint8_t>(code));
    const float next = mla::e4m3_to_float(static_cast<uint8_t>(code + 1));
    for (const float y : {x, std::isfinite(next) ? (x + next) / 2 : x}) {
      for (const float z : {y, std::nextafter(y, 0.0f), std::nextafter(y, 1e30f)}) {
        v.push_back(z);
        v.push_back(-z);
      }
    }
  }
  std::vector<uint8_t> got(v.size());
  int64_t checked = 0;
  for (const int e : {0, 1, 2, 60, 119, 120, 127, 130, 134, 200, 253, 254, 255}) {
    const float scale = mla::ue8m0_to_float(static_cast<uint8_t>(e));
    // The same values seen through the scale: v * scale encodes as v under this scale.
    std::vector<float> scaled(v.size());
    for (size_t i = 0; i < v.size(); ++i) scaled[i] = v[i] * scale;
    for (const auto* in : {&v, &scaled}) {
      encode_e4m3(in->data(), static_cast<int32_t>(in->size()), static_cast<uint8_t>(e),
                  got.data());
      for (size_t i = 0; i < in->size(); ++i) {
        const uint8_t want = mla::float_to_e4m3_sat((*in)[i] / scale);
        ASSERT_EQ(got[i], want) << "scale exponent " << e << ", value " << (*in)[i] << " (bits 0x"
                                << std::hex << std::bit_cast<uint32_t>((*in)[i]) << ")";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 10'000'000);
  // encode_e4m3_scaled: any float scale (V32's fp32 scales), the same values.
  for (const float scale :
       {1.1f, 1.0f + 0x1p-8f + 0x1p-16f, v32_writer_scale(3.7f), v32_writer_scale(0.0f), 0x1p-140f,
        3e38f, -2.5f, 0.0f, std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN()}) {
    encode_e4m3_scaled(v.data(), static_cast<int32_t>(v.size()), scale, got.data());
    for (size_t i = 0; i < v.size(); ++i) {
      ASSERT_EQ(got[i], mla::float_to_e4m3_sat(v[i] / scale))
          << "scale " << scale << ", value " << v[i] << " (bits 0x" << std::hex
          << std::bit_cast<uint32_t>(v[i]) << ")";
    }
  }
}

// draw_values (32 streams side by side) gives draw_value's bits for every distribution,
// special fraction, tag and count, the last partial group of lanes included.
TEST(Materialize, BatchedDrawsEqualOneByOne) {
  const ValueDist dists[] = {ValueDist::kNormal, ValueDist::kUniform, ValueDist::kSmallInt,
                             ValueDist::kZeros, ValueDist::kTies};
  for (const ValueDist dist : dists) {
    for (const double special : {0.0, 0.03, 0.5, 1.0}) {
      for (const SpecialTag tag : {kTagQ, kTagNope, kTagRope}) {
        const ValueSpec spec{dist, 0.75, special};
        for (const int32_t count : {1, 7, 8, 9, 31, 32, 33, 64, 77}) {
          const uint64_t seed = 0x1234567ull * static_cast<uint64_t>(count) + tag;
          const uint64_t first = 1000003ull * static_cast<uint64_t>(count);
          std::vector<float> got(static_cast<size_t>(count));
          draw_values(spec, seed, Stream::kKvNope, first, count, tag, got.data());
          for (int32_t i = 0; i < count; ++i) {
            const float want = static_cast<float>(
                draw_value(spec, seed, Stream::kKvNope, first + static_cast<uint64_t>(i), tag));
            ASSERT_EQ(std::bit_cast<uint32_t>(got[static_cast<size_t>(i)]),
                      std::bit_cast<uint32_t>(want))
                << "dist " << static_cast<int>(dist) << " special " << special << " tag " << tag
                << " count " << count << " element " << i;
          }
        }
      }
    }
  }
}

TEST(Materialize, DeterministicAndSeedSensitive) {
  const Case c = golden_options();
  EXPECT_EQ(content_hash(materialize(c)), content_hash(materialize(c)));
  Case d = c;
  d.data_seed += 1;
  EXPECT_NE(content_hash(materialize(c)), content_hash(materialize(d)));
}

TEST(Materialize, ShapesAndScalars) {
  Case c = golden_model1();
  c.q_head_pad = 2;
  c.out_head_pad = 3;
  c.sm_scale = 0.1;
  const MaterializedCase m = materialize(c);
  EXPECT_EQ(m.geom.page_stride, 5 * 584);  // 0 resolves to the layout minimum
  EXPECT_EQ(m.recipe.geom.page_stride, 5 * 584);
  EXPECT_EQ(m.q_head_stride, 512 + 2);
  EXPECT_EQ(m.out_head_stride, 512 + 3);
  EXPECT_EQ(m.q.size(), size_t{2 * 3 * 514});
  EXPECT_EQ(m.cache.size(), size_t{3 * 5 * 584});
  EXPECT_EQ(m.indices.size(), size_t{2 * 7});
  EXPECT_EQ(m.topk_length, (std::vector<int32_t>{7, 3}));
  EXPECT_EQ(m.sm_scale, 0.1f);
  EXPECT_EQ(m.sm_scale64, static_cast<double>(0.1f));  // the fp32 value, not the recipe's
  ASSERT_EQ(m.sink.size(), 3u);
  EXPECT_TRUE(std::isinf(m.sink[1]) && m.sink[1] < 0);
  EXPECT_TRUE(std::isinf(m.sink[2]) && m.sink[2] > 0);
  const mla::DecodeParams p = m.host_params();
  EXPECT_EQ(p.q, m.q.data());
  EXPECT_EQ(p.q_batch_stride, 3 * 514);
  EXPECT_EQ(p.out_batch_stride, 3 * 515);
  EXPECT_EQ(p.topk_length, m.topk_length.data());
  EXPECT_EQ(p.sink, m.sink.data());
  EXPECT_EQ(p.out, nullptr);
  c.topk_length.reset();
  c.sink.reset();
  const mla::DecodeParams p2 = materialize(c).host_params();
  EXPECT_EQ(p2.topk_length, nullptr);
  EXPECT_EQ(p2.sink, nullptr);
}

TEST(Materialize, QIsBf16OfTheDrawnValue) {
  const Case c = golden_options();
  const MaterializedCase m = materialize(c);
  for (int b = 0; b < m.batch; ++b) {
    for (int h = 0; h < m.heads; ++h) {
      for (int d = 0; d < m.d_qk(); ++d) {
        ASSERT_EQ(m.q[static_cast<size_t>((b * m.heads + h) * m.q_head_stride + d)],
                  mla::float_to_bf16(q_source_value(c, b, h, d)));
      }
    }
  }
}

// q drawn in batches per head row (fill_q) holds q_source_value's bf16 for every distribution,
// query token, row pad and q_source (a shrunk case with its rows, heads and tokens).
TEST(Materialize, QIsBf16OfTheDrawnValueForEveryTokenAndSource) {
  for (const ValueDist dist : {ValueDist::kNormal, ValueDist::kUniform, ValueDist::kSmallInt}) {
    Case c = golden_options();
    c.q_values = {dist, 2.5, 0.05};
    c.s_q = 2;
    c.q_batch_pad = 3;
    Case sub = c;
    sub.batch = 1;
    sub.heads = 2;
    sub.q_source = Case::QSource{c.heads, {1}, {2, 0}, 2, {1, 0}};
    for (const Case& k : {c, sub}) {
      const MaterializedCase m = materialize(k);
      for (int b = 0; b < m.batch; ++b) {
        for (int t = 0; t < m.s_q; ++t) {
          for (int h = 0; h < m.heads; ++h) {
            for (int d = 0; d < m.d_qk(); ++d) {
              const size_t at = static_cast<size_t>(b * m.q_batch_stride + t * m.q_token_stride +
                                                    h * m.q_head_stride + d);
              ASSERT_EQ(m.q[at], mla::float_to_bf16(q_source_value(k, b, t, h, d)))
                  << "dist " << static_cast<int>(dist) << " q_source " << k.q_source.has_value()
                  << " b " << b << " t " << t << " h " << h << " d " << d;
            }
          }
        }
      }
    }
  }
}

// A case that keeps row 1 and heads 2, 0 of a larger one (Case::q_source, written by the
// shrinker) draws exactly their q values.
TEST(Materialize, QSourceKeepsTheValuesOfTheKeptRowsAndHeads) {
  const Case c = golden_options();
  ASSERT_GE(c.batch, 2);
  ASSERT_GE(c.heads, 3);
  const MaterializedCase m = materialize(c);
  Case sub = c;
  sub.batch = 1;
  sub.heads = 2;
  sub.indices = {generate_indices(c)[1]};
  if (c.topk_length) sub.topk_length = std::vector<int32_t>{(*c.topk_length)[1]};
  if (c.sink) sub.sink = std::vector<double>{(*c.sink)[2], (*c.sink)[0]};
  sub.q_source = Case::QSource{c.heads, {1}, {2, 0}, 1, {}};
  const MaterializedCase s = materialize(sub);
  const int h_of[2] = {2, 0};
  for (int h = 0; h < 2; ++h) {
    for (int d = 0; d < m.d_qk(); ++d) {
      ASSERT_EQ(s.q[static_cast<size_t>(h * s.q_head_stride + d)],
                m.q[static_cast<size_t>((1 * m.heads + h_of[h]) * m.q_head_stride + d)])
          << "head " << h << " d " << d;
    }
  }
  // Without it, the smaller case draws other values for its first head.
  sub.q_source.reset();
  const MaterializedCase o = materialize(sub);
  bool same = true;
  for (int d = 0; d < m.d_qk(); ++d) {
    same = same && o.q[static_cast<size_t>(d)] ==
                       m.q[static_cast<size_t>((1 * m.heads + 2) * m.q_head_stride + d)];
  }
  EXPECT_FALSE(same);
}

TEST(Materialize, InvalidRecipeThrows) {
  Case c = small_case();
  c.geom.nope_dim = 100;
  EXPECT_THROW(materialize(c), CaseError);
  EXPECT_THROW(with_explicit_indices(c), CaseError);
}

// ---- index rules ----

TEST(Indices, RandomRowsAreDistinctAndInRange) {
  Case c = small_case();
  c.topk = 15;  // every slot exactly once
  for (const auto& row : generate_indices(c)) {
    std::set<int32_t> s(row.begin(), row.end());
    EXPECT_EQ(s.size(), 15u);
    EXPECT_EQ(*s.begin(), 0);
    EXPECT_EQ(*s.rbegin(), 14);
  }
  c.topk = 20;  // more entries than slots: duplicates by necessity, all slots covered
  for (const auto& row : generate_indices(c)) {
    std::set<int32_t> s(row.begin(), row.end());
    EXPECT_EQ(s.size(), 15u);
  }
}

TEST(Indices, RowsDiffer) {
  Case c = small_case();
  c.geom.num_pages = 40;
  c.topk = 50;
  const auto rows = generate_indices(c);
  EXPECT_NE(rows[0], rows[1]);
}

TEST(Indices, SequentialIsTheLastTopkTokens) {
  Case c = small_case();
  c.index_spec.rule = IndexRule::kSequential;
  EXPECT_EQ(generate_indices(c)[1], (std::vector<int32_t>{8, 9, 10, 11, 12, 13, 14}));
}

TEST(Indices, PageRunsCrossPagesAndHitPageEdges) {
  Case c = small_case();
  c.geom.page_size = 16;
  c.geom.num_pages = 8;
  c.topk = 256;
  c.batch = 4;
  c.index_spec.rule = IndexRule::kPageRuns;
  int crossings = 0, first_slots = 0, last_slots = 0;
  for (const auto& row : generate_indices(c)) {
    for (size_t k = 0; k < row.size(); ++k) {
      ASSERT_GE(row[k], 0);
      ASSERT_LT(row[k], 128);
      first_slots += row[k] % 16 == 0;
      last_slots += row[k] % 16 == 15;
      if (k > 0 && row[k] == row[k - 1] + 1 && row[k] % 16 == 0) ++crossings;
    }
  }
  EXPECT_GT(crossings, 10);
  EXPECT_GT(first_slots, 20);
  EXPECT_GT(last_slots, 20);
}

TEST(Indices, InvalidAndDuplicateFractions) {
  Case c = small_case();
  c.geom.num_pages = 100;
  c.topk = 200;
  c.index_spec.invalid_fraction = 1;
  for (const auto& row : generate_indices(c)) {
    EXPECT_TRUE(std::all_of(row.begin(), row.end(), [](int32_t i) { return i == -1; }));
  }
  c.index_spec.invalid_fraction = 0.25;
  for (const auto& row : generate_indices(c)) {
    EXPECT_EQ(std::count(row.begin(), row.end(), -1), 50);
  }
  c.index_spec.invalid_fraction = 0;
  c.index_spec.duplicate_fraction = 0.5;
  for (const auto& row : generate_indices(c)) {
    const std::set<int32_t> s(row.begin(), row.end());
    EXPECT_LE(s.size(), 101u);  // about 100 copies (one may land on position 0)
    EXPECT_GE(s.size(), 60u);
  }
}

TEST(Indices, ExplicitListsAreKeptAndMappedThroughPageOrder) {
  Case c = small_case();
  c.page_order = {2, 0, 1};
  c.indices = {{0, 4, 5, 9, 10, 14, -1}, {3, 3, 3, 3, 3, 3, 3}};
  const MaterializedCase m = materialize(c);
  // logical page 0 -> physical 2, 1 -> 0, 2 -> 1 (P = 5).
  EXPECT_EQ(std::vector<int32_t>(m.indices.begin(), m.indices.begin() + 7),
            (std::vector<int32_t>{10, 14, 0, 4, 5, 9, -1}));
  EXPECT_EQ(m.recipe.indices, c.indices);  // the recipe keeps logical positions
}

TEST(Indices, WithExplicitIndicesIsIdempotentAndPreservesBytes) {
  const Case c = golden_options();
  const Case e = with_explicit_indices(c);
  ASSERT_EQ(e.indices.size(), static_cast<size_t>(c.batch));
  EXPECT_EQ(to_json(with_explicit_indices(e)), to_json(e));
  EXPECT_EQ(content_hash(materialize(e)), content_hash(materialize(c)));
  // The explicit recipe survives a JSON round trip byte for byte.
  EXPECT_EQ(content_hash(materialize(case_from_json(to_json(e)))), content_hash(materialize(c)));
}

// ---- values belong to logical tokens ----

TEST(Materialize, RelocatingPagesMovesBytesButNeverChangesThem) {
  Case a = small_case();
  a.geom.num_pages = 4;
  Case b = a;
  b.page_order = {3, 1, 0, 2};
  const MaterializedCase ma = materialize(a), mb = materialize(b);
  EXPECT_EQ(ma.q, mb.q);
  const int64_t data = mla::min_page_stride(ma.geom);
  for (int32_t page = 0; page < 4; ++page) {
    const auto* pa = ma.cache.data() + page * ma.geom.page_stride;
    const auto* pb =
        mb.cache.data() + b.page_order[static_cast<size_t>(page)] * mb.geom.page_stride;
    EXPECT_TRUE(std::equal(pa, pa + data, pb)) << "logical page " << page;
  }
  // The same logical index lists, so the physical ones are the mapped logical ones.
  for (size_t i = 0; i < ma.indices.size(); ++i) {
    EXPECT_EQ(mb.indices[i], physical_slot(b, ma.indices[i]));
  }
}

TEST(Materialize, ChangingQShapeKeepsTheCache) {
  Case a = small_case();
  Case b = a;
  b.heads = 7;
  b.batch = 1;
  EXPECT_EQ(materialize(a).cache, materialize(b).cache);
}

// ---- pad fills ----

// Marks the bytes of the cache that hold data, from the layout description alone.
std::vector<bool> data_mask(const MaterializedCase& m) {
  const auto& g = m.geom;
  std::vector<bool> mask(m.cache.size(), false);
  const int32_t tiles = g.nope_dim / g.scale_tile;
  for (int64_t page = 0; page < g.num_pages; ++page) {
    for (int64_t j = 0; j < g.page_size; ++j) {
      const int64_t base = page * g.page_stride;
      if (g.layout == mla::Layout::kModel1) {
        const int64_t row = base + j * (g.nope_dim + 2 * g.rope_dim);
        for (int64_t i = 0; i < g.nope_dim + 2 * g.rope_dim; ++i) mask[size_t(row + i)] = true;
        const int64_t scale =
            base + g.page_size * (g.nope_dim + 2 * g.rope_dim) + j * ((tiles + 7) / 8 * 8);
        for (int64_t i = 0; i < tiles; ++i) mask[size_t(scale + i)] = true;
      } else {
        const int64_t tb = g.nope_dim + 4 * tiles + 2 * g.rope_dim;
        for (int64_t i = 0; i < tb; ++i) mask[size_t(base + j * tb + i)] = true;
      }
    }
  }
  return mask;
}

void expect_fill_lands_only_on_padding(Case c) {
  c.pad_fill = Fill::kZero;
  const MaterializedCase zero = materialize(c);
  c.pad_fill = Fill::kNaN;
  const MaterializedCase nan = materialize(c);
  c.pad_fill = Fill::kGarbage;
  const MaterializedCase garbage = materialize(c);
  const std::vector<bool> mask = data_mask(zero);
  int64_t pad_bytes = 0, garbage_nonzero = 0;
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i]) {
      ASSERT_EQ(zero.cache[i], nan.cache[i]) << "data byte " << i << " depends on pad_fill";
      ASSERT_EQ(zero.cache[i], garbage.cache[i]) << "data byte " << i;
    } else {
      ++pad_bytes;
      ASSERT_EQ(zero.cache[i], 0) << "pad byte " << i;
      ASSERT_EQ(nan.cache[i], 0xff) << "pad byte " << i;
      garbage_nonzero += garbage.cache[i] != 0;
    }
  }
  EXPECT_GT(pad_bytes, 0);
  EXPECT_GT(garbage_nonzero, pad_bytes / 2);  // garbage really is random bytes
  // q: elements beyond d_qk are padding, the rest is data.
  for (size_t i = 0; i < zero.q.size(); ++i) {
    const bool pad =
        static_cast<int64_t>(i % static_cast<size_t>(zero.q_head_stride)) >= zero.d_qk();
    if (pad) {
      ASSERT_EQ(zero.q[i], 0);
      ASSERT_EQ(nan.q[i], 0x7fc0);
    } else {
      ASSERT_EQ(zero.q[i], nan.q[i]);
      ASSERT_EQ(zero.q[i], garbage.q[i]);
    }
  }
}

TEST(PadFill, Model1PaddedStrideAndUnusedScaleBytes) {
  Case c = small_case();
  c.geom.page_stride = 5 * 584 + 37;
  c.q_head_pad = 4;
  expect_fill_lands_only_on_padding(c);
}

TEST(PadFill, V32PaddedStride) {
  Case c = golden_v32();
  expect_fill_lands_only_on_padding(c);
}

TEST(PadFill, Model1NarrowNopeLeavesMoreUnusedScaleBytes) {
  Case c = small_case();
  c.geom.nope_dim = 128;  // 2 scales in an 8-byte scale row: 6 unused bytes per token
  c.geom.page_size = 61;
  expect_fill_lands_only_on_padding(c);
}

// Every batch stride is real: the rows sit at b * stride, and the gaps hold the pad fill
// (index gaps: slot 0, a slot out of every cache, random slots in range).
TEST(Materialize, BatchRowGapsAreStridedAndFilled) {
  Case c = testing::small_case();
  c.q_head_pad = 2;
  c.q_batch_pad = 5;
  c.out_batch_pad = 4;
  c.indices_row_pad = 3;
  c.lse_row_pad = 1;
  Case plain = c;
  plain.q_batch_pad = plain.out_batch_pad = plain.indices_row_pad = plain.lse_row_pad = 0;
  const MaterializedCase p = materialize(plain);
  for (Fill f : {Fill::kZero, Fill::kNaN, Fill::kGarbage}) {
    c.pad_fill = plain.pad_fill = f;
    const MaterializedCase m = materialize(c), q = materialize(plain);
    ASSERT_EQ(m.q_batch_stride, 3 * (m.d_qk() + 2) + 5);
    ASSERT_EQ(m.indices_batch_stride, 7 + 3);
    ASSERT_EQ(m.out_batch_stride, 3 * m.d_v() + 4);
    ASSERT_EQ(m.lse_batch_stride, 3 + 1);
    ASSERT_EQ(m.q.size(), size_t(2 * m.q_batch_stride));
    ASSERT_EQ(m.indices.size(), size_t(2 * 10));
    const mla::DecodeParams hp = m.host_params();
    EXPECT_EQ(hp.indices_batch_stride, 10);
    EXPECT_EQ(hp.lse_batch_stride, 4);
    EXPECT_EQ(hp.q_batch_stride, m.q_batch_stride);
    EXPECT_EQ(hp.out_batch_stride, m.out_batch_stride);
    for (int b = 0; b < 2; ++b) {
      for (int k = 0; k < 7; ++k) EXPECT_EQ(m.index_at(b, 0, k), q.index_at(b, 0, k));
      for (int h = 0; h < 3; ++h) {
        for (int d = 0; d < m.d_qk(); ++d) ASSERT_EQ(m.q_row(b, 0, h)[d], q.q_row(b, 0, h)[d]);
      }
      for (int64_t i = 3 * m.q_head_stride; i < m.q_batch_stride; ++i) {
        const uint16_t v = m.q[static_cast<size_t>(b * m.q_batch_stride + i)];
        if (f == Fill::kZero) {
          EXPECT_EQ(v, 0);
        }
        if (f == Fill::kNaN) {
          EXPECT_EQ(v, 0x7fc0);
        }
      }
      for (int k = 7; k < 10; ++k) {
        const int32_t v = m.index_at(b, 0, k);
        if (f == Fill::kZero) {
          EXPECT_EQ(v, 0);
        }
        if (f == Fill::kNaN) {
          EXPECT_EQ(v, std::numeric_limits<int32_t>::max());
        }
        if (f == Fill::kGarbage) {
          EXPECT_TRUE(v >= 0 && v < mla::num_slots(m.geom)) << v;
        }
      }
    }
    // The pads change the hash; a case without them hashes as it always did (golden hashes).
    EXPECT_NE(content_hash(m), content_hash(q));
  }
  EXPECT_EQ(p.q_batch_stride, 3 * p.q_head_stride);
  EXPECT_EQ(p.indices_batch_stride, p.topk);
}

// A worker names its decoded inputs (InputTags) for the CUDA backends' device copies; a copy or
// a move of a case must not carry the names, or a transformed copy (a poisoned variant) would
// pass for the original's bytes.
TEST(Materialize, InputTagsAreNeverCopied) {
  MaterializedCase m = materialize(golden_options());
  for (int i = 0; i < 8; ++i) m.input_tags.tag[i] = 100 + i;
  const MaterializedCase copy = m;
  MaterializedCase assigned;
  assigned = m;
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(copy.input_tags.tag[i], 0u) << i;
    EXPECT_EQ(assigned.input_tags.tag[i], 0u) << i;
    EXPECT_EQ(m.input_tags.tag[i], 100u + i) << i;
  }
  const MaterializedCase moved = std::move(m);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(moved.input_tags.tag[i], 0u) << i;
  EXPECT_EQ(content_hash(moved), content_hash(copy));  // the bytes themselves travel
}

}  // namespace
}  // namespace mlafuzz
