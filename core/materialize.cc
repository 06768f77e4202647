// Recipe -> exact host buffers. Every random draw goes through CounterRng with a named stream
// and an element counter, so each buffer's contents depend only on the seed and the element's
// logical coordinates: changing one buffer's shape or the page order never moves another value.
#include "core/materialize.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <unordered_set>

#include "core/rng.h"

namespace mlafuzz {

const CacheBytes::Vector& CacheBytes::vec() const {
  static const Vector kEmpty;
  return p_ ? *p_ : kEmpty;
}

CacheBytes::Vector& CacheBytes::mut() {
  if (!p_) {
    p_ = std::make_shared<Vector>();
  } else if (p_.use_count() > 1) {
    p_ = std::make_shared<Vector>(*p_);  // unshared: a SharedVector copy (inherits the identity)
  }
  return *p_;
}

namespace {

// Whether element `element` takes a special value (its stream CounterRng(seed, kSpecial,
// element * 4 + tag) draws below special_fraction first), and which (its second draw).
// Values that stress sign handling, saturation and subnormals; never NaN or inf.
bool special_value(const ValueSpec& s, uint64_t seed, uint64_t element, SpecialTag tag, double* v) {
  CounterRng sp(seed, Stream::kSpecial, element * 4 + tag);
  if (!sp.bernoulli(s.special_fraction)) return false;
  switch (sp.uniform_int(0, 4)) {
    case 0:
      *v = 0.0;
      break;
    case 1:
      *v = -0.0;
      break;
    case 2:
      *v = 4 * s.magnitude;
      break;
    case 3:
      *v = -4 * s.magnitude;
      break;
    default:
      *v = 0x1p-133;  // smallest bf16 subnormal
  }
  return true;
}

// uniform() of 53 random bits, through 26- and 27-bit halves each converted exactly by the
// 2^52 trick: the same double as CounterRng::uniform, in operations that vectorize
// (a 64-bit integer to double conversion does not, without AVX-512).
inline double uniform_exact(uint64_t v) {
  const uint64_t y = v >> 11;  // < 2^53
  const double hi = std::bit_cast<double>((y >> 26) | 0x4330000000000000ull) - 0x1p52;
  const double lo =
      std::bit_cast<double>((y & ((1ull << 26) - 1)) | 0x4330000000000000ull) - 0x1p52;
  return (hi * 0x1p26 + lo) * 0x1.0p-53;  // exact: an integer below 2^53, then a power of two
}

}  // namespace

// One element drawn per ValueSpec. Element n of a buffer uses its own counter stream
// CounterRng(seed, stream, n) (random access; a normal draw consumes 12 values of it).
double draw_value(const ValueSpec& s, uint64_t seed, Stream stream, uint64_t element,
                  SpecialTag tag) {
  double special = 0;
  if (s.special_fraction > 0 && special_value(s, seed, element, tag, &special)) return special;
  CounterRng r(seed, stream, element);
  switch (s.dist) {
    case ValueDist::kNormal:
      return r.normal() * s.magnitude;
    case ValueDist::kUniform:
      return (2 * r.uniform() - 1) * s.magnitude;
    case ValueDist::kSmallInt:
      return static_cast<double>(r.uniform_int(-3, 3)) * s.magnitude;
    case ValueDist::kZeros:
      return 0.0;
    case ValueDist::kTies:
      return s.magnitude;
  }
  return 0.0;
}

namespace {

// uniform() of the 53 random bits v >> 11: with kConvert one 64-bit integer to double
// conversion (one instruction a lane with AVX-512), else uniform_exact's halves (which vectorize
// without it). Both exact: the same double.
template <bool kConvert>
inline double uniform53(uint64_t v) {
  if constexpr (kConvert) {
    return static_cast<double>(static_cast<int64_t>(v >> 11)) * 0x1.0p-53;
  } else {
    return uniform_exact(v);
  }
}

// draw_values' body; kConvert: uniform53's conversion.
template <bool kConvert>
__attribute__((always_inline)) inline void draw_values_body(const ValueSpec& s, uint64_t seed,
                                                            Stream stream, uint64_t first,
                                                            int32_t count, SpecialTag tag,
                                                            float* out) {
  // 32 elements a step: the dependent multiplies and adds of four (AVX-512) or eight (AVX2)
  // vectors of lanes in flight; eight lanes a step left the units waiting on their latency.
  constexpr int kLanes = 32;
  int32_t i = 0;
  if (s.dist == ValueDist::kNormal) {
    // kLanes elements' normal draws side by side: per lane the same twelve uniforms added in
    // the same order as CounterRng::normal, so the same bits.
    for (; i + kLanes <= count; i += kLanes) {
      uint64_t key[kLanes];
      double sum[kLanes];
      for (int j = 0; j < kLanes; ++j) {
        key[j] = CounterRng::key_of(seed, stream, first + static_cast<uint64_t>(i + j));
        sum[j] = 0;
      }
      for (uint64_t n = 0; n < 12; ++n) {
        const uint64_t mixed = splitmix64(n);
        for (int j = 0; j < kLanes; ++j) sum[j] += uniform53<kConvert>(splitmix64(key[j] ^ mixed));
      }
      for (int j = 0; j < kLanes; ++j) {
        out[i + j] = static_cast<float>((sum[j] - 6.0) * s.magnitude);
      }
    }
  }
  if (s.dist == ValueDist::kUniform || s.dist == ValueDist::kSmallInt) {
    // kLanes elements side by side, each its stream's first value: CounterRng::uniform, or
    // uniform_int(-3, 3) = -3 + (v * 7) >> 64, formed from v's 32-bit halves (v * 7 < 2^67:
    // (hi * 7 + (lo * 7 >> 32)) >> 32 is the same integer).
    const uint64_t mixed = splitmix64(0);
    for (; i + kLanes <= count; i += kLanes) {
      // The draws first, then one distribution's loop (a branch per lane would not vectorize).
      uint64_t v[kLanes];
      for (int j = 0; j < kLanes; ++j) {
        v[j] = splitmix64(CounterRng::key_of(seed, stream, first + static_cast<uint64_t>(i + j)) ^
                          mixed);
      }
      double value[kLanes];
      if (s.dist == ValueDist::kUniform) {
        for (int j = 0; j < kLanes; ++j) {
          value[j] = (2 * uniform53<kConvert>(v[j]) - 1) * s.magnitude;
        }
      } else {
        for (int j = 0; j < kLanes; ++j) {
          const uint64_t k = ((v[j] >> 32) * 7 + (((v[j] & 0xffffffffull) * 7) >> 32)) >> 32;
          value[j] = static_cast<double>(static_cast<int64_t>(k) - 3) * s.magnitude;
        }
      }
      for (int j = 0; j < kLanes; ++j) out[i + j] = static_cast<float>(value[j]);
    }
  }
  for (; i < count; ++i) {  // the other distributions, and the last lanes
    out[i] = static_cast<float>(draw_value(ValueSpec{s.dist, s.magnitude, 0.0}, seed, stream,
                                           first + static_cast<uint64_t>(i), tag));
  }
  if (s.special_fraction > 0) {
    // Which elements take a special value (special_value's first draw, kLanes side by side);
    // special_value itself for those.
    const uint64_t mixed = splitmix64(0);
    int32_t j = 0;
    for (; j + kLanes <= count; j += kLanes) {
      bool hit[kLanes];
      double u[kLanes];  // the draws first, then the comparisons: the draws vectorize
      for (int l = 0; l < kLanes; ++l) {
        const uint64_t e = (first + static_cast<uint64_t>(j + l)) * 4 + tag;
        const uint64_t key = CounterRng::key_of(seed, Stream::kSpecial, e);
        u[l] = uniform53<kConvert>(splitmix64(key ^ mixed));
      }
      for (int l = 0; l < kLanes; ++l) hit[l] = u[l] < s.special_fraction;
      for (int l = 0; l < kLanes; ++l) {
        double special = 0;
        if (hit[l] && special_value(s, seed, first + static_cast<uint64_t>(j + l), tag, &special)) {
          out[j + l] = static_cast<float>(special);
        }
      }
    }
    for (; j < count; ++j) {
      double special = 0;
      if (special_value(s, seed, first + static_cast<uint64_t>(j), tag, &special)) {
        out[j] = static_cast<float>(special);
      }
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
// With AVX-512 (chosen at run time): a lane's 64-bit multiplies (two per splitmix64, 24 per
// normal draw) are one instruction each instead of AVX2's three 32-bit products and their
// shifts, and uniform53 converts in one. Integer arithmetic, exact conversions and sums in the
// same order: the same bits either way.
__attribute__((target("arch=x86-64-v4"))) void draw_values_v4(const ValueSpec& s, uint64_t seed,
                                                              Stream stream, uint64_t first,
                                                              int32_t count, SpecialTag tag,
                                                              float* out) {
  draw_values_body<true>(s, seed, stream, first, count, tag, out);
}

bool has_v4() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("x86-64-v4");
}
#endif

}  // namespace

void draw_values(const ValueSpec& s, uint64_t seed, Stream stream, uint64_t first, int32_t count,
                 SpecialTag tag, float* out) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
  static const bool v4 = has_v4();
  if (v4) {
    draw_values_v4(s, seed, stream, first, count, tag, out);
    return;
  }
#endif
  draw_values_body<false>(s, seed, stream, first, count, tag, out);
}

namespace {

// floor(fraction * n + 0.5): an exact count, so fraction 1 marks every entry.
int64_t fraction_count(double fraction, int64_t n) {
  return static_cast<int64_t>(std::floor(fraction * static_cast<double>(n) + 0.5));
}

// First `count` entries of a random permutation of [0, n) (partial Fisher-Yates).
std::vector<int32_t> pick_positions(CounterRng& rng, int32_t n, int64_t count) {
  std::vector<int32_t> perm(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) perm[static_cast<size_t>(i)] = i;
  count = std::min<int64_t>(count, n);
  for (int64_t i = 0; i < count; ++i) {
    const auto j = static_cast<size_t>(rng.uniform_int(i, n - 1));
    std::swap(perm[static_cast<size_t>(i)], perm[j]);
  }
  perm.resize(static_cast<size_t>(count));
  return perm;
}

std::vector<int32_t> random_row(CounterRng& rng, int32_t topk, int64_t n) {
  // Floyd's sampling: min(topk, n) distinct positions in O(topk) whatever n is. The set is
  // only queried, never iterated, so its hashing cannot leak into the output order.
  std::vector<int32_t> row;
  row.reserve(static_cast<size_t>(topk));
  const int64_t m = std::min<int64_t>(topk, n);
  std::unordered_set<int64_t> chosen;
  for (int64_t j = n - m; j < n; ++j) {
    int64_t t = rng.uniform_int(0, j);
    if (chosen.count(t)) t = j;
    chosen.insert(t);
    row.push_back(static_cast<int32_t>(t));
  }
  // More entries than slots: the rest are duplicates by necessity.
  while (static_cast<int64_t>(row.size()) < topk) {
    row.push_back(static_cast<int32_t>(rng.uniform_int(0, n - 1)));
  }
  for (size_t i = row.size(); i > 1; --i) {  // Fisher-Yates: the list order is random too
    const auto j = static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(i) - 1));
    std::swap(row[i - 1], row[j]);
  }
  return row;
}

std::vector<int32_t> sequential_row(int32_t topk, int64_t n) {
  // The last topk tokens of a sequence that fills the cache; wraps when topk > n.
  std::vector<int32_t> row(static_cast<size_t>(topk));
  for (int32_t k = 0; k < topk; ++k) {
    const int64_t t = topk <= n ? n - topk + k : k % n;
    row[static_cast<size_t>(k)] = static_cast<int32_t>(t);
  }
  return row;
}

std::vector<int32_t> page_runs_row(CounterRng& rng, int32_t topk, const mla::CacheGeometry& g) {
  // Runs of consecutive logical tokens. Starts are biased to a page's last slots (so the run
  // crosses into the next page) and to its first slot: the addressing corner cases.
  const int64_t n = mla::num_slots(g);
  const int64_t p = g.page_size;
  std::vector<int32_t> row;
  row.reserve(static_cast<size_t>(topk));
  while (static_cast<int32_t>(row.size()) < topk) {
    const int64_t page = rng.uniform_int(0, g.num_pages - 1);
    int64_t start = 0;
    switch (rng.uniform_int(0, 2)) {
      case 0:
        start = page * p + p - 1 - rng.uniform_int(0, std::min<int64_t>(p - 1, 3));
        break;
      case 1:
        start = page * p;
        break;
      default:
        start = rng.uniform_int(0, n - 1);
        break;
    }
    const int64_t left = topk - static_cast<int64_t>(row.size());
    const int64_t len = rng.uniform_int(1, std::min<int64_t>(left, p + 2));
    for (int64_t i = 0; i < len; ++i) row.push_back(static_cast<int32_t>((start + i) % n));
  }
  return row;
}

uint16_t q_pad_bits(Fill f, uint64_t seed, uint64_t element) {
  switch (f) {
    case Fill::kZero:
      return 0;
    case Fill::kNaN:
      return 0x7fc0;  // bf16 quiet NaN: any read of a pad element poisons the result
    case Fill::kGarbage:
      return static_cast<uint16_t>(CounterRng(seed, Stream::kPadding, 1).at(element));
  }
  return 0;
}

int32_t index_pad_value(Fill f, uint64_t seed, uint64_t element, int64_t slots) {
  switch (f) {
    case Fill::kZero:
      return 0;  // slot 0: a valid-looking entry, so a kernel that reads it counts one more token
    case Fill::kNaN:
      return std::numeric_limits<int32_t>::max();  // out of every cache: reading it is a bug
    case Fill::kGarbage:
      return static_cast<int32_t>(CounterRng(seed, Stream::kPadding, 2).at(element) %
                                  static_cast<uint64_t>(slots));  // valid-looking slots
  }
  return 0;
}

// Fills the whole cache with the pad pattern; the writer then overwrites every data byte, so
// what is left is exactly the bytes that hold no data (page padding, unused scale bytes).
template <typename Bytes>  // std::vector<uint8_t> or SharedVector<uint8_t>
void fill_cache_padding(Bytes& cache, Fill f, uint64_t seed, uint64_t substream = 0) {
  switch (f) {
    case Fill::kZero:
      std::fill(cache.begin(), cache.end(), uint8_t{0});
      break;
    case Fill::kNaN:
      // 0xff is NaN whatever a wrong read takes it for: e4m3 (-NaN), ue8m0, bf16 and fp32 alike.
      std::fill(cache.begin(), cache.end(), uint8_t{0xff});
      break;
    case Fill::kGarbage: {
      const CounterRng rng(seed, Stream::kPadding, substream);
      for (size_t w = 0; w * 8 < cache.size(); ++w) {  // byte i: byte i % 8 of word i / 8
        const uint64_t word = rng.at(w);
        for (size_t i = w * 8; i < std::min(cache.size(), w * 8 + 8); ++i) {
          cache[i] = static_cast<uint8_t>(word >> (8 * (i % 8)));
        }
      }
      break;
    }
  }
}

// The largest |v[i]| of a tile, as std::max over std::fabs gives it from 0: the largest
// magnitude's bits, NaN taken as 0 (std::max(m, NaN) keeps m). For floats that are not NaN the
// order of the magnitudes' bits is the order of the values (no branch: the loop vectorizes).
float tile_amax(const float* v, int32_t n) {
  uint32_t m = 0;
  for (int32_t i = 0; i < n; ++i) {
    const uint32_t a = std::bit_cast<uint32_t>(v[i]) & 0x7fffffffu;
    const uint32_t ordered = a & (0u - static_cast<uint32_t>(a <= 0x7f800000u));
    m = std::max(m, ordered);
  }
  return std::bit_cast<float>(m);
}

void put_u16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// The guard bytes after a cache whose invalid entries may point past it (cache_guard_bytes):
// 0xff, NaN in every format a read through such an entry takes them for.
template <typename Bytes>  // std::vector<uint8_t> or SharedVector<uint8_t>
void add_cache_guard(Bytes& cache, const mla::CacheGeometry& g, const mla::Conventions& conv) {
  const int64_t guard = cache_guard_bytes(g, conv);
  if (guard > 0) cache.resize(cache.size() + static_cast<size_t>(guard), uint8_t{0xff});
}

// The streams one cache's tokens draw from.
struct KvStreams {
  Stream nope = Stream::kKvNope, rope = Stream::kKvRope, scales = Stream::kScales;
};

KvStreams extra_streams(const Case& c) {
  if (c.extra && c.extra->same_values) return {};
  return {Stream::kExtraKvNope, Stream::kExtraKvRope, Stream::kExtraScales};
}

float kv_value(const Case& c, const KvStreams& st, int64_t logical_token, int32_t d) {
  const auto t = static_cast<uint64_t>(logical_token);
  if (d < c.geom.nope_dim) {
    return static_cast<float>(draw_value(
        c.kv_values, c.data_seed, st.nope,
        t * static_cast<uint64_t>(c.geom.nope_dim) + static_cast<uint64_t>(d), kTagNope));
  }
  const auto r = static_cast<uint64_t>(d - c.geom.nope_dim);
  return static_cast<float>(draw_value(c.rope_values, c.data_seed, st.rope,
                                       t * static_cast<uint64_t>(c.geom.rope_dim) + r, kTagRope));
}

// Quantizes and writes every logical token of the cache of `c` (the main cache, or the extra
// cache seen through extra_as_main) at its physical slot; with `only`, the logical tokens it
// lists (each token's bytes depend on that token's draws alone: the same bytes either way).
template <typename Bytes>  // std::vector<uint8_t> or SharedVector<uint8_t>
void write_tokens(const Case& c, const mla::CacheGeometry& g, Bytes& cache,
                  const KvStreams& st = {}, const std::vector<int64_t>* only = nullptr) {
  const int64_t n = only != nullptr ? static_cast<int64_t>(only->size()) : mla::num_slots(g);
  const int32_t tiles = mla::num_scale_tiles(g);
  std::vector<float> v(static_cast<size_t>(g.nope_dim)), rv(static_cast<size_t>(g.rope_dim));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = only != nullptr ? (*only)[static_cast<size_t>(i)] : i;
    const mla::TokenAddress a = mla::token_address(g, physical_slot(c, t));
    // kv_value(c, st, t, d) for every d, in one batch each for the nope and the rope part.
    const auto tu = static_cast<uint64_t>(t);
    draw_values(c.kv_values, c.data_seed, st.nope, tu * static_cast<uint64_t>(g.nope_dim),
                g.nope_dim, kTagNope, v.data());
    draw_values(c.rope_values, c.data_seed, st.rope, tu * static_cast<uint64_t>(g.rope_dim),
                g.rope_dim, kTagRope, rv.data());
    for (int32_t tile = 0; tile < tiles; ++tile) {
      const float* tv = v.data() + static_cast<size_t>(tile) * g.scale_tile;
      const float amax = tile_amax(tv, g.scale_tile);
      const int writer_e = writer_exponent(amax);
      // The exponent the codes are normalized by, and the exponent stored in the cache.
      int code_e = writer_e, stored_e = writer_e;
      if (c.scales.mode == ScaleMode::kFixed) {
        code_e = stored_e = c.scales.exp_lo;
      } else if (c.scales.mode == ScaleMode::kRandom) {
        stored_e = static_cast<int>(
            CounterRng(c.data_seed, st.scales, static_cast<uint64_t>(t) * tiles + tile)
                .uniform_int(c.scales.exp_lo, c.scales.exp_hi));
      }
      uint8_t* codes = &cache[static_cast<size_t>(a.nope + tile * g.scale_tile)];
      if (g.layout == mla::Layout::kV32 && c.scales.convention == ScaleConvention::kFp32) {
        // Any positive finite float32, as vLLM's writers store it (ScaleSpec).
        float code_s = v32_writer_scale(amax), stored = code_s;
        if (c.scales.mode == ScaleMode::kFixed) {
          code_s = stored =
              std::ldexp(static_cast<float>(c.scales.mantissa), c.scales.exp_lo - 127);
        } else if (c.scales.mode == ScaleMode::kRandom) {
          CounterRng r(c.data_seed, st.scales, static_cast<uint64_t>(t) * tiles + tile);
          const int e = static_cast<int>(r.uniform_int(c.scales.exp_lo, c.scales.exp_hi));
          stored = v32_fp32_scale(e, r);
        }
        encode_e4m3_scaled(tv, g.scale_tile, code_s, codes);
        put_u32(&cache[static_cast<size_t>(a.scale + 4 * tile)], mla::float_to_bits(stored));
        continue;
      }
      encode_e4m3(tv, g.scale_tile, static_cast<uint8_t>(code_e), codes);
      if (g.layout == mla::Layout::kModel1) {
        cache[static_cast<size_t>(a.scale + tile)] = static_cast<uint8_t>(stored_e);
      } else {
        const float s = mla::ue8m0_to_float(static_cast<uint8_t>(stored_e));
        put_u32(&cache[static_cast<size_t>(a.scale + 4 * tile)], mla::float_to_bits(s));
      }
    }
    for (int32_t r = 0; r < g.rope_dim; ++r) {
      put_u16(&cache[static_cast<size_t>(a.rope + 2 * r)],
              mla::float_to_bf16(rv[static_cast<size_t>(r)]));
    }
  }
}

