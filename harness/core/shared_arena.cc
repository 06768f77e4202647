#include "harness/core/shared_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace mlafuzz {
namespace {

// Virtual size of the arena: the file is sparse, so only the pages in use cost memory. A full
// arena is not an error: blocks then come from operator new and travel by copy.
constexpr size_t kArenaBytes = size_t{1} << 40;
// Free blocks keep their pages for reuse (no page faults when the next case of the same shape is
// materialized) up to this many bytes; beyond it their pages are given back, as free() would.
constexpr size_t kIdleResidentBytes = size_t{512} << 20;

bool arena_disabled() {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return true;
#endif
#endif
  const char* e = std::getenv("MLAFUZZ_SHARED_ARENA");
  return e != nullptr && std::strcmp(e, "0") == 0;
}

}  // namespace

SharedArena* SharedArena::get() {
  static SharedArena* const arena = []() -> SharedArena* {
    if (arena_disabled()) return nullptr;
    const int fd = memfd_create("mlafuzz-arena", MFD_CLOEXEC);
    if (fd < 0) return nullptr;
    if (ftruncate(fd, static_cast<off_t>(kArenaBytes)) != 0) {
      close(fd);
      return nullptr;
    }
    void* base =
        mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    // A read-only description of the same file: a child that maps it cannot write it.
    const std::string self = "/proc/self/fd/" + std::to_string(fd);
    const int ro = open(self.c_str(), O_RDONLY | O_CLOEXEC);
    if (base == MAP_FAILED || ro < 0) {
      if (base != MAP_FAILED) munmap(base, kArenaBytes);
      if (ro >= 0) close(ro);
      close(fd);
      return nullptr;
    }
    return new SharedArena(fd, ro, static_cast<uint8_t*>(base), kArenaBytes);  // never freed
  }();
  return arena;
}

// Powers of two from kMinBytes: class k holds blocks of kMinBytes << k.
int SharedArena::size_class(size_t bytes) {
  int k = 0;
  while ((kMinBytes << k) < bytes) ++k;
  return k;
}

void* SharedArena::allocate(size_t bytes) {
  const int k = size_class(bytes);
  const size_t block = kMinBytes << k;
  const std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<size_t>(k) < free_.size() && !free_[k].empty()) {
    const FreeBlock b = free_[k].back();
    free_[k].pop_back();
    if (b.resident) idle_resident_ -= block;
    return base_ + b.offset;
  }
  if (block > size_ - bump_) return nullptr;
  void* p = base_ + bump_;
  bump_ += block;
  return p;
}

bool SharedArena::deallocate(void* p, size_t bytes) {
  const auto* u = static_cast<const uint8_t*>(p);
  if (u < base_ || u >= base_ + size_) return false;
  const int k = size_class(bytes);
  const size_t block = kMinBytes << k;
  const size_t offset = static_cast<size_t>(u - base_);
  const std::lock_guard<std::mutex> lock(mu_);
  if (free_.size() <= static_cast<size_t>(k)) free_.resize(static_cast<size_t>(k) + 1);
  bool resident = idle_resident_ + block <= kIdleResidentBytes;
  if (!resident) {
    // Give the pages back; the block reads as zeros and faults in again when reused.
    resident = fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                         static_cast<off_t>(offset), static_cast<off_t>(block)) != 0;
  }
  if (resident) idle_resident_ += block;
  free_[k].push_back({offset, resident});
  return true;
}

int64_t SharedArena::offset_of(const void* p, size_t bytes) const {
  const auto* u = static_cast<const uint8_t*>(p);
  if (u == nullptr || u < base_ || u >= base_ + size_ || bytes > size_ - (u - base_)) return -1;
  return u - base_;
}

}  // namespace mlafuzz
