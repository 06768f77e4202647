// Case generators (see generators.h). Every weight below says which kernel bug it feeds.
#include "properties/generators.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <sstream>

#include "core/rng.h"
#include "mla/mla_params.h"
#include "mla/tiling.h"
#include "properties/gen_envelope.h"

namespace mlafuzz {
namespace {

namespace gen = rc::gen;
using rc::Gen;

// Largest cache a generated case materializes (bytes): keeps a case well under a millisecond to
// build on the CPU, while production shapes (topk 512 over 64-token pages) still fit.
constexpr int64_t kMaxCacheBytes = 12 << 20;

// Per-case choices that later steps depend on, carried beside the recipe. `logit` is the logit
// scale the values aim at, `kexp` the centre of the K magnitude as a ue8m0 exponent.
struct Draft {
  Case c;
  std::string family;
  std::string edge;  // the edge class of an "edge" case
  double logit = 1;
  int kexp = 127;
  bool explicit_indices = true;
  uint64_t bulk_seed = 0;  // CounterRng seed for index lists, permutations, sinks
  // The extra cache (docs/SPEC.md section 8), decided with the shape: its topk and page size (the
  // extra step draws the rest). extra_topk 0: none.
  int extra_topk = 0;
  int extra_page_size = 0;
};

bool extra_edge(const std::string& e) {
  return e == "extra-all-invalid" || e == "extra-length-0" || e == "shared-token" ||
         e == "one-cache-empty" || e == "extra-tiny-pages";
}

// B shrunk so that B * s_q * H * (topk + extra_topk) stays within the work budget.
int32_t batch_within(int32_t b, const Draft& d, int64_t max_work) {
  const int64_t per_row = int64_t{d.c.s_q} * d.c.heads * (d.c.topk + d.extra_topk);
  return static_cast<int32_t>(std::clamp<int64_t>(max_work / std::max<int64_t>(per_row, 1), 1, b));
}

template <typename F>
Gen<Draft> then(Gen<Draft> g, F f) {
  return gen::mapcat(std::move(g), std::move(f));
}

// Inclusive range. A configured maximum below a branch's lower end (say max topk 50 and the
// 101..max branch) collapses to lo; the caller clamps to the maximum afterwards. RapidCheck
// throws "Invalid range" on an empty range.
Gen<int> range(int lo, int hi) { return gen::inRange(lo, std::max(lo, hi) + 1); }
Gen<uint64_t> any_u64() { return gen::inRange<uint64_t>(0, std::numeric_limits<uint64_t>::max()); }

// ---- step 1: family and edge class ----
Gen<Draft> family_step(const GenConfig& cfg) {
  std::vector<std::string> fam = cfg.families.empty() ? all_generator_families() : cfg.families;
  auto has = [&](const char* f) { return std::find(fam.begin(), fam.end(), f) != fam.end(); };
  const double p = std::clamp(cfg.production_probability, 0.0, 1.0);
  const size_t w_prod = has("production") ? static_cast<size_t>(std::lround(1000 * p)) : 0;
  const size_t w_gen = has("general") ? static_cast<size_t>(std::lround(700 * (1 - p))) : 0;
  const size_t w_edge = has("edge") ? static_cast<size_t>(std::lround(300 * (1 - p))) : 0;
  if (w_prod + w_gen + w_edge == 0) {
    throw std::invalid_argument("GenConfig.families selects no generator family");
  }
  auto mk = [](std::string f) {
    return gen::map(gen::element<std::string>(
                        "all-invalid", "topk-length-0", "sink-inf", "page-boundary", "large-logits",
                        "ties", "extreme-scales", "tile-edges", "padded-dims", "empty-rows",
                        "duplicates", "tiny-pages", "extra-all-invalid", "extra-length-0",
                        "shared-token", "one-cache-empty", "extra-tiny-pages"),
                    [f](std::string edge) {
                      Draft d;
                      d.family = f;
                      if (f == "edge") d.edge = edge;
                      return d;
                    });
  };
  return gen::weightedOneOf<Draft>(
      {{w_gen, mk("general")}, {w_edge, mk("edge")}, {w_prod, mk("production")}});
}

// ---- step 2: layout and dimensions ----
Gen<Draft> geometry_step(Draft d, const GenConfig& cfg) {
  if (!cfg.model1 && !cfg.v32) throw std::invalid_argument("GenConfig allows no layout");
  std::vector<int> layouts = genv::layouts(cfg.envelope, cfg.model1, cfg.v32);
  if (d.family == "production") layouts = {layouts.front()};
  const bool other = cfg.other_dims && d.family != "production";
  const bool force_pad = d.edge == "padded-dims";
  return gen::map(
      gen::tuple(gen::elementOf(layouts),
                 // MODEL1 nope: 448 (production) most; multiples of 64 that are not powers of
                 // two give padded columns when the kernel pads to a power of two.
                 gen::weightedElement<int>({{force_pad ? 0u : 50u, 448},
                                            {12, 192},
                                            {12, 320},
                                            {10, 384},
                                            {6, 64},
                                            {5, 128},
                                            {5, 256},
                                            {5, 512}}),
                 gen::weightedElement<int>({{70, 64}, {10, 16}, {10, 32}, {10, 48}}),
                 gen::weightedElement<int>({{50, 512}, {20, 384}, {15, 256}, {15, 128}})),
      [d, other, force_pad, env = cfg.envelope](std::tuple<int, int, int, int> t) {
        Draft r = d;
        auto& g = r.c.geom;
        const auto [layout, nope1, rope, nope32] = t;
        if (layout == 0) {
          g.layout = mla::Layout::kModel1;
          g.scale_tile = 64;
          g.nope_dim = other ? nope1 : 448;
          if (force_pad && (g.nope_dim & (g.nope_dim - 1)) == 0) g.nope_dim = 448;
        } else {
          g.layout = mla::Layout::kV32;
          g.scale_tile = 128;
          g.nope_dim = other ? nope32 : 512;
          if (force_pad) g.nope_dim = 384;
        }
        g.rope_dim = other ? rope : 64;
        // Inside the envelope (the nearest admissible dims to the drawn ones).
        g.nope_dim = genv::nope_dim(env, g.layout, g.nope_dim);
        g.rope_dim = genv::rope_dim(env, g.rope_dim);
        return r;
      });
}

// H, topk, s_q and the extra cache snapped into the envelope (gen_envelope.h; no extra cache
// where it is refused), then B shrunk to the work budget and snapped too.
void fit_draft(const Envelope& env, Draft& d, int maxb, int maxh, int maxk, int maxs, int maxek,
               int64_t work) {
  Case& c = d.c;
  c.heads = genv::dim(env.heads, c.heads, maxh, "heads");
  c.topk = genv::dim(env.topk, c.topk, maxk, "topk");
  c.s_q = genv::dim(env.s_q, c.s_q, maxs, "s_q");
  if (d.extra_topk > 0) {
    if (env.refuses_feature(kFeatureExtraCache) || !env.extra_topk.nearest(1, 1, maxek) ||
        !env.extra_page_size.nearest(1, 1, 256)) {
      d.extra_topk = 0;
    } else {
      d.extra_topk = genv::dim(env.extra_topk, d.extra_topk, maxek, "extra_topk");
      d.extra_page_size = genv::dim(env.extra_page_size, std::clamp(d.extra_page_size, 1, 256), 256,
                                    "extra_page_size");
    }
  }
  c.batch = genv::dim(env.batch, batch_within(c.batch, d, work), maxb, "batch");
}

// ---- step 3: B, H, topk (small most of the time, production sizes reachable) ----
Gen<Draft> shape_step(Draft d, const GenConfig& cfg) {
  const int maxb = std::max(1, cfg.max_batch), maxh = std::max(1, cfg.max_heads),
            maxk = std::max(1, cfg.max_topk);
  const int maxs = std::max(1, cfg.max_s_q);
  const int maxek = std::max(1, cfg.max_extra_topk);
  const int64_t work = std::max<int64_t>(1, cfg.max_work);
  if (d.family == "production") {
    // FlashMLA's MODEL1 sparse-decode test configurations
    // (tests/test_flash_mla_sparse_decoding.py): H 64 or 128, s_q 1-4, main topk 128 over 256-token
    // pages, and an extra cache of topk 512 over 64-token pages or topk 1024 over 2-token pages, or
    // none; B as FlashMLA's grid (74 among them) where the work budget allows.
    return gen::map(
        gen::tuple(gen::weightedElement<int>(
                       {{20, 1}, {20, 2}, {20, 4}, {15, 16}, {10, 32}, {5, 74}, {10, 128}}),
                   gen::element(64, 128), gen::element(1, 2, 3, 4), gen::element(0, 1, 2)),
        [d, cfg, maxb, maxh, maxk, maxs, maxek, work](std::tuple<int, int, int, int> t) {
          Draft r = d;
          const auto [b, h, sq, extra] = t;
          r.c.heads = std::min(h, maxh);
          r.c.s_q = std::min(sq, maxs);
          r.c.topk = std::min(128, maxk);
          r.c.geom.page_size = 256;
          r.extra_topk = 0;
          if (cfg.extra_cache && extra > 0) {
            r.extra_topk = std::min(extra == 1 ? 512 : 1024, maxek);
            r.extra_page_size = extra == 1 ? 64 : 2;
          }
          r.c.batch = std::min(b, maxb);
          fit_draft(cfg.envelope, r, maxb, maxh, maxk, maxs, maxek, work);
          return r;
        });
  }
  const bool wants_extra = extra_edge(d.edge);
  const bool tile_edges = d.edge == "tile-edges";
  return gen::map(
      gen::tuple(
          gen::weightedOneOf<int>(
              {{60, gen::just(1)}, {30, range(2, 4)}, {8, range(5, 9)}, {2, range(1, maxb)}}),
          gen::weightedOneOf<int>({{45, range(1, 4)},
                                   {25, range(5, 16)},
                                   {10, gen::element(31, 32, 33)},
                                   {8, gen::element(63, 64)},
                                   {12, range(1, maxh)}}),
          gen::weightedOneOf<int>({{tile_edges ? 0u : 35u, range(1, 8)},
                                   {tile_edges ? 0u : 25u, range(9, 100)},
                                   {20, gen::element(31, 32, 33, 63, 64, 65, 127, 128, 129)},
                                   {tile_edges ? 0u : 10u, range(101, maxk)},
                                   {tile_edges ? 0u : 10u, gen::element(1, 2, 3)}}),
          // s_q: 1 most of the time (multi-token prediction 2-4 otherwise).
          gen::weightedOneOf<int>({{70, gen::just(1)}, {30, range(2, maxs)}}),
          // The extra cache: about a quarter of the cases (every extra-cache edge).
          gen::weightedElement<int>({{wants_extra ? 0u : 75u, 0}, {25, 1}}),
          gen::weightedOneOf<int>({{40, range(1, 8)},
                                   {25, range(9, 100)},
                                   {20, gen::element(31, 32, 33, 63, 64, 65, 127, 128, 129)},
                                   {15, range(101, maxek)}}),
          gen::weightedOneOf<int>(
              {{d.edge == "extra-tiny-pages" ? 100u : 20u, gen::element(1, 2, 3)},
               {d.edge == "extra-tiny-pages" ? 0u : 30u, gen::element(2, 61, 64, 256)},
               {d.edge == "extra-tiny-pages" ? 0u : 50u, range(1, 256)}})),
      [d, cfg, maxb, maxh, maxk, maxs, maxek,
       work](std::tuple<int, int, int, int, int, int, int> t) {
        Draft r = d;
        const auto [b, h, k, sq, extra, ek, ep] = t;
        r.c.heads = std::clamp(h, 1, maxh);
        r.c.topk = std::clamp(k, 1, maxk);
        r.c.s_q = std::clamp(sq, 1, maxs);
        r.extra_topk = cfg.extra_cache && extra ? std::clamp(ek, 1, maxek) : 0;
        r.extra_page_size = ep;
        r.c.batch = std::clamp(b, 1, maxb);
        fit_draft(cfg.envelope, r, maxb, maxh, maxk, maxs, maxek, work);
        return r;
      });
}

// ---- step 4: page size, stride, number of pages, physical order ----
Gen<Draft> pages_step(Draft d, const GenConfig& cfg) {
  const int maxp = std::clamp(cfg.max_page_size, 1, 4096);
  Gen<int> page_size =
      d.family == "production" ? gen::just(std::min(d.c.geom.page_size, maxp))
      : d.edge == "tiny-pages"
          ? gen::element(1, 2, 3)
          : gen::weightedOneOf<int>({{20, gen::element(61, 69)},    // FlashMLA's odd sizes
                                     {20, gen::element(1, 2, 64)},  // production extras
                                     {10, gen::just(256)},
                                     {15, gen::element(4, 8, 16, 32, 128)},
                                     {35, range(1, maxp)}});
  return gen::mapcat(page_size, [d, cfg, maxp](int p) {
    Draft r = d;
    auto& g = r.c.geom;
    g.page_size = genv::dim(cfg.envelope.page_size, std::clamp(p, 1, maxp), maxp, "page_size");
    const int64_t tb = mla::token_bytes(g);
    const int max_pages_mem =
        static_cast<int>(std::max<int64_t>(1, kMaxCacheBytes / (2 * g.page_size * tb)));
    const int maxpages = std::max(1, std::min(cfg.max_pages, max_pages_mem));
    // Enough slots for the production lists to be mostly distinct.
    const int prod_pages = std::clamp((2 * r.c.topk + g.page_size - 1) / g.page_size, 1, maxpages);
    Gen<int> pages = r.family == "production"
                         ? gen::just(prod_pages)
                         : gen::weightedOneOf<int>({{35, range(1, std::min(3, maxpages))},
                                                    {45, range(1, std::min(16, maxpages))},
                                                    {20, range(1, maxpages)}});
    return gen::map(
        gen::tuple(pages, gen::inRange(0, 4), range(1, 700), gen::inRange(0, 10), any_u64()),
        [r, env = cfg.envelope](std::tuple<int, int, int, int, uint64_t> t) {
          Draft x = r;
          auto& gg = x.c.geom;
          const auto [np, stride_kind, pad, order_kind, seed] = t;
          gg.num_pages = np;
          x.bulk_seed = seed;
          const int64_t mins = mla::min_page_stride(gg);
          switch (stride_kind) {
            case 0:
            case 1:
              gg.page_stride = 0;  // the layout's minimum
              break;
            case 2:
              gg.page_stride = mins + pad;  // odd padding
              break;
            default:  // SGLang: whole 576-byte rows (FlashMLA sm100 requires it)
              gg.page_stride = (mins + 575) / 576 * 576;
              break;
          }
          gg.page_stride = genv::page_stride(env, gg, gg.page_stride);
          // Physical order: shuffled 60% of the time (when there is a choice).
          x.c.page_order.clear();
          if (np > 1 && order_kind < 6) {
            std::vector<int32_t> perm(static_cast<size_t>(np));
            std::iota(perm.begin(), perm.end(), 0);
            CounterRng rng(seed, Stream::kGenerator, 1);
            for (size_t i = perm.size(); i > 1; --i) {
              std::swap(perm[i - 1],
                        perm[static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(i) - 1))]);
            }
            x.c.page_order = perm;
          }
          return x;
        });
  });
}