void hash_bytes(uint64_t& h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;  // FNV-1a 64 prime
  }
}

// Integers are hashed as 8 little-endian bytes whatever their C++ type, so the hash does not
// depend on the host's byte order or on a field's width.
void hash_int(uint64_t& h, int64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
  hash_bytes(h, b, 8);
}

template <typename T, typename A>
void hash_vector(uint64_t& h, const std::vector<T, A>& v) {
  hash_int(h, static_cast<int64_t>(v.size()));
  for (const T& x : v) {
    if constexpr (std::is_same_v<T, float>) {
      hash_int(h, mla::float_to_bits(x));
    } else {
      hash_int(h, static_cast<int64_t>(x));
    }
  }
}

// mla::float_to_e4m3_sat(x)'s byte by integer arithmetic on x's bits, both ranges computed and
// one taken by a mask (no branch: loops of it vectorize).
inline uint8_t e4m3_sat_code(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  // Normal e4m3 (|x| >= 2^-6): the 20 dropped mantissa bits rounded to nearest even by an add,
  // the carry going into the exponent; (a >> 20) - (120 << 3) rebiases 127 to 7; 0x7e (448) is
  // the saturation, as for infinities.
  uint32_t normal = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
  normal = normal < 0x7eu ? normal : 0x7eu;
  // Subnormal (quantum 2^-9): |x| * 512 in [0, 8) rounded to an integer by adding 2^23.
  const uint32_t sub =
      std::bit_cast<uint32_t>(std::bit_cast<float>(a) * 512.0f + 8388608.0f) - 0x4b000000u;
  const uint32_t is_normal = 0u - static_cast<uint32_t>(a >= 0x3c800000u);
  const uint32_t is_nan = 0u - static_cast<uint32_t>(a > 0x7f800000u);
  const uint32_t code = (normal & is_normal) | (sub & ~is_normal);
  return static_cast<uint8_t>(sign | (0x7fu & is_nan) | (code & ~is_nan));
}

}  // namespace

