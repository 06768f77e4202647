// A caching allocator with size classes for the CUDA backends' device and pinned buffers (issue
// 13): a campaign makes thousands of calls per second whose buffer sizes vary from case to case
// (production cases reach hundreds of megabytes), and cudaMalloc / cudaFree / cudaHostAlloc /
// cudaFreeHost cost milliseconds (the frees synchronize the device). Freed blocks go back to a
// free list of their size class and the next request of that class reuses one without a call
// into the driver. The same idea as PyTorch's CUDA caching allocator (blocks rounded up and kept
// on free lists, a cache flush and one retry when an allocation fails), in far less: one
// thread, no block splitting, classes a quarter of a power of two apart (at most 25% waste).
//
// Plain C++ (no CUDA header): the backend supplies the allocation functions, the tests a fake.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace mla::cuda {

// The class a request of `bytes` bytes is served from: the smallest of 2^k, 1.25 2^k, 1.5 2^k,
// 1.75 2^k that holds it, at least kMinClass. Requests above 2^62 are returned unchanged.
inline constexpr size_t kMinClass = 4096;
inline size_t size_class(size_t bytes) {
  if (bytes <= kMinClass) return kMinClass;
  if (bytes > (size_t{1} << 62)) return bytes;
  int k = 0;
  while ((size_t{1} << (k + 1)) <= bytes) ++k;  // 2^k <= bytes < 2^(k+1)
  const size_t base = size_t{1} << k, quarter = base / 4;
  for (size_t c = base; c <= 2 * base; c += quarter) {
    if (c >= bytes) return c;
  }
  return 2 * base;
}

// Backing: `int allocate(size_t bytes, void** p)` (0 on success, else the backend's error code)
// and `void deallocate(void* p)`. Not thread-safe: one backend object serves one thread.
template <typename Backing>
class SizeClassPool {
 public:
  struct Stats {
    int64_t allocations = 0;  // calls into the backing allocator that succeeded
    int64_t frees = 0;        // blocks given back to the backing allocator
    int64_t hits = 0;         // requests served from a free list
    int64_t retries = 0;      // failed allocations retried after a trim
  };

  // cache_limit: the most bytes kept on the free lists; a release beyond it frees the largest
  // cached blocks first. Blocks in use are not limited.
  SizeClassPool(Backing backing, size_t cache_limit)
      : backing_(std::move(backing)), cache_limit_(cache_limit) {}
  SizeClassPool(const SizeClassPool&) = delete;
  SizeClassPool& operator=(const SizeClassPool&) = delete;
  ~SizeClassPool() { trim(); }

  // A block of at least `bytes` bytes: *p and its capacity *cap (the class size). On a failed
  // allocation every cached block is freed and the allocation tried once more; the error of the
  // second try is returned (and *p is null).
  int acquire(size_t bytes, void** p, size_t* cap) {
    const size_t c = size_class(bytes);
    if (auto it = free_.find(c); it != free_.end() && !it->second.empty()) {
      *p = it->second.back();
      it->second.pop_back();
      cached_ -= c;
      *cap = c;
      ++stats_.hits;
      return 0;
    }
    int e = backing_.allocate(c, p);
    if (e != 0 && cached_ > 0) {
      ++stats_.retries;
      trim();
      e = backing_.allocate(c, p);
    }
    if (e != 0) {
      *p = nullptr;
      *cap = 0;
      return e;
    }
    ++stats_.allocations;
    *cap = c;
    return 0;
  }

  // Gives back a block acquire() returned (cap its capacity); null is ignored.
  void release(void* p, size_t cap) {
    if (p == nullptr) return;
    free_[cap].push_back(p);
    cached_ += cap;
    while (cached_ > cache_limit_) drop_largest();
  }

  // Frees every cached block (blocks in use stay valid).
  void trim() {
    for (auto& [c, blocks] : free_) {
      for (void* b : blocks) {
        backing_.deallocate(b);
        ++stats_.frees;
      }
      blocks.clear();
    }
    free_.clear();
    cached_ = 0;
  }

  size_t cached_bytes() const { return cached_; }
  const Stats& stats() const { return stats_; }

 private:
  void drop_largest() {
    auto it = free_.end();
    while (it != free_.begin()) {
      --it;
      if (!it->second.empty()) break;
    }
    if (it == free_.end() || it->second.empty()) {
      cached_ = 0;
      return;
    }
    backing_.deallocate(it->second.back());
    ++stats_.frees;
    it->second.pop_back();
    cached_ -= it->first;
    if (it->second.empty()) free_.erase(it);
  }

  Backing backing_;
  size_t cache_limit_;
  size_t cached_ = 0;
  std::map<size_t, std::vector<void*>> free_;  // class size -> cached blocks
  Stats stats_;
};

}  // namespace mla::cuda