// The invalid entries of the out_of_range convention for a cache of geometry g: FlashMLA's test
// zoo (INT_MIN, -123456, -1, 114514, 1919810, 2147480000, INT_MAX) and the first slots past the
// cache (num_slots, num_slots + 1, one page past the end), those outside [0, num_slots) only.
std::vector<int32_t> out_of_range_zoo(const mla::CacheGeometry& g) {
  const int64_t n = mla::num_slots(g);
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  std::vector<int32_t> zoo;
  for (const int64_t v :
       {int64_t{std::numeric_limits<int32_t>::min()}, int64_t{-123456}, int64_t{-1}, n, n + 1,
        n + g.page_size, int64_t{114514}, int64_t{1919810}, int64_t{2147480000}, kMax}) {
    if ((v < 0 || v >= n) && v <= kMax) zoo.push_back(static_cast<int32_t>(v));
  }
  return zoo;
}

// Entries past topk_length (never valid) of about half the lists get out-of-range values:
// a kernel that loads an entry before it checks the length reads past the cache. From their
// own stream (CounterRng(seed, kGenerator, stream)): the other draws stay what they were.
void past_length_zoo(const mla::CacheGeometry& g, const std::vector<int32_t>& lengths, int32_t s_q,
                     uint64_t seed, uint64_t stream, std::vector<std::vector<int32_t>>& lists) {
  const std::vector<int32_t> zoo = out_of_range_zoo(g);
  CounterRng rng(seed, Stream::kGenerator, stream);
  for (size_t q = 0; q < lists.size(); ++q) {
    if (!rng.bernoulli(0.5)) continue;
    auto& row = lists[q];
    const int32_t len = lengths[q / static_cast<size_t>(s_q)];
    for (size_t k = static_cast<size_t>(std::max(0, len)); k < row.size(); ++k) {
      row[k] = zoo[static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(zoo.size()) - 1))];
    }
  }
}

