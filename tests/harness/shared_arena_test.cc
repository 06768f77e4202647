// The shared arena (harness/core/shared_arena.h): large case buffers live in one memfd that a
// worker maps read-only; small ones and everything when the arena is off come from operator new.
#include "harness/core/shared_arena.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>

#include "harness/core/materialize.h"

namespace mlafuzz {
namespace {

TEST(SharedArena, LargeBuffersAreInTheArenaSmallOnesAreNot) {
  SharedArena* a = SharedArena::get();
  if (a == nullptr) GTEST_SKIP() << "arena off (ASan build or MLAFUZZ_SHARED_ARENA=0)";
  const SharedVector<uint8_t> big(SharedArena::kMinBytes * 3, 7);
  const SharedVector<uint8_t> small(100, 7);
  const int64_t off = a->offset_of(big.data(), big.size());
  EXPECT_GE(off, 0);
  EXPECT_EQ(a->offset_of(small.data(), small.size()), -1);
  // A range running past the arena's end is not in it.
  EXPECT_EQ(a->offset_of(big.data(), a->size() - static_cast<size_t>(off) + 1), -1);
}

TEST(SharedArena, AChildSeesTheBytesThroughAReadOnlyMapping) {
  SharedArena* a = SharedArena::get();
  if (a == nullptr) GTEST_SKIP() << "arena off (ASan build or MLAFUZZ_SHARED_ARENA=0)";
  SharedVector<uint16_t> v(SharedArena::kMinBytes, 0);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>(i * 31);
  const int64_t off = a->offset_of(v.data(), v.size() * 2);
  ASSERT_GE(off, 0);
  const long page = 4096;
  const int64_t base = off / page * page;
  const size_t len = static_cast<size_t>(off - base) + v.size() * 2;
  void* ro = mmap(nullptr, len, PROT_READ, MAP_SHARED, a->read_only_fd(), base);
  ASSERT_NE(ro, MAP_FAILED);
  EXPECT_EQ(std::memcmp(static_cast<uint8_t*>(ro) + (off - base), v.data(), v.size() * 2), 0);
  munmap(ro, len);
  // The descriptor a child gets cannot be mapped for writing.
  EXPECT_EQ(mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, a->read_only_fd(), base),
            MAP_FAILED);
}

TEST(SharedArena, FreedBlocksAreReused) {
  SharedArena* a = SharedArena::get();
  if (a == nullptr) GTEST_SKIP() << "arena off (ASan build or MLAFUZZ_SHARED_ARENA=0)";
  int64_t first = -1;
  {
    const SharedVector<uint8_t> v(SharedArena::kMinBytes * 5);
    first = a->offset_of(v.data(), v.size());
  }
  const SharedVector<uint8_t> again(SharedArena::kMinBytes * 6);  // the same size class (8x)
  EXPECT_EQ(a->offset_of(again.data(), again.size()), first);
}

TEST(SharedArena, MaterializedCachesAreInTheArenaAndCopiesToo) {
  SharedArena* a = SharedArena::get();
  if (a == nullptr) GTEST_SKIP() << "arena off (ASan build or MLAFUZZ_SHARED_ARENA=0)";
  Case c;
  c.batch = 4;
  c.heads = 16;
  c.topk = 64;
  c.geom.num_pages = 8;
  c.geom.page_size = 64;
  const MaterializedCase m = materialize(c);
  ASSERT_GE(m.cache.size(), SharedArena::kMinBytes);
  EXPECT_GE(a->offset_of(m.cache.data(), m.cache.size()), 0);
  const MaterializedCase copy = m;  // property variants start as copies
  EXPECT_GE(a->offset_of(copy.cache.data(), copy.cache.size()), 0);
  EXPECT_NE(copy.cache.data(), m.cache.data());
  EXPECT_EQ(copy.cache, m.cache);
}

}  // namespace
}  // namespace mlafuzz
