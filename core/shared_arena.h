// The shared arena: one anonymous shared-memory file (memfd) per process, mapped once, that holds
// the large input buffers of materialized cases (the paged cache and q). A worker process that
// inherits a read-only descriptor of it (python: backends, harness/backends/python_backend.cc)
// reads those buffers where materialize() wrote them: the cache crosses to the worker without a
// copy, and the worker cannot write the campaign's inputs (its mapping is read-only).
//
// SharedVector<T> is std::vector<T> with SharedAllocator: blocks of at least kMinBytes come from
// the arena, smaller ones (and every block when the system refuses the arena or it is full) from
// operator new; those travel to workers by copy. Under AddressSanitizer free blocks and the bytes
// of a block past those in use are poisoned, so ASan checks arena buffers as heap buffers.
//
// Identities (publish()): a worker that keeps copies of input buffers on a device across calls
// (python: backends on device="cuda", python/mlafuzz/worker/) needs to know whether the bytes of
// a block changed since it last copied them. publish() gives a block an identity, a number never
// given twice in the process, and seals the block (read-only in this process). A write to a
// sealed block faults into a SIGSEGV handler that reopens the 64 KiB chunk it hit and marks the
// block changed, so the next publish() gives a new identity: a block freed and reused, a vector
// copy-assigned in place, or a single byte written after the block was sent all change it. This
// is the write barrier of page-protection garbage collectors (e.g. the Boehm GC's MPROTECT_VDB
// dirty bits). Blocks that are never published are never sealed and cost nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <unordered_map>
#include <utility>
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

  // The identity of the bytes of the block that starts at `p` (a SharedVector's data()), `bytes`
  // of which are in use: nonzero, the same as the previous publish() of the block when none of
  // its bytes was written since, a new one otherwise (and never one given before). 0 when `p` is
  // not the start of a live arena block or `bytes` exceeds it (the caller must not cache it).
  // Seals the block: the first write to each of its 64 KiB chunks afterwards takes a page fault.
  uint64_t publish(const void* p, size_t bytes);
  // `dst` (a block start) now holds the first `bytes` bytes of block `src` (a SharedVector
  // copy): when `src` is published and unwritten, `dst` takes its identity and is sealed too, so
  // that the copies a case's property variants make reach a device cache as the same bytes,
  // and a variant that then writes its copy (poison) gets a new identity at its publish().
  void inherit(const void* dst, const void* src, size_t bytes);

 private:
  SharedArena(int fd, int ro_fd, uint8_t* base, size_t size, uint8_t* chunks)
      : fd_(fd), ro_fd_(ro_fd), base_(base), size_(size), chunks_(chunks) {}
  static int size_class(size_t bytes);
  static void on_fault(int sig, void* info, void* context);
  void unseal(size_t offset, size_t block);

  struct Live {
    size_t block = 0;  // bytes of the block
    uint64_t id = 0;   // its identity while sealed and unwritten; 0: not published
  };

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
  std::unordered_map<size_t, Live> live_;     // allocated blocks by offset
  uint64_t next_id_ = 1;
  // One state per kMinBytes chunk of the arena (a sparse anonymous mapping): 0 open, 1 sealed,
  // 2 written since sealed (set by the fault handler, which takes no lock).
  uint8_t* chunks_;
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

// std::vector on SharedAllocator whose copies inherit the source's identity (SharedArena::inherit).
template <typename T>
class SharedVector : public std::vector<T, SharedAllocator<T>> {
  using Base = std::vector<T, SharedAllocator<T>>;

 public:
  using Base::Base;
  SharedVector() = default;
  SharedVector(const SharedVector& o) : Base(o) { inherit_from(o); }
  SharedVector(SharedVector&&) noexcept = default;
  // From the plain vector type (what generic code returns): its storage is taken or copied.
  SharedVector(Base&& b) noexcept : Base(std::move(b)) {}  // NOLINT: implicit on purpose
  SharedVector(const Base& b) : Base(b) {}                 // NOLINT: implicit on purpose
  SharedVector& operator=(const SharedVector& o) {
    if (this != &o) {
      Base::operator=(o);
      inherit_from(o);
    }
    return *this;
  }
  SharedVector& operator=(SharedVector&&) noexcept = default;
  ~SharedVector() = default;

 private:
  void inherit_from(const SharedVector& o) {
    const size_t bytes = this->size() * sizeof(T);
    if (bytes < SharedArena::kMinBytes || this->size() != o.size()) return;
    if (SharedArena* a = SharedArena::get()) a->inherit(this->data(), o.data(), bytes);
  }
};

}  // namespace mlafuzz