// One explicit index row: a base pattern, then -1 entries. `len` is the row's topk_length or
// -1; in_prefix invalid patterns apply to the kept prefix.
std::vector<int32_t> index_row(CounterRng& rng, const Case& c, int pattern, int invalid,
                               mla::InvalidIndexRule rule) {
  const bool any_negative = rule == mla::InvalidIndexRule::kAnyNegative;
  const int64_t n = mla::num_slots(c.geom);
  const int64_t P = c.geom.page_size;
  const int32_t topk = c.topk;
  std::vector<int32_t> row(static_cast<size_t>(topk));
  auto slot = [&]() { return static_cast<int32_t>(rng.uniform_int(0, n - 1)); };
  switch (pattern) {
    case 0:  // uniform random (duplicates possible when topk > slots)
      for (auto& v : row) v = slot();
      break;
    case 1: {  // one run of consecutive tokens, crossing page boundaries
      const int64_t start = rng.uniform_int(0, n - 1);
      for (int32_t k = 0; k < topk; ++k)
        row[static_cast<size_t>(k)] = static_cast<int32_t>((start + k) % n);
      break;
    }
    case 2:  // first and last slots of pages: the addressing corners
      for (auto& v : row) {
        const int64_t page = rng.uniform_int(0, c.geom.num_pages - 1);
        v = static_cast<int32_t>(page * P + (rng.bernoulli(0.5) ? 0 : P - 1));
      }
      break;
    case 3: {  // runs straddling a page boundary: last two slots of one page, first of the next
      for (int32_t k = 0; k < topk; ++k) {
        const int64_t page = rng.uniform_int(0, c.geom.num_pages - 1);
        const int64_t start = page * P + P - 1 - rng.uniform_int(0, std::min<int64_t>(P - 1, 2));
        const int64_t len = std::min<int64_t>(topk - k, rng.uniform_int(1, 5));
        for (int64_t i = 0; i < len; ++i) {
          row[static_cast<size_t>(k + i)] = static_cast<int32_t>((start + i) % n);
        }
        k += static_cast<int32_t>(len) - 1;
      }
      break;
    }
    default: {  // heavy duplicates: a few distinct tokens repeated
      const int distinct = static_cast<int>(rng.uniform_int(1, 3));
      std::vector<int32_t> pool(static_cast<size_t>(distinct));
      for (auto& v : pool) v = slot();
      for (auto& v : row) v = pool[static_cast<size_t>(rng.uniform_int(0, distinct - 1))];
      break;
    }
  }
  const std::vector<int32_t> zoo = rule == mla::InvalidIndexRule::kOutOfRange
                                       ? out_of_range_zoo(c.geom)
                                       : std::vector<int32_t>{};
  auto invalid_value = [&]() -> int32_t {
    if (!zoo.empty()) {
      return zoo[static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(zoo.size()) - 1))];
    }
    if (!any_negative || rng.bernoulli(0.5)) return -1;
    return rng.bernoulli(0.5) ? std::numeric_limits<int32_t>::min()
                              : -static_cast<int32_t>(rng.uniform_int(2, 1000));
  };
  switch (invalid) {
    case 0:
      break;
    case 1:  // scattered
      for (auto& v : row) {
        if (rng.bernoulli(0.3)) v = invalid_value();
      }
      break;
    case 2: {  // leading
      const auto cnt = rng.uniform_int(1, topk);
      for (int64_t k = 0; k < cnt; ++k) row[static_cast<size_t>(k)] = invalid_value();
      break;
    }
    case 3: {  // trailing (the sorted-top-k shape)
      const auto cnt = rng.uniform_int(1, topk);
      for (int64_t k = topk - cnt; k < topk; ++k) row[static_cast<size_t>(k)] = invalid_value();
      break;
    }
    default:  // all
      for (auto& v : row) v = invalid_value();
      break;
  }
  return row;
}

