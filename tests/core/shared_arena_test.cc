// The shared arena (core/shared_arena.h): large case buffers live in one memfd that a
// worker maps read-only; small ones and everything when the arena is off come from operator new.
#include "core/shared_arena.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "core/materialize.h"

namespace mlafuzz {
namespace {

TEST(SharedArena, LargeBuffersAreInTheArenaSmallOnesAreNot) {
  SharedArena* a = SharedArena::get();
  if (a == nullptr) GTEST_SKIP() << "no arena: the system refused the memfd";
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
  if (a == nullptr) GTEST_SKIP() << "no arena: the system refused the memfd";
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
  if (a == nullptr) GTEST_SKIP() << "no arena: the system refused the memfd";
  int64_t first = -1;
  {
    const SharedVector<uint8_t> v(SharedArena::kMinBytes * 5);
    first = a->offset_of(v.data(), v.size());
  }
  const SharedVector<uint8_t> again(SharedArena::kMinBytes * 6);  // the same size class (8x)
  EXPECT_EQ(a->offset_of(again.data(), again.size()), first);
}

#if defined(__SANITIZE_ADDRESS__)
// The sanitized build runs the arena as campaigns do, and AddressSanitizer checks its blocks as
// heap blocks: a read past the bytes in use and a read after the block is freed are reported.
TEST(SharedArenaSanitized, OverflowAndUseAfterFreeAreReported) {
  SharedArena* a = SharedArena::get();
  ASSERT_NE(a, nullptr) << "the sanitized build must run the shared arena";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const size_t n = SharedArena::kMinBytes * 3;  // a block of 4x: the last quarter is unused
  EXPECT_DEATH(
      {
        SharedVector<uint8_t> v(n);
        ASSERT_GE(a->offset_of(v.data(), n), 0);
        volatile uint8_t x = v.data()[n];  // one byte past the vector
        (void)x;
      },
      "use-after-poison");
  EXPECT_DEATH(
      {
        const uint8_t* p = nullptr;
        {
          SharedVector<uint8_t> v(n);
          p = v.data();
        }
        volatile uint8_t x = p[0];  // the freed block
        (void)x;
      },
      "use-after-poison");
}
#endif

TEST(SharedArena, MaterializedCachesAreInTheArenaAndWrittenCopiesToo) {
  SharedArena* a = SharedArena::get();
  if (a == nullptr) GTEST_SKIP() << "no arena: the system refused the memfd";
  Case c;
  c.batch = 4;
  c.heads = 16;
  c.topk = 64;
  c.geom.num_pages = 8;
  c.geom.page_size = 64;
  const MaterializedCase m = materialize(c);
  ASSERT_GE(m.cache.size(), SharedArena::kMinBytes);
  EXPECT_GE(a->offset_of(m.cache.data(), m.cache.size()), 0);
  // Property variants start as copies: they read the case's very buffer (CacheBytes) until one
  // writes, which then gets a buffer of its own, in the arena too, and leaves the case's bytes.
  MaterializedCase copy = m;
  EXPECT_TRUE(copy.cache.shares(m.cache));
  EXPECT_EQ(copy.cache.data(), m.cache.data());
  const std::vector<uint8_t> before(m.cache.begin(), m.cache.end());
  CacheBytes::Vector& written = copy.cache.mut();
  EXPECT_FALSE(copy.cache.shares(m.cache));
  EXPECT_NE(copy.cache.data(), m.cache.data());
  EXPECT_GE(a->offset_of(copy.cache.data(), copy.cache.size()), 0);
  EXPECT_EQ(copy.cache, m.cache);  // the copy's bytes, before its write
  written[0] ^= 0xff;
  EXPECT_FALSE(copy.cache == m.cache);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), m.cache.begin(), m.cache.end()));
  // A holder no other shares is written in place.
  EXPECT_EQ(&copy.cache.mut(), &written);
}

// ---- Identities (publish): a device cache keyed by them must never see stale bytes ----

constexpr size_t kBig = SharedArena::kMinBytes * 3;

TEST(SharedArenaIdentity, StableWhileUnwrittenNewAfterAWrite) {
  SharedArena* a = SharedArena::get();
  if (a == nullptr) GTEST_SKIP() << "no arena: the system refused the memfd";
  SharedVector<uint8_t> v(kBig, 1);
  const uint64_t id = a->publish(v.data(), v.size());
  ASSERT_NE(id, 0u);
  EXPECT_EQ(a->publish(v.data(), v.size()), id) << "nothing was written";
  // The block is sealed: this store faults, the handler reopens the chunk and the store lands.
  v[kBig - 1] = 9;
  EXPECT_EQ(v[kBig - 1], 9);
  const uint64_t id2 = a->publish(v.data(), v.size());
  EXPECT_NE(id2, 0u);
  EXPECT_NE(id2, id) << "a written block kept its identity: a device cache would be stale";
  EXPECT_EQ(a->publish(v.data(), v.size()), id2);
  // Every chunk counts, the first one too.
  v[0] = 3;
  EXPECT_NE(a->publish(v.data(), v.size()), id2);
}

