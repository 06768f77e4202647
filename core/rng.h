// Counter-based random numbers with a specified output, identical on every machine/compiler.
//
// value = mix(seed, stream, counter): the SplitMix64 finalizer (Steele, Lea, Flood, "Fast
// splittable pseudorandom number generators", OOPSLA 2014) applied to a combination of the three
// words. No std:: distribution is used (their output is unspecified); derived distributions use
// IEEE basic operations only (no libm), so their bits are the same everywhere.
#pragma once

#include <cstdint>

namespace mlafuzz {

// GCC/Clang's 128-bit integer; __extension__ keeps -Wpedantic quiet about it.
__extension__ typedef unsigned __int128 uint128_for_rng;

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Named streams keep the draws of different buffers independent of each other, so changing
// one buffer's shape never changes another buffer's values.
enum class Stream : uint64_t {
  kQ = 1,
  kKvNope = 2,
  kKvRope = 3,
  kScales = 4,
  kIndices = 5,
  kPadding = 6,
  kSpecial = 7,
  kPoison = 8,
  kGenerator = 9,
  // The extra cache (case format version 2): its own values, scales and index lists.
  kExtraKvNope = 10,
  kExtraKvRope = 11,
  kExtraScales = 12,
  kExtraIndices = 13,
};

class CounterRng {
 public:
  CounterRng(uint64_t seed, Stream stream, uint64_t substream = 0)
      : key_(key_of(seed, stream, substream)) {}

  // The key of stream (seed, stream, substream): value n of it is splitmix64(key ^
  // splitmix64(n)). For batched draws (materialize.cc) that compute many streams side by side.
  static uint64_t key_of(uint64_t seed, Stream stream, uint64_t substream) {
    return splitmix64(seed ^ splitmix64(static_cast<uint64_t>(stream) * 0x100000001b3ull +
                                        splitmix64(substream)));
  }

  // The n-th 64-bit value of this stream (random access).
  uint64_t at(uint64_t n) const { return splitmix64(key_ ^ splitmix64(n)); }
  uint64_t next() { return at(counter_++); }

  // Uniform double in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform integer in [lo, hi] (inclusive), by 128-bit multiply (Lemire), bias < 2^-32.
  int64_t uniform_int(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    if (span == 0) return static_cast<int64_t>(next());
    const uint128_for_rng p = static_cast<uint128_for_rng>(next()) * span;
    return lo + static_cast<int64_t>(p >> 64);
  }
  bool bernoulli(double p) { return uniform() < p; }
  // Approximately standard normal: Irwin-Hall sum of 12 uniforms minus 6. Exact IEEE adds in a
  // fixed order, so the bits are reproducible; tails end at +-6 sigma, which is fine for tests.
  double normal() {
    double s = 0;
    for (int i = 0; i < 12; ++i) s += uniform();
    return s - 6.0;
  }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

}  // namespace mlafuzz