// ---- step 5: index lists and topk_length ----
Gen<Draft> indices_step(Draft d, const GenConfig& cfg) {
  const bool edge_all_invalid = d.edge == "all-invalid" || d.edge == "empty-rows";
  const bool allow_len = genv::topk_length(cfg.envelope);
  const bool edge_len0 = d.edge == "topk-length-0" && allow_len;
  return gen::map(
      gen::tuple(gen::weightedElement<int>({{40, 0}, {20, 1}, {15, 2}, {15, 3}, {10, 4}}),
                 gen::weightedElement<int>({{edge_all_invalid ? 0u : 50u, 0},
                                            {20, 1},
                                            {10, 2},
                                            {10, 3},
                                            {edge_all_invalid ? 60u : 10u, 4}}),
                 gen::weightedElement<int>({{edge_len0 ? 0u : 60u, 0}, {allow_len ? 40u : 0u, 1}}),
                 gen::element(0, 1, 2), gen::element(0.0, 0.1, 0.5, 1.0),
                 gen::element(0.0, 0.0, 0.05, 0.3)),
      [d, edge_all_invalid, edge_len0](std::tuple<int, int, int, int, double, double> t) {
        Draft r = d;
        Case& c = r.c;
        const auto [pattern_bias, invalid_kind, has_len, rule, inv_frac, dup_frac] = t;
        const mla::InvalidIndexRule rule_of_lists = c.conventions.invalid_index;
        CounterRng rng(r.bulk_seed, Stream::kGenerator, 2);
        r.explicit_indices = r.family != "production" && int64_t{c.query_rows()} * c.topk <= 4096;
        if (r.explicit_indices) {
          c.indices.clear();
          for (int32_t b = 0; b < c.query_rows(); ++b) {  // one list per query token
            // Rows differ: each picks its own pattern around the case's bias.
            const int pattern =
                rng.bernoulli(0.6)
                    ? (r.edge == "duplicates"      ? 4
                       : r.edge == "page-boundary" ? 2 + static_cast<int>(rng.uniform_int(0, 1))
                                                   : pattern_bias)
                    : static_cast<int>(rng.uniform_int(0, 4));
            int inv = invalid_kind;
            if (r.edge == "empty-rows")
              inv = rng.bernoulli(0.5) ? 4 : 0;  // mixed empty rows
            else if (!edge_all_invalid && rng.bernoulli(0.3))
              inv = static_cast<int>(rng.uniform_int(0, 4));
            c.indices.push_back(index_row(rng, c, pattern, inv, rule_of_lists));
          }
        } else {
          c.indices.clear();
          c.index_spec.rule = static_cast<IndexRule>(rule);
          c.index_spec.invalid_fraction = edge_all_invalid ? 1.0 : inv_frac;
          c.index_spec.duplicate_fraction = dup_frac;
        }
        c.topk_length.reset();
        if (has_len || edge_len0) {
          std::vector<int32_t> len(static_cast<size_t>(c.batch));
          for (auto& l : len) {
            const auto k = edge_len0 ? (rng.bernoulli(0.6) ? 0 : 1) : rng.uniform_int(0, 3);
            l = k == 0 ? 0 : k == 1 ? static_cast<int32_t>(rng.uniform_int(0, c.topk)) : c.topk;
          }
          c.topk_length = len;
        }
        if (rule_of_lists == mla::InvalidIndexRule::kOutOfRange && r.explicit_indices &&
            c.topk_length) {
          past_length_zoo(c.geom, *c.topk_length, c.s_q, r.bulk_seed, 6, c.indices);
        }
        return r;
      });
}

// V32 scales as vLLM's writers store them (fp32: any positive finite float) in about half the
// V32 cases the envelope allows them in, drawn from their own stream (CounterRng(bulk_seed,
// kGenerator, 5)): every other draw stays what it was. Fixed scales take a mantissa among the
// edges that separate readers; random ones sometimes reach down to subnormal scales (exponent
// byte 0) and tiny normals.
void v32_scale_convention(const Envelope& env, Draft& r, int mode) {
  Case& c = r.c;
  if (c.geom.layout != mla::Layout::kV32) return;
  CounterRng rng(r.bulk_seed, Stream::kGenerator, 5);
  const ScaleConvention drawn =
      rng.bernoulli(0.5) ? ScaleConvention::kFp32 : ScaleConvention::kPowerOfTwo;
  c.scales.convention = genv::v32_scales(env, drawn);
  if (c.scales.convention != ScaleConvention::kFp32) return;
  if (mode == 1) {
    static const float kMantissas[] = {
        1.5f,  std::nextafter(2.0f, 0.0f), std::nextafter(1.0f, 2.0f),
        1.25f, 1.0f + 0x1p-8f + 0x1p-16f,  1.0f + 0x1p-11f + 0x1p-22f};
    c.scales.mantissa = kMantissas[rng.uniform_int(0, 5)];
  } else if (mode == 2 && rng.bernoulli(r.edge == "extreme-scales" ? 0.5 : 0.125)) {
    c.scales.exp_lo = 0;
  }
}