void encode_e4m3(const float* v, int32_t n, uint8_t code_e, uint8_t* out) {
  if (code_e == 0 || code_e >= 254) {  // a scale whose reciprocal is not a normal float, or NaN
    encode_e4m3_scaled(v, n, mla::ue8m0_to_float(code_e), out);
    return;
  }
  // 2^(127 - e) exactly: v * inv and v / 2^(e - 127) are the same real, rounded once each.
  const float inv = std::bit_cast<float>(static_cast<uint32_t>(254 - code_e) << 23);
  for (int32_t i = 0; i < n; ++i) out[i] = e4m3_sat_code(v[i] * inv);
}

void encode_e4m3_scaled(const float* v, int32_t n, float scale, uint8_t* out) {
  for (int32_t i = 0; i < n; ++i) out[i] = e4m3_sat_code(v[i] / scale);
}

int writer_exponent(float amax) {
  if (amax == 0) return 127;  // an all-zero tile: scale 1
  // amax = m * 2^ex with m in [0.5, 1), and 448 = 0.875 * 2^9, so amax / 448 = (m / 0.875) *
  // 2^(ex - 9) with m / 0.875 in (0.57, 1.15): its log2 rounds up to ex - 9 when m <= 0.875 and
  // to ex - 8 otherwise. Exact: no log2, no division.
  int ex = 0;
  const double m = std::frexp(static_cast<double>(amax), &ex);
  const int k = m <= 0.875 ? ex - 9 : ex - 8;
  return std::clamp(127 + k, 1, 254);  // ue8m0 0 is 2^-127 (kept out) and 255 is NaN
}