TEST(SharedArenaIdentity, AFreedAndReusedBlockGetsANewIdentity) {
  SharedArena* a = SharedArena::get();
  if (a == nullptr) GTEST_SKIP() << "no arena: the system refused the memfd";
  int64_t first = -1;
  uint64_t id = 0;
  {
    const SharedVector<uint8_t> v(kBig, 1);
    first = a->offset_of(v.data(), v.size());
    id = a->publish(v.data(), v.size());
    ASSERT_NE(id, 0u);
  }
  SharedVector<uint8_t> again(kBig + 1, 2);  // the same size class: the same block, writable
  ASSERT_EQ(a->offset_of(again.data(), again.size()), first);
  again[7] = 5;  // no fault handler needed: freeing reopened it
  const uint64_t id2 = a->publish(again.data(), again.size());
  EXPECT_NE(id2, 0u);
  EXPECT_NE(id2, id) << "the reused block kept the freed one's identity";
}

TEST(SharedArenaIdentity, CopiesInheritUntilWritten) {
  SharedArena* a = SharedArena::get();
  if (a == nullptr) GTEST_SKIP() << "no arena: the system refused the memfd";
  SharedVector<uint16_t> v(kBig, 7);
  const uint64_t id = a->publish(v.data(), v.size() * 2);
  ASSERT_NE(id, 0u);
  SharedVector<uint16_t> copy = v;  // a property variant's copy: the same bytes
  ASSERT_NE(copy.data(), v.data());
  EXPECT_EQ(a->publish(copy.data(), copy.size() * 2), id);
  copy[12345] = 8;  // poison writes its copy
  const uint64_t cid = a->publish(copy.data(), copy.size() * 2);
  EXPECT_NE(cid, id);
  EXPECT_EQ(a->publish(v.data(), v.size() * 2), id) << "the source was not written";
  // A copy of an unpublished vector has no identity until it is published itself.
  const SharedVector<uint16_t> fresh(kBig, 1);
  const SharedVector<uint16_t> fresh_copy = fresh;
  const uint64_t fid = a->publish(fresh_copy.data(), fresh_copy.size() * 2);
  EXPECT_NE(fid, 0u);
  EXPECT_NE(fid, id);
  EXPECT_NE(fid, cid);
}

TEST(SharedArenaIdentity, CopyAssignmentInPlaceChangesTheIdentity) {
  SharedArena* a = SharedArena::get();
  if (a == nullptr) GTEST_SKIP() << "no arena: the system refused the memfd";
  SharedVector<uint8_t> x(kBig, 1);
  const SharedVector<uint8_t> y(kBig, 2);
  const uint64_t idx = a->publish(x.data(), x.size());
  const uint8_t* before = x.data();
  x = y;  // same size: std::vector reuses x's (sealed) block and writes it in place
  ASSERT_EQ(x.data(), before);
  EXPECT_EQ(x[100], 2);
  const uint64_t now = a->publish(x.data(), x.size());
  EXPECT_NE(now, 0u);
  EXPECT_NE(now, idx) << "in-place copy assignment kept the old bytes' identity";
  // Assigned from a published vector, it takes that one's identity.
  SharedVector<uint8_t> z(kBig, 4);
  const uint64_t idz = a->publish(z.data(), z.size());
  x = z;
  EXPECT_EQ(a->publish(x.data(), x.size()), idz);
  EXPECT_EQ(x[5], 4);
}

TEST(SharedArenaIdentity, OnlyLiveBlockStartsHaveIdentities) {
  SharedArena* a = SharedArena::get();
  if (a == nullptr) GTEST_SKIP() << "no arena: the system refused the memfd";
  const SharedVector<uint8_t> v(kBig, 1);
  EXPECT_EQ(a->publish(v.data() + 64, 64), 0u) << "not the start of a block";
  EXPECT_EQ(a->publish(v.data(), SharedArena::kMinBytes * 4 + 1), 0u) << "past the block";
  const std::vector<uint8_t> heap(100);
  EXPECT_EQ(a->publish(heap.data(), heap.size()), 0u) << "not in the arena";
}

TEST(SharedArenaIdentityDeathTest, OtherFaultsStillCrash) {
  SharedArena* a = SharedArena::get();
  if (a == nullptr) GTEST_SKIP() << "no arena: the system refused the memfd";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        SharedVector<uint8_t> v(kBig, 1);
        a->publish(v.data(), v.size());  // installs the handler
        *static_cast<volatile int*>(nullptr) = 1;
      },
      "");
}

}  // namespace
}  // namespace mlafuzz