// ---- step 6: scales and values ----
// The logit scale L and the K exponent centre are chosen first; q and rope magnitudes follow so
// that |logits| ~ L whatever the K magnitude: exact bf16 dequantization needs e >= 3, finite
// fp32 P*V sums need 448 * 2^(e-127) * topk < 2^127, and recipe magnitudes stay <= 1e30,
// so the centre stays in [3, 226].
Gen<Draft> values_step(Draft d, const GenConfig& cfg) {
  const bool large = d.edge == "large-logits";
  const bool extreme = d.edge == "extreme-scales";
  const bool ties = d.edge == "ties";
  return gen::map(
      gen::tuple(gen::weightedElement<double>({{large ? 0u : 60u, 1.0},
                                               {large ? 0u : 15u, 0.125},
                                               {large ? 0u : 10u, 8.0},
                                               {large ? 50u : 10u, 64.0},
                                               {large ? 50u : 5u, 512.0}}),
                 gen::weightedOneOf<int>(
                     {{extreme ? 0u : 70u, gen::just(127)},
                      {extreme ? 0u : 20u, range(100, 160)},
                      {extreme ? 100u : 10u, gen::element(3, 4, 10, 30, 200, 220, 226)}}),
                 gen::weightedElement<int>({{45, 0}, {25, 1}, {30, 2}}),  // writer, fixed, random
                 range(0, 6),                                             // random-exponent spread
                 gen::weightedElement<int>({{ties ? 0u : 70u, 0},         // q dist: normal
                                            {10, 1},                      // uniform
                                            {10, 2},                      // small ints
                                            {ties ? 0u : 2u, 3},          // zeros
                                            {ties ? 100u : 8u, 4}}),      // ties
                 gen::weightedElement<int>(
                     {{ties ? 0u : 70u, 0}, {10, 1}, {10, 2}, {2, 3}, {ties ? 100u : 8u, 4}}),
                 gen::weightedElement<int>({{70, 0}, {15, 2}, {10, 3}, {5, 4}}),  // rope dist
                 gen::weightedElement<double>({{80, 0.0}, {10, 0.02}, {10, 0.1}}), any_u64()),
      [d, cfg](std::tuple<double, int, int, int, int, int, int, double, uint64_t> t) {
        Draft r = d;
        Case& c = r.c;
        const auto [L, kexp0, mode, spread, qd, kd, rd, special, seed] = t;
        // The writer's own exponent is about kexp - 7 for these values: keep it >= 3 (exact bf16
        // dequantization) by lifting the centre for writer scales.
        const int kexp = mode == 0 ? std::max(kexp0, 12) : kexp0;
        r.logit = L;
        r.kexp = kexp;
        const double kmag = std::ldexp(1.0, kexp - 127);
        const int sp = mode == 2 ? std::min(spread, std::min(kexp - 3, 230 - kexp)) : 0;
        // q magnitude: logits ~ L given |K| ~ kmag (a power of two: exact in bf16).
        // Capped at 2^99: recipes keep magnitudes <= 1e30 (finite 6-sigma tails and 4x specials).
        const int qexp =
            std::min(99, static_cast<int>(std::lround(std::log2(L))) - (kexp - 127) - sp);
        c.q_values = {static_cast<ValueDist>(qd), std::ldexp(1.0, qexp), 0.0};
        c.kv_values = {static_cast<ValueDist>(kd), kmag, cfg.special_values ? special : 0.0};
        c.rope_values = {static_cast<ValueDist>(rd), kmag, cfg.special_values ? special / 2 : 0.0};
        if (cfg.special_values && special > 0) c.q_values.special_fraction = special / 2;
        switch (mode) {
          case 0:
            c.scales = {ScaleMode::kWriter, 127, 127};
            break;
          case 1:
            // Fixed exponent just above the writer's choice for N(0, kmag) values (amax ~ 4
            // kmag): no saturation, codes of a few significant bits.
            c.scales = {ScaleMode::kFixed, std::clamp(kexp - 6, 3, 254), 0};
            c.scales.exp_hi = c.scales.exp_lo;
            break;
          default:
            // Stored exponents random per token and tile around the writer's: K magnitudes mix.
            c.scales = {ScaleMode::kRandom, std::clamp(kexp - 7 - sp, 3, 230),
                        std::clamp(kexp - 7 + sp, 3, 230)};
            c.kv_values.magnitude = kmag;
            break;
        }
        v32_scale_convention(cfg.envelope, r, mode);
        c.data_seed = seed;
        return r;
      });
}