float v32_writer_scale(float amax) {
  return std::max(amax / 448.0f, std::numeric_limits<float>::min());
}

float v32_fp32_scale(int e, CounterRng& r) {
  if (e == 0) {  // ue8m0 byte 0: a subnormal float32, any of them
    return mla::bits_to_float(static_cast<uint32_t>(r.uniform_int(1, 0x7fffff)));
  }
  // Mantissas in [1, 2): a power of two (the control), 1.5 (0.75, 3, ...), just below the next
  // power of two, just above this one, 1.25, one whose bf16 rounding differs (1 + 2^-8 +
  // 2^-16 rounds up to 1 + 2^-7), one whose fp16 rounding differs and whose bf16 rounding is 1
  // (1 + 2^-11 + 2^-22), fp32(1.1), and 23 random mantissa bits.
  static const float kEdges[] = {1.0f,
                                 1.5f,
                                 std::nextafter(2.0f, 0.0f),
                                 std::nextafter(1.0f, 2.0f),
                                 1.25f,
                                 1.0f + 0x1p-8f + 0x1p-16f,
                                 1.0f + 0x1p-11f + 0x1p-22f,
                                 1.1f};
  constexpr int kEdgeCount = sizeof(kEdges) / sizeof(kEdges[0]);
  const auto pick = static_cast<int>(r.uniform_int(0, kEdgeCount));
  const float m =
      pick < kEdgeCount
          ? kEdges[pick]
          : mla::bits_to_float(0x3f800000u | static_cast<uint32_t>(r.next() & 0x7fffffu));
  return std::ldexp(m, e - 127);  // e <= 254, m < 2: finite
}

