// The shared arena: one anonymous shared-memory file (memfd) per process, mapped once, that holds
// the large input buffers of materialized cases (the paged cache and q). A worker process that
// inherits a read-only descriptor of it (python: backends, harness/backends/python_backend.cc)
// reads those buffers where materialize() wrote them: the cache crosses to the worker without a
// copy, and the worker cannot write the campaign's inputs (its mapping is read-only).
//
// SharedVector<T> is std::vector<T> with SharedAllocator: blocks of at least kMinBytes come from
// the arena, smaller ones (and every block when the arena is off or full) from operator new. The
// arena is off under AddressSanitizer (so that ASan keeps checking these buffers) and when
// MLAFUZZ_SHARED_ARENA=0; buffers then travel by copy, as they did before it existed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <vector>

namespace mlafuzz {

class SharedArena {
 public:
  static constexpr size_t kMinBytes = size_t{64} << 10;  // smaller blocks: operator new
  // The process's arena, or nullptr when it is off or the system refused it (created on first
  // use; never destroyed: buffers may outlive any static).
  static SharedArena* get();

  // A block of `bytes` (>= kMinBytes), or nullptr when the arena is full.
  void* allocate(size_t bytes);
  // Returns a block `allocate(bytes)` gave; false when `p` is not in the arena.
  bool deallocate(void* p, size_t bytes);
  // Offset of [p, p + bytes) in the arena, or -1 when the range is not (entirely) inside it.
  int64_t offset_of(const void* p, size_t bytes) const;
  // A read-only descriptor of the arena's file (close-on-exec; dup2 it into a child), and the
  // file's size (what the child maps).
  int read_only_fd() const { return ro_fd_; }
  size_t size() const { return size_; }

 private:
  SharedArena(int fd, int ro_fd, uint8_t* base, size_t size)
      : fd_(fd), ro_fd_(ro_fd), base_(base), size_(size) {}
  static int size_class(size_t bytes);

  struct FreeBlock {
    size_t offset;
    bool resident;  // its pages are still in memory (not punched out)
  };
  int fd_, ro_fd_;
  uint8_t* base_;
  size_t size_;
  std::mutex mu_;
  size_t bump_ = 0;                           // blocks above are untouched
  size_t idle_resident_ = 0;                  // bytes of free blocks whose pages are kept for reuse
  std::vector<std::vector<FreeBlock>> free_;  // by size class
};

template <typename T>
struct SharedAllocator {
  using value_type = T;
  SharedAllocator() noexcept = default;
  template <typename U>
  SharedAllocator(const SharedAllocator<U>&) noexcept {}  // NOLINT: allocators convert

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes >= SharedArena::kMinBytes) {
      if (SharedArena* a = SharedArena::get()) {
        if (void* p = a->allocate(bytes)) return static_cast<T*>(p);
      }
    }
    return static_cast<T*>(::operator new(bytes));
  }
  void deallocate(T* p, size_t n) noexcept {
    const size_t bytes = n * sizeof(T);
    if (bytes >= SharedArena::kMinBytes) {
      if (SharedArena* a = SharedArena::get(); a != nullptr && a->deallocate(p, bytes)) return;
    }
    ::operator delete(p);
  }
  template <typename U>
  bool operator==(const SharedAllocator<U>&) const noexcept {
    return true;
  }
};

template <typename T>
using SharedVector = std::vector<T, SharedAllocator<T>>;

}  // namespace mlafuzz