// ---- step 7: sinks, scale, conventions, padding, fills ----
Gen<Draft> extras_step(Draft d, const GenConfig& cfg) {
  const bool sink_edge = d.edge == "sink-inf";
  const bool row_pads = cfg.row_pads;
  return gen::map(
      gen::tuple(
          gen::weightedElement<int>({{(cfg.sinks && !sink_edge) ? 55u : (sink_edge ? 0u : 100u), 0},
                                     {cfg.sinks ? 25u : 0u, 1},
                                     {cfg.sinks ? (sink_edge ? 100u : 20u) : 0u, 2}}),
          gen::weightedElement<int>({{80, 0}, {20, 1}}),  // explicit sm_scale
          gen::weightedElement<int>({{cfg.non_default_conventions ? 25u : 0u, 1}, {75, 0}}),
          gen::weightedElement<int>({{75, 0}, {25, 1}}),  // q/out head padding
          gen::weightedElement<int>(
              {{40, 0}, {cfg.poison_fills ? 30u : 0u, 1}, {cfg.poison_fills ? 30u : 0u, 2}})),
      [d, row_pads, env = cfg.envelope](std::tuple<int, int, int, int, int> t) {
        Draft r = d;
        Case& c = r.c;
        const auto [sink_drawn, scale_kind, conv_kind, pad_kind, fill] = t;
        const int sink_kind = genv::sink_kind(env, sink_drawn);
        CounterRng rng(r.bulk_seed, Stream::kGenerator, 3);
        c.sink.reset();
        if (sink_kind > 0) {
          std::vector<double> s(static_cast<size_t>(c.heads));
          for (auto& v : s) {
            // Finite sinks on the logits' scale, in steps of 1/16 (exact in fp32).
            v = std::round(rng.uniform_int(-48, 48) * r.logit) / 16.0;
            if (sink_kind == 2) {
              const auto k = rng.uniform_int(0, 3);
              if (k == 0) v = std::numeric_limits<double>::infinity();
              if (k == 1) v = -std::numeric_limits<double>::infinity();
            }
          }
          c.sink = s;
        }
        c.sm_scale.reset();
        if (scale_kind) c.sm_scale = std::ldexp(1.0, static_cast<int>(rng.uniform_int(-6, 0)));
        c.conventions = {};
        if (conv_kind) {
          c.conventions.invalid_index = rng.bernoulli(0.5) ? mla::InvalidIndexRule::kAnyNegative
                                                           : mla::InvalidIndexRule::kMinusOneOnly;
          c.conventions.empty_lse =
              rng.bernoulli(0.5) ? mla::EmptyRowLse::kNegInf : mla::EmptyRowLse::kPosInf;
          c.conventions.sink_in_lse = rng.bernoulli(0.5);
        }
        c.q_head_pad = pad_kind ? static_cast<int32_t>(rng.uniform_int(1, 70)) : 0;
        c.out_head_pad = pad_kind ? static_cast<int32_t>(rng.uniform_int(0, 70)) : 0;
        c.pad_fill = static_cast<Fill>(fill);
        // Batch-row gaps, from their own stream so that every other draw stays what it was:
        // about one case in four pads some rows, each stride independently (odd sizes too, so
        // that an aligned-only fast path is exercised beside the general one).
        c.q_batch_pad = c.out_batch_pad = c.indices_row_pad = c.lse_row_pad = 0;
        CounterRng prng(r.bulk_seed, Stream::kGenerator, 4);
        if (row_pads && prng.bernoulli(0.25)) {
          const auto pad = [&](int64_t hi) {
            return prng.bernoulli(0.5) ? static_cast<int32_t>(prng.uniform_int(1, hi)) : 0;
          };
          c.q_batch_pad = pad(96);
          c.out_batch_pad = pad(96);
          c.indices_row_pad = pad(72);
          c.lse_row_pad = pad(9);
          if (c.q_batch_pad + c.out_batch_pad + c.indices_row_pad + c.lse_row_pad == 0) {
            c.indices_row_pad = static_cast<int32_t>(prng.uniform_int(1, 72));
          }
        }
        genv::conventions(env, c.conventions);
        genv::head_padding(env, c);
        genv::row_padding(env, c);
        return r;
      });
}

// Conventions are drawn last but the index step needs them (negative values other than -1 are
// only generated under kAnyNegative): draw them first, carried in the recipe.
// out_of_range (indices past the cache) only where the envelope names it: its weight is 0
// otherwise, and the draws of every other case stay what they were.
Gen<Draft> conventions_first(Draft d, const GenConfig& cfg) {
  const bool oor =
      cfg.non_default_conventions && cfg.envelope.allows(mla::InvalidIndexRule::kOutOfRange);
  return gen::map(gen::weightedElement<int>(
                      {{cfg.non_default_conventions ? 15u : 0u, 1}, {85, 0}, {oor ? 20u : 0u, 2}}),
                  [d, env = cfg.envelope](int rule) {
                    Draft r = d;
                    r.c.conventions.invalid_index =
                        genv::invalid_index(env, static_cast<mla::InvalidIndexRule>(rule));
                    return r;
                  });
}

// ---- step 8: the extra cache (docs/SPEC.md section 8) ----
// Its geometry (the main layout and dims, its own page size, count, stride and order), its lists
// (explicit, from the main generator's patterns, or a rule), an optional extra_topk_length, and
// the edges: an extra list all invalid, extra_topk_length 0, one token in both lists (values
// shared and slots repeated), one cache empty and the other not.
// The extra cache's geometry (`g`: the main cache's dims with the extra page size and count):
// pages (a production case: enough for twice its list), stride, physical page order.
ExtraCache extra_geometry(const Draft& r, const GenConfig& cfg, int stride_kind, int order_kind,
                          CounterRng& rng, mla::CacheGeometry& g) {
  ExtraCache e;
  e.topk = r.extra_topk;
  e.page_size = std::max(1, r.extra_page_size);
  g = r.c.geom;
  g.page_size = e.page_size;
  const int64_t tb = mla::token_bytes(g);
  const int max_pages_mem =
      static_cast<int>(std::max<int64_t>(1, kMaxCacheBytes / (2 * g.page_size * tb)));
  const int maxpages = std::max(1, std::min(std::max(cfg.max_pages, 2048), max_pages_mem));
  // Enough slots for the lists to be mostly distinct; production: twice the list.
  const int want = std::clamp((2 * e.topk + e.page_size - 1) / e.page_size, 1, maxpages);
  e.num_pages = r.family == "production"
                    ? want
                    : static_cast<int32_t>(rng.uniform_int(1, std::max(1, std::min(want, 16))));
  g.num_pages = e.num_pages;
  const int64_t mins = mla::min_page_stride(g);
  e.page_stride = stride_kind < 2    ? 0
                  : stride_kind == 2 ? mins + rng.uniform_int(1, 700)
                                     : (mins + 575) / 576 * 576;
  if (e.num_pages > 1 && order_kind < 6) {
    e.page_order.resize(static_cast<size_t>(e.num_pages));
    std::iota(e.page_order.begin(), e.page_order.end(), 0);
    for (size_t i = e.page_order.size(); i > 1; --i) {
      std::swap(e.page_order[i - 1],
                e.page_order[static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(i) - 1))]);
    }
  }
  return e;
}

// The extra lists (explicit when the case is small, else an index rule) and the edge classes
// that empty one of the two caches; true when every main list is to be emptied.
bool extra_lists(const Draft& r, const mla::CacheGeometry& g, int rule, CounterRng& rng,
                 ExtraCache& e) {
  const Case& c = r.c;
  const mla::InvalidIndexRule rule_of_lists = c.conventions.invalid_index;
  const bool shared = r.edge == "shared-token";
  e.same_values = shared || (r.family != "production" && rng.bernoulli(0.1));
  Case view = c;  // the extra cache as a main cache, for index_row
  view.geom = g;
  view.topk = e.topk;
  const bool all_invalid = r.edge == "extra-all-invalid";
  // One cache empty and the other not: either every main list or every extra list invalid.
  const bool empty_main = r.edge == "one-cache-empty" && rng.bernoulli(0.5);
  const bool empty_extra = all_invalid || (r.edge == "one-cache-empty" && !empty_main);
  if (r.family != "production" && int64_t{c.query_rows()} * e.topk <= 4096) {
    for (int32_t q = 0; q < c.query_rows(); ++q) {
      const int pattern = static_cast<int>(rng.uniform_int(0, 4));
      int inv = empty_extra ? 4 : rng.bernoulli(0.7) ? 0 : static_cast<int>(rng.uniform_int(1, 4));
      std::vector<int32_t> row = index_row(rng, view, pattern, inv, rule_of_lists);
      if (shared && !c.indices.empty()) {
        // Copy main slots that exist in the extra cache: the same token in both lists.
        const auto& main = c.indices[static_cast<size_t>(q)];
        const int64_t slots = mla::num_slots(g);
        for (size_t k = 0; k < row.size() && k < main.size(); ++k) {
          if (main[k] >= 0 && main[k] < slots && rng.bernoulli(0.5)) row[k] = main[k];
        }
      }
      e.indices.push_back(std::move(row));
    }
  } else {
    e.index_spec.rule = static_cast<IndexRule>(rule);
    e.index_spec.invalid_fraction = empty_extra ? 1.0 : rng.bernoulli(0.5) ? 0.0 : 0.1;
  }
  return empty_main;
}