int64_t cache_guard_bytes(const mla::CacheGeometry& g, const mla::Conventions& conv) {
  if (conv.invalid_index != mla::InvalidIndexRule::kOutOfRange) return 0;
  // Entries num_slots .. num_slots + page_size address the two pages after the last one.
  return 2 * std::max<int64_t>(g.page_stride, mla::min_page_stride(g));
}

int64_t physical_slot(const Case& c, int64_t logical) {
  // Entries outside the logical cache (out_of_range's invalid entries) stay as they are: they
  // lie outside the physical cache too, which has as many slots.
  if (logical < 0 || c.page_order.empty() || logical >= mla::num_slots(c.geom)) return logical;
  const int64_t p = c.geom.page_size;
  return static_cast<int64_t>(c.page_order[static_cast<size_t>(logical / p)]) * p + logical % p;
}

int64_t extra_physical_slot(const Case& c, int64_t logical) {
  if (logical < 0 || !c.extra || c.extra->page_order.empty() ||
      logical >= mla::num_slots(c.extra_geom())) {
    return logical;
  }
  const int64_t p = c.extra->page_size;
  return static_cast<int64_t>(c.extra->page_order[static_cast<size_t>(logical / p)]) * p +
         logical % p;
}

float kv_source_value(const Case& c, int64_t logical_token, int32_t d) {
  return kv_value(c, KvStreams{}, logical_token, d);
}

float extra_kv_source_value(const Case& c, int64_t logical_token, int32_t d) {
  return kv_value(c, extra_streams(c), logical_token, d);
}

namespace {

// The element number of q[b, s, h, 0] in the q stream: d = 0..d_qk - 1 follow it.
uint64_t q_first_element(const Case& c, int32_t b, int32_t s, int32_t h) {
  uint64_t row = static_cast<uint64_t>(b), head = static_cast<uint64_t>(h);
  uint64_t token = static_cast<uint64_t>(s), tokens = static_cast<uint64_t>(c.s_q);
  uint64_t heads = static_cast<uint64_t>(c.heads);
  if (c.q_source) {  // a shrunk case: the values of the row, token and head it kept
    const Case::QSource& q = *c.q_source;
    row = static_cast<uint64_t>(q.rows[static_cast<size_t>(b)]);
    head = static_cast<uint64_t>(q.head_ids[static_cast<size_t>(h)]);
    heads = static_cast<uint64_t>(q.heads);
    tokens = static_cast<uint64_t>(q.s_q);
    if (!q.token_ids.empty()) token = static_cast<uint64_t>(q.token_ids[static_cast<size_t>(s)]);
  }
  // s_q = 1: (row * heads + head) * d_qk + d, the element of version 1.
  return ((row * tokens + token) * heads + head) * static_cast<uint64_t>(c.d_qk());
}

}  // namespace

