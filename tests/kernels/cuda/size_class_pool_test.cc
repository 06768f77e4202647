// The CUDA backends' caching allocator (kernels/cuda/size_class_pool.h) over a fake backing
// allocator: size classes, reuse without a backing call, the cache limit, the trim-and-retry on
// a failed allocation. No GPU needed.
#include "kernels/cuda/size_class_pool.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

namespace {

using mla::cuda::size_class;
using mla::cuda::SizeClassPool;

struct FakeBacking {
  struct Log {
    int allocs = 0, frees = 0;
    size_t live = 0;
    size_t fail_above = SIZE_MAX;  // allocations above this many live bytes fail
    std::map<void*, size_t> blocks;  // live block -> bytes
  };
  Log* log;
  int allocate(size_t bytes, void** p) {
    if (log->live + bytes > log->fail_above) return 2;  // "out of memory"
    *p = std::malloc(bytes);
    ++log->allocs;
    log->live += bytes;
    log->blocks[*p] = bytes;
    return 0;
  }
  void deallocate(void* p) {
    EXPECT_EQ(log->blocks.count(p), 1u) << "freed a block the backing never gave";
    log->live -= log->blocks[p];
    log->blocks.erase(p);
    ++log->frees;
    std::free(p);
  }
};

TEST(SizeClassPool, ClassesAreQuarterPowersOfTwo) {
  EXPECT_EQ(size_class(0), 4096u);
  EXPECT_EQ(size_class(1), 4096u);
  EXPECT_EQ(size_class(4096), 4096u);
  EXPECT_EQ(size_class(4097), 5120u);  // 1.25 * 4096
  EXPECT_EQ(size_class(6144), 6144u);
  EXPECT_EQ(size_class(7169), 8192u);
  EXPECT_EQ(size_class(size_t{1} << 20), size_t{1} << 20);
  EXPECT_EQ(size_class((size_t{1} << 20) + 1), (size_t{1} << 20) + (size_t{1} << 18));
  // Every class holds its request and wastes at most a quarter of it.
  for (size_t b = 4097; b < (size_t{1} << 24); b = b * 3 / 2 + 7) {
    const size_t c = size_class(b);
    EXPECT_GE(c, b);
    EXPECT_LE(c, b + b / 4 + 1) << b;
    EXPECT_EQ(size_class(c), c) << "a class is its own class";
  }
}

TEST(SizeClassPool, ReleasedBlocksAreReusedWithoutTheBacking) {
  FakeBacking::Log log;
  {
    SizeClassPool<FakeBacking> pool(FakeBacking{&log}, size_t{1} << 30);
    void* a = nullptr;
    size_t cap = 0;
    ASSERT_EQ(pool.acquire(100000, &a, &cap), 0);
    EXPECT_EQ(cap, size_class(100000));
    pool.release(a, cap);
    EXPECT_EQ(pool.cached_bytes(), cap);
    void* b = nullptr;
    size_t cap_b = 0;
    ASSERT_EQ(pool.acquire(99000, &b, &cap_b), 0);  // same class
    EXPECT_EQ(b, a);
    EXPECT_EQ(cap_b, cap);
    EXPECT_EQ(log.allocs, 1);
    EXPECT_EQ(pool.stats().hits, 1);
    void* c = nullptr;
    size_t cap_c = 0;
    ASSERT_EQ(pool.acquire(1000000, &c, &cap_c), 0);  // another class: a new block
    EXPECT_NE(c, a);
    EXPECT_EQ(log.allocs, 2);
    pool.release(b, cap_b);
    pool.release(c, cap_c);
    EXPECT_EQ(log.frees, 0);
  }
  EXPECT_EQ(log.frees, 2) << "the pool frees its cached blocks when destroyed";
  EXPECT_TRUE(log.blocks.empty());
}

TEST(SizeClassPool, CacheLimitFreesTheLargestBlocksFirst) {
  FakeBacking::Log log;
  SizeClassPool<FakeBacking> pool(FakeBacking{&log}, 3 * 8192);
  void* p[3];
  size_t cap[3];
  const size_t sizes[3] = {8192, 8192, 65536};
  for (int i = 0; i < 3; ++i) ASSERT_EQ(pool.acquire(sizes[i], &p[i], &cap[i]), 0);
  pool.release(p[0], cap[0]);
  pool.release(p[1], cap[1]);
  EXPECT_EQ(log.frees, 0);
  pool.release(p[2], cap[2]);  // 2 * 8192 + 65536 > the limit: the 65536 block goes
  EXPECT_EQ(log.frees, 1);
  EXPECT_EQ(pool.cached_bytes(), 2u * 8192);
  EXPECT_EQ(log.blocks.count(p[2]), 0u);
  pool.trim();
  EXPECT_EQ(pool.cached_bytes(), 0u);
  EXPECT_TRUE(log.blocks.empty());
}

TEST(SizeClassPool, FailedAllocationTrimsTheCacheAndRetriesOnce) {
  FakeBacking::Log log;
  SizeClassPool<FakeBacking> pool(FakeBacking{&log}, size_t{1} << 30);
  void* a = nullptr;
  size_t cap_a = 0;
  ASSERT_EQ(pool.acquire(size_t{1} << 20, &a, &cap_a), 0);
  pool.release(a, cap_a);            // cached: 1 MiB
  log.fail_above = size_t{5} << 18;  // 1.25 MiB in all
  void* b = nullptr;
  size_t cap_b = 0;
  ASSERT_EQ(pool.acquire(size_t{1} << 19, &b, &cap_b), 0)
      << "the cached 1 MiB block must be freed to make room";
  EXPECT_EQ(pool.stats().retries, 1);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  void* c = reinterpret_cast<void*>(1);
  size_t cap_c = 7;
  EXPECT_EQ(pool.acquire(size_t{1} << 21, &c, &cap_c), 2) << "the backing's error comes back";
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(cap_c, 0u);
  pool.release(b, cap_b);
}

}  // namespace