// Empties the main lists when asked; the extra topk_length (and, under the out-of-range
// convention, the entries past it).
void extra_lengths(Draft& r, const mla::CacheGeometry& g, const GenConfig& cfg, bool empty_main,
                   int len_kind, uint64_t seed, CounterRng& rng, ExtraCache& e) {
  Case& c = r.c;
  const mla::InvalidIndexRule rule_of_lists = c.conventions.invalid_index;
  if (empty_main) {
    if (!c.indices.empty()) {
      for (auto& row : c.indices) std::fill(row.begin(), row.end(), -1);
    } else {
      c.index_spec.invalid_fraction = 1.0;
    }
  }
  if (!cfg.envelope.refuses_feature(kFeatureExtraTopkLength) &&
      (len_kind < 2 || r.edge == "extra-length-0")) {
    std::vector<int32_t> len(static_cast<size_t>(c.batch));
    for (auto& l : len) {
      const auto k =
          r.edge == "extra-length-0" ? (rng.bernoulli(0.6) ? 0 : 1) : rng.uniform_int(0, 3);
      l = k == 0 ? 0 : k == 1 ? static_cast<int32_t>(rng.uniform_int(0, e.topk)) : e.topk;
    }
    e.topk_length = len;
    if (rule_of_lists == mla::InvalidIndexRule::kOutOfRange && !e.indices.empty()) {
      past_length_zoo(g, len, c.s_q, seed, 7, e.indices);
    }
  }
}

Gen<Draft> extra_step(Draft d, const GenConfig& cfg) {
  return gen::map(gen::tuple(gen::inRange(0, 4), gen::inRange(0, 10), gen::inRange(0, 5),
                             gen::element(0, 1, 2), any_u64()),
                  [d, cfg](std::tuple<int, int, int, int, uint64_t> t) {
                    Draft r = d;
                    Case& c = r.c;
                    c.extra.reset();
                    if (r.extra_topk <= 0) return r;
                    const auto [stride_kind, order_kind, len_kind, rule, seed] = t;
                    CounterRng rng(seed, Stream::kGenerator, 4);
                    mla::CacheGeometry g;
                    ExtraCache e = extra_geometry(r, cfg, stride_kind, order_kind, rng, g);
                    const bool empty_main = extra_lists(r, g, rule, rng, e);
                    extra_lengths(r, g, cfg, empty_main, len_kind, seed, rng, e);
                    c.extra = std::move(e);
                    return r;
                  });
}

std::string describe(const Draft& d) {
  std::ostringstream os;
  os << "generated: family=" << d.family;
  if (!d.edge.empty()) os << " edge=" << d.edge;
  return os.str();
}

}  // namespace

std::vector<std::string> all_generator_families() { return {"general", "edge", "production"}; }

Gen<Case> case_generator(const GenConfig& cfg) {
  Gen<Draft> g = family_step(cfg);
  g = then(g, [cfg](Draft d) { return geometry_step(d, cfg); });
  g = then(g, [cfg](Draft d) { return shape_step(d, cfg); });
  g = then(g, [cfg](Draft d) { return pages_step(d, cfg); });
  g = then(g, [cfg](Draft d) { return conventions_first(d, cfg); });
  g = then(g, [cfg](Draft d) { return indices_step(d, cfg); });
  g = then(g, [cfg](Draft d) { return extra_step(d, cfg); });
  g = then(g, [cfg](Draft d) { return values_step(d, cfg); });
  g = then(g, [cfg](Draft d) {
    // extras_step redraws conventions; keep the invalid-index rule the indices were made for.
    const auto rule = d.c.conventions.invalid_index;
    return gen::map(extras_step(d, cfg), [rule](Draft x) {
      x.c.conventions.invalid_index = rule;
      return x;
    });
  });
  return gen::map(g, [](Draft d) {
    d.c.name = describe(d);
    return d.c;
  });
}

rc::Random case_random(uint64_t seed, uint64_t case_index) {
  const uint64_t a = splitmix64(seed ^ 0x6d6c6166757a7aull);  // "mlafuzz"
  const uint64_t b = splitmix64(a ^ splitmix64(case_index));
  return rc::Random(rc::Random::Key{a, b, splitmix64(b), splitmix64(b + 1)});
}

Case generate_case(uint64_t seed, uint64_t case_index, const GenConfig& cfg,
                   std::vector<std::string>* tags) {
  if (const auto why = cfg.envelope.empty_reason(cfg.max_batch, cfg.max_heads, cfg.max_topk,
                                                 cfg.max_page_size)) {
    throw std::invalid_argument("the envelope admits no case: " + *why);
  }
  Case c = case_generator(cfg)(case_random(seed, case_index), rc::kNominalSize).value();
  std::ostringstream os;
  os << "seed " << seed << " case " << case_index;
  c.description = os.str();
  validate(c);  // a generator bug must surface here, not as a backend failure
  if (const auto why = cfg.envelope.rejects(c)) {
    throw std::logic_error("generator bug: seed " + std::to_string(seed) + " case " +
                           std::to_string(case_index) + " left the envelope: " + *why);
  }
  if (tags) *tags = classify_case(c);
  return c;
}