float q_source_value(const Case& c, int32_t b, int32_t s, int32_t h, int32_t d) {
  const uint64_t e = q_first_element(c, b, s, h) + static_cast<uint64_t>(d);
  return static_cast<float>(draw_value(c.q_values, c.data_seed, Stream::kQ, e, kTagQ));
}

namespace {

// The lists of one cache (c: the main cache, or the extra cache through extra_as_main).
std::vector<std::vector<int32_t>> generate_lists(const Case& c, Stream stream) {
  if (!c.indices.empty()) return c.indices;
  const int64_t n = mla::num_slots(c.geom);
  std::vector<std::vector<int32_t>> rows;
  rows.reserve(static_cast<size_t>(c.query_rows()));
  for (int32_t b = 0; b < c.query_rows(); ++b) {
    CounterRng rng(c.data_seed, stream, static_cast<uint64_t>(b));
    std::vector<int32_t> row;
    switch (c.index_spec.rule) {
      case IndexRule::kRandom:
        row = random_row(rng, c.topk, n);
        break;
      case IndexRule::kSequential:
        row = sequential_row(c.topk, n);
        break;
      case IndexRule::kPageRuns:
        row = page_runs_row(rng, c.topk, c.geom);
        break;
    }
    for (int32_t k :
         pick_positions(rng, c.topk, fraction_count(c.index_spec.invalid_fraction, c.topk))) {
      row[static_cast<size_t>(k)] = -1;
    }
    auto dups =
        pick_positions(rng, c.topk, fraction_count(c.index_spec.duplicate_fraction, c.topk));
    std::sort(dups.begin(), dups.end());  // copies read entries that are already final
    for (int32_t k : dups) {
      if (k == 0) continue;  // nothing earlier to copy
      row[static_cast<size_t>(k)] = row[static_cast<size_t>(rng.uniform_int(0, k - 1))];
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace

std::vector<std::vector<int32_t>> generate_indices(const Case& c) {
  return generate_lists(c, Stream::kIndices);
}

std::vector<std::vector<int32_t>> generate_extra_indices(const Case& c) {
  if (!c.extra) return {};
  return generate_lists(extra_as_main(c), Stream::kExtraIndices);
}

Case with_explicit_indices(const Case& c) {
  validate(c);
  Case e = c;
  if (e.indices.empty()) {
    e.indices = generate_indices(c);
    e.index_spec = IndexSpec{};  // the rule has been applied; keep the recipe unambiguous
  }
  if (e.extra && e.extra->indices.empty()) {
    e.extra->indices = generate_extra_indices(c);
    e.extra->index_spec = IndexSpec{};
  }
  return e;
}

namespace {

// Sets m's geometry, sizes, scale, conventions and strides (pads included) from the case.
void set_shape(const Case& c, MaterializedCase& m) {
  m.geom = c.geom;
  if (m.geom.page_stride == 0) m.geom.page_stride = mla::min_page_stride(m.geom);
  m.recipe.geom.page_stride = m.geom.page_stride;
  m.batch = c.batch;
  m.heads = c.heads;
  m.topk = c.topk;
  // The kernels receive fp32; the oracle uses that same value widened, so both see one scale.
  m.sm_scale = static_cast<float>(c.effective_sm_scale());
  m.sm_scale64 = static_cast<double>(m.sm_scale);
  m.conv = c.conventions;

  m.s_q = c.s_q;
  m.q_head_stride = m.d_qk() + c.q_head_pad;
  m.out_head_stride = m.d_v() + c.out_head_pad;
  m.extra_topk = c.extra ? c.extra->topk : 0;
  m.set_contiguous_strides();
  // A batch row spans its s_q tokens, then its pad (docs/case-format.md).
  m.q_batch_stride += c.q_batch_pad;
  m.out_batch_stride += c.out_batch_pad;
  m.indices_batch_stride += c.indices_row_pad;
  m.extra_indices_batch_stride += c.extra ? c.indices_row_pad : 0;
  m.lse_batch_stride += c.lse_row_pad;
}

// Fills m.q: the bf16 queries, then each head's and each batch row's pad.
void fill_q(const Case& c, MaterializedCase& m) {
  const int32_t dqk = m.d_qk();
  m.q.resize(static_cast<size_t>(int64_t{m.batch} * m.q_batch_stride));
  std::vector<float> v(static_cast<size_t>(dqk));
  for (int32_t b = 0; b < m.batch; ++b) {
    const int64_t row = int64_t{b} * m.q_batch_stride;
    for (int32_t t = 0; t < m.s_q; ++t) {
      for (int32_t h = 0; h < m.heads; ++h) {
        const int64_t base = row + t * m.q_token_stride + h * m.q_head_stride;
        // q_source_value(c, b, t, h, d) for every d, in one batch.
        draw_values(c.q_values, c.data_seed, Stream::kQ, q_first_element(c, b, t, h), dqk, kTagQ,
                    v.data());
        for (int32_t d = 0; d < dqk; ++d) {
          m.q[static_cast<size_t>(base + d)] = mla::float_to_bf16(v[static_cast<size_t>(d)]);
        }
        for (int64_t d = dqk; d < m.q_head_stride; ++d) {
          m.q[static_cast<size_t>(base + d)] =
              q_pad_bits(c.pad_fill, c.data_seed, static_cast<uint64_t>(base + d));
        }
      }
    }
    for (int64_t i = row + m.s_q * m.q_token_stride; i < row + m.q_batch_stride; ++i) {
      m.q[static_cast<size_t>(i)] = q_pad_bits(c.pad_fill, c.data_seed, static_cast<uint64_t>(i));
    }
  }
}

// The logical tokens of a cache of `slots` tokens that the index lists name, in order.
std::vector<int64_t> named_tokens(const std::vector<std::vector<int32_t>>& lists, int64_t slots) {
  std::vector<char> named(static_cast<size_t>(slots), 0);
  for (const auto& list : lists) {
    for (const int32_t x : list) {
      if (x >= 0 && x < slots) named[static_cast<size_t>(x)] = 1;
    }
  }
  std::vector<int64_t> out;
  for (int64_t t = 0; t < slots; ++t) {
    if (named[static_cast<size_t>(t)] != 0) out.push_back(t);
  }
  return out;
}

// Fills m.cache (tokens, padding, guard; or shares `reuse`, the same bytes) and m.indices
// (physical slots, then each row's pad); with named_only, only the tokens the lists name
// (materialize_named_tokens).
void fill_main_cache(const Case& c, MaterializedCase& m, bool named_only, const CacheBytes* reuse) {
  if (reuse != nullptr) {
    m.cache = *reuse;
  } else {
    CacheBytes::Vector& cache = m.cache.mut();
    cache.resize(static_cast<size_t>(mla::cache_bytes(m.geom)));
    fill_cache_padding(cache, c.pad_fill, c.data_seed);
    add_cache_guard(cache, m.geom, m.conv);
    Case placed = c;
    placed.geom = m.geom;
    if (named_only) {
      const std::vector<int64_t> only = named_tokens(m.recipe.indices, mla::num_slots(m.geom));
      write_tokens(placed, m.geom, cache, {}, &only);
    } else {
      write_tokens(placed, m.geom, cache);
    }
  }

  m.indices.reserve(static_cast<size_t>(int64_t{m.batch} * m.indices_batch_stride));
  const int64_t slots = mla::num_slots(m.geom);
  // The s_q lists of a batch row are contiguous (token stride topk), then the row's pad.
  for (int32_t b = 0; b < m.batch; ++b) {
    for (int32_t t = 0; t < m.s_q; ++t) {
      for (int32_t x : m.recipe.indices[static_cast<size_t>(b * m.s_q + t)]) {
        m.indices.push_back(static_cast<int32_t>(physical_slot(c, x)));
      }
    }
    for (int64_t k = int64_t{m.s_q} * m.topk; k < m.indices_batch_stride; ++k) {
      const auto e = static_cast<uint64_t>(m.indices.size());
      m.indices.push_back(index_pad_value(c.pad_fill, c.data_seed, e, slots));
    }
  }
}

// Fills the extra cache and its indices the way fill_main_cache fills the main ones.
void fill_extra_cache(const Case& c, MaterializedCase& m, bool named_only,
                      const CacheBytes* reuse) {
  m.has_extra = true;
  m.extra_geom = c.extra_geom();
  if (m.extra_geom.page_stride == 0) m.extra_geom.page_stride = mla::min_page_stride(m.extra_geom);
  m.recipe.extra->page_stride = m.extra_geom.page_stride;
  if (reuse != nullptr) {
    m.extra_cache = *reuse;
  } else {
    CacheBytes::Vector& extra_cache = m.extra_cache.mut();
    extra_cache.resize(static_cast<size_t>(mla::cache_bytes(m.extra_geom)));
    // Its own padding bytes (substream 3 of the padding stream), so that no byte of one cache
    // repeats the other's garbage.
    fill_cache_padding(extra_cache, c.pad_fill, c.data_seed, 3);
    add_cache_guard(extra_cache, m.extra_geom, m.conv);
    Case view = extra_as_main(c);
    view.geom = m.extra_geom;
    if (named_only) {
      const std::vector<int64_t> only =
          named_tokens(m.recipe.extra->indices, mla::num_slots(m.extra_geom));
      write_tokens(view, m.extra_geom, extra_cache, extra_streams(c), &only);
    } else {
      write_tokens(view, m.extra_geom, extra_cache, extra_streams(c));
    }
  }
  m.extra_indices.reserve(static_cast<size_t>(int64_t{m.batch} * m.extra_indices_batch_stride));
  const int64_t extra_slots = mla::num_slots(m.extra_geom);
  for (int32_t b = 0; b < m.batch; ++b) {
    for (int32_t t = 0; t < m.s_q; ++t) {
      for (int32_t x : m.recipe.extra->indices[static_cast<size_t>(b * m.s_q + t)]) {
        m.extra_indices.push_back(static_cast<int32_t>(extra_physical_slot(c, x)));
      }
    }
    for (int64_t k = int64_t{m.s_q} * m.extra_topk; k < m.extra_indices_batch_stride; ++k) {
      // Element numbers past the main lists', so that the two pads differ.
      const auto e = static_cast<uint64_t>(m.indices.size() + m.extra_indices.size());
      m.extra_indices.push_back(index_pad_value(c.pad_fill, c.data_seed, e, extra_slots));
    }
  }
  if (c.extra->topk_length) m.extra_topk_length = *c.extra->topk_length;
}

// The caches ReuseCaches keeps on this thread: those of the case whose cache_key is `key`.
struct KeptCaches {
  int scopes = 0;
  std::string key;
  CacheBytes cache, extra_cache;
};
thread_local KeptCaches kept_caches;

// What the bytes of a case's caches are made of, as text: the case's file with every field
// that does not enter them (fill_main_cache, fill_extra_cache: the geometries, page orders,
// kv and rope value specs, scales, fill, conventions, data seed and the extra cache's own
// fields are what remain) set to one value.
std::string cache_key(const Case& c) {
  Case k = c;
  k.name.clear();
  k.description.clear();
  k.batch = k.heads = k.topk = k.s_q = 1;
  k.indices.clear();
  k.index_spec = {};
  k.topk_length.reset();
  k.sink.reset();
  k.sm_scale.reset();
  k.q_source.reset();
  k.q_head_pad = k.out_head_pad = k.q_batch_pad = k.out_batch_pad = 0;
  k.indices_row_pad = k.lse_row_pad = 0;
  k.q_values = {};
  if (k.extra) {
    k.extra->topk = 1;
    k.extra->indices.clear();
    k.extra->index_spec = {};
    k.extra->topk_length.reset();
  }
  return to_json(k);
}

MaterializedCase materialize_tokens(const Case& c, bool named_only) {
  validate(c);
  MaterializedCase m;
  m.recipe = with_explicit_indices(c);
  set_shape(c, m);
  fill_q(c, m);
  KeptCaches& kept = kept_caches;
  const bool keep = kept.scopes > 0 && !named_only;
  const std::string key = keep ? cache_key(c) : std::string();
  const bool reuse = keep && key == kept.key;
  fill_main_cache(c, m, named_only, reuse ? &kept.cache : nullptr);
  if (c.topk_length) m.topk_length = *c.topk_length;
  if (c.sink) {
    for (double s : *c.sink) m.sink.push_back(static_cast<float>(s));  // +-inf stay +-inf
  }
  if (c.extra) fill_extra_cache(c, m, named_only, reuse ? &kept.extra_cache : nullptr);
  if (keep && !reuse) {
    kept.key = key;
    kept.cache = m.cache;
    kept.extra_cache = m.extra_cache;
  }
  return m;
}

}  // namespace

MaterializedCase materialize(const Case& c) { return materialize_tokens(c, false); }

ReuseCaches::ReuseCaches() { ++kept_caches.scopes; }

ReuseCaches::~ReuseCaches() {
  if (--kept_caches.scopes == 0) kept_caches = KeptCaches{};
}

MaterializedCase materialize_named_tokens(const Case& c) { return materialize_tokens(c, true); }

void MaterializedCase::set_contiguous_strides() {
  q_token_stride = int64_t{heads} * q_head_stride;
  q_batch_stride = s_q * q_token_stride;
  indices_token_stride = topk;
  indices_batch_stride = int64_t{s_q} * topk;
  out_token_stride = int64_t{heads} * out_head_stride;
  out_batch_stride = s_q * out_token_stride;
  lse_token_stride = heads;
  lse_batch_stride = int64_t{s_q} * heads;
  extra_indices_token_stride = extra_topk;
  extra_indices_batch_stride = int64_t{s_q} * extra_topk;
}

mla::DecodeParams MaterializedCase::host_params() const {
  mla::DecodeParams p;
  p.geom = geom;
  p.conv = conv;
  p.batch = batch;
  p.heads = heads;
  p.topk = topk;
  p.sm_scale = sm_scale;
  p.q = q.data();
  p.q_head_stride = q_head_stride;
  p.q_batch_stride = q_batch_stride;
  p.kv_cache = cache.data();
  p.indices = indices.data();
  p.indices_batch_stride = indices_batch_stride;
  p.topk_length = topk_length.empty() ? nullptr : topk_length.data();
  p.sink = sink.empty() ? nullptr : sink.data();
  p.out_head_stride = out_head_stride;
  p.out_batch_stride = out_batch_stride;
  p.lse_batch_stride = lse_batch_stride;
  p.s_q = s_q;
  p.q_token_stride = q_token_stride;
  p.indices_token_stride = indices_token_stride;
  p.out_token_stride = out_token_stride;
  p.lse_token_stride = lse_token_stride;
  if (has_extra) {
    p.has_extra = true;
    p.extra_geom = extra_geom;
    p.extra_kv_cache = extra_cache.data();
    p.extra_topk = extra_topk;
    p.extra_indices = extra_indices.data();
    p.extra_indices_batch_stride = extra_indices_batch_stride;
    p.extra_indices_token_stride = extra_indices_token_stride;
    p.extra_topk_length = extra_topk_length.empty() ? nullptr : extra_topk_length.data();
  }
  return p;
}

uint64_t content_hash(const MaterializedCase& m) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64 offset basis
  const auto& g = m.geom;
  for (int64_t v : {int64_t{static_cast<int32_t>(g.layout)}, int64_t{g.nope_dim},
                    int64_t{g.rope_dim}, int64_t{g.scale_tile}, int64_t{g.page_size}, g.page_stride,
                    int64_t{g.num_pages}, int64_t{m.batch}, int64_t{m.heads}, int64_t{m.topk},
                    int64_t{mla::float_to_bits(m.sm_scale)},
                    int64_t{static_cast<int32_t>(m.conv.invalid_index)},
                    int64_t{static_cast<int32_t>(m.conv.empty_lse)}, int64_t{m.conv.sink_in_lse},
                    m.q_head_stride, m.out_head_stride}) {
    hash_int(h, v);
  }
  // Version-2 fields count only when used, so every hash of a version-1 case stays what it was.
  if (m.s_q != 1) hash_int(h, m.s_q);
  if (m.has_extra) {
    const auto& e = m.extra_geom;
    for (int64_t v :
         {int64_t{e.page_size}, e.page_stride, int64_t{e.num_pages}, int64_t{m.extra_topk}}) {
      hash_int(h, v);
    }
    hash_int(h, static_cast<int64_t>(m.extra_cache.size()));
    hash_bytes(h, m.extra_cache.data(), m.extra_cache.size());
    hash_vector(h, m.extra_indices);
    hash_vector(h, m.extra_topk_length);
  }
  // The batch strides count only when they leave the contiguous minimum, so a case without row
  // pads hashes as a case written without stride fields does.
  const bool padded = m.q_batch_stride != m.s_q * m.q_token_stride ||
                      m.out_batch_stride != m.s_q * m.out_token_stride ||
                      m.indices_batch_stride != m.s_q * m.indices_token_stride ||
                      m.lse_batch_stride != m.s_q * m.lse_token_stride;
  if (padded) {
    for (int64_t v :
         {m.q_batch_stride, m.out_batch_stride, m.indices_batch_stride, m.lse_batch_stride}) {
      hash_int(h, v);
    }
  }
  hash_vector(h, m.q);
  hash_int(h, static_cast<int64_t>(m.cache.size()));
  hash_bytes(h, m.cache.data(), m.cache.size());
  hash_vector(h, m.indices);
  hash_vector(h, m.topk_length);
  hash_vector(h, m.sink);
  return h;
}

}  // namespace mlafuzz