namespace {

// The generator family and edge class the case name records.
void family_tags(const Case& c, std::vector<std::string>& t) {
  auto fam = c.name.find("family=");
  if (fam != std::string::npos) {
    t.push_back(c.name.substr(fam, c.name.find(' ', fam) - fam));
    auto e = c.name.find("edge=");
    if (e != std::string::npos) t.push_back(c.name.substr(e));
  }
}

// Layout, dims, paging and shape classes.
void shape_tags(const Case& c, std::vector<std::string>& t) {
  const auto& g = c.geom;
  t.push_back(std::string("layout=") + layout_name(g.layout));
  t.push_back("nope=" + std::to_string(g.nope_dim));
  if (mla::padded_nope(g.nope_dim) != g.nope_dim) t.push_back("nope=padded");
  if (g.rope_dim != 64) t.push_back("rope=" + std::to_string(g.rope_dim));
  t.push_back("page_size=" + std::to_string(g.page_size));
  t.push_back((g.page_size & (g.page_size - 1)) == 0 ? "page_size=pow2" : "page_size=non-pow2");
  const int64_t mins = mla::min_page_stride(g);
  t.push_back(g.page_stride == 0 || g.page_stride == mins ? "stride=min" : "stride=padded");
  t.push_back(c.page_order.empty() ? "page_order=identity" : "page_order=shuffled");
  t.push_back(g.num_pages == 1 ? "pages=1" : g.num_pages <= 3 ? "pages=few" : "pages=many");
  t.push_back(c.batch == 1 ? "B=1" : c.batch <= 4 ? "B=2-4" : "B>4");
  t.push_back(c.heads == 1 ? "H=1" : c.heads <= 16 ? "H=2-16" : "H>16");
  t.push_back(c.topk <= 8 ? "topk<=8" : c.topk <= 128 ? "topk<=128" : "topk>128");
  if (c.topk % mla::kMmaTokenTile != 0) t.push_back("topk%64!=0");
  if ((c.heads == 64 || c.heads == 128) && c.topk == 128 && c.geom.page_size == 256) {
    t.push_back("shape=production");
  }
  if (c.heads == 128) t.push_back("H=128");
  if (c.s_q > 1) t.push_back("s_q>1");
}

// The extra cache of the production decode.
void extra_cache_tags(const Case& c, std::vector<std::string>& t) {
  if (c.extra) {
    t.push_back("extra");
    t.push_back("extra_page_size=" + std::to_string(c.extra->page_size));
    if (c.extra->same_values) t.push_back("extra=same_values");
    if (c.extra->topk_length) {
      for (int32_t l : *c.extra->topk_length) {
        if (l == 0) {
          t.push_back("extra_topk_length=0");
          break;
        }
      }
    }
  }
}

// Index features (explicit lists only; rule-based lists are tagged by their rule).
void index_tags(const Case& c, std::vector<std::string>& t) {
  const auto& g = c.geom;
  if (!c.indices.empty()) {
    bool inv = false, dup = false, all_inv_row = false, edge_slot = false;
    for (const auto& row : c.indices) {
      bool row_all = true;
      std::vector<int32_t> seen;
      for (int32_t v : row) {
        const bool invalid = !mla::index_valid_in(v, 0, -1, c.conventions, mla::num_slots(g));
        if (invalid) {
          inv = true;
          continue;
        }
        row_all = false;
        if (v % g.page_size == 0 || v % g.page_size == g.page_size - 1) edge_slot = true;
        if (std::find(seen.begin(), seen.end(), v) != seen.end()) dup = true;
        if (seen.size() < 512) seen.push_back(v);
      }
      all_inv_row = all_inv_row || row_all;
    }
    if (inv) t.push_back("has_invalid");
    if (all_inv_row) t.push_back("all_invalid_row");
    if (dup) t.push_back("duplicates");
    if (edge_slot) t.push_back("page_edge_slot");
    t.push_back("indices=explicit");
  } else {
    t.push_back(std::string("indices=") + index_rule_name(c.index_spec.rule));
    if (c.index_spec.invalid_fraction > 0) t.push_back("has_invalid");
    if (c.index_spec.invalid_fraction >= 1) t.push_back("all_invalid_row");
    if (c.index_spec.duplicate_fraction > 0) t.push_back("duplicates");
  }
}

// topk_length and attention sinks.
void length_and_sink_tags(const Case& c, std::vector<std::string>& t) {
  if (c.topk_length) {
    bool zero = false, partial = false;
    for (int32_t l : *c.topk_length) {
      zero = zero || l == 0;
      partial = partial || (l > 0 && l < c.topk);
    }
    t.push_back("topk_length");
    if (zero) t.push_back("topk_length=0");
    if (partial) t.push_back("topk_length=partial");
  }
  if (c.sink) {
    bool pinf = false, ninf = false;
    for (double s : *c.sink) {
      pinf = pinf || s == std::numeric_limits<double>::infinity();
      ninf = ninf || s == -std::numeric_limits<double>::infinity();
    }
    t.push_back("sink");
    if (pinf) t.push_back("sink=+inf");
    if (ninf) t.push_back("sink=-inf");
  }
}

// Scales, values, conventions, padding and fills.
void value_tags(const Case& c, std::vector<std::string>& t) {
  t.push_back(std::string("scales=") + scale_mode_name(c.scales.mode));
  if (c.scales.convention == ScaleConvention::kFp32) t.push_back("scales=fp32");
  if (c.conventions.invalid_index == mla::InvalidIndexRule::kOutOfRange) {
    t.push_back("invalid=out_of_range");
  }
  if (c.scales.mode != ScaleMode::kWriter && (c.scales.exp_lo < 40 || c.scales.exp_hi > 200)) {
    t.push_back("scales=extreme");
  }
  t.push_back(std::string("values=") + value_dist_name(c.kv_values.dist));
  if (c.kv_values.special_fraction > 0) t.push_back("values=special");
  if (c.q_values.magnitude * c.kv_values.magnitude >= 32) t.push_back("values=large-logits");
  if (c.conventions.invalid_index != mla::InvalidIndexRule::kMinusOneOnly ||
      c.conventions.empty_lse != mla::EmptyRowLse::kPosInf || c.conventions.sink_in_lse) {
    t.push_back("conventions=non-default");
  }
  if (c.q_head_pad > 0 || c.out_head_pad > 0) t.push_back("head_pad");
  if (c.q_batch_pad > 0) t.push_back("row_pad=q");
  if (c.out_batch_pad > 0) t.push_back("row_pad=out");
  if (c.indices_row_pad > 0) t.push_back("row_pad=indices");
  if (c.lse_row_pad > 0) t.push_back("row_pad=lse");
  t.push_back(std::string("pad_fill=") + fill_name(c.pad_fill));
}

}  // namespace

std::vector<std::string> classify_case(const Case& c) {
  std::vector<std::string> t;
  family_tags(c, t);
  shape_tags(c, t);
  extra_cache_tags(c, t);
  index_tags(c, t);
  length_and_sink_tags(c, t);
  value_tags(c, t);
  return t;
}

}  // namespace mlafuzz
