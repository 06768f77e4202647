#include "core/shared_arena.h"

#include <fcntl.h>
#include <sanitizer/asan_interface.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
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

// Under AddressSanitizer the arena's blocks are checked as heap blocks are: a free block and the
// bytes of a block past those in use are poisoned, so that a use after free and an overflow
// within the block's size class are reported (the macros do nothing in other builds).
void poison(const void* p, size_t bytes) { ASAN_POISON_MEMORY_REGION(p, bytes); }
void unpoison(const void* p, size_t bytes) { ASAN_UNPOISON_MEMORY_REGION(p, bytes); }

enum ChunkState : uint8_t { kOpen = 0, kSealed = 1, kWritten = 2 };

std::atomic_ref<uint8_t> chunk_state(uint8_t* chunks, size_t i) {
  return std::atomic_ref<uint8_t>(chunks[i]);
}

struct sigaction g_previous_segv {};
std::once_flag g_handler_once;

}  // namespace

// A write to a sealed chunk: reopen the chunk, mark it written, and return to retry the store.
// Any other fault goes to the handler that was there before (or the default action: the fault
// repeats with it installed). Only async-signal-safe work: atomics and mprotect (a system call).
void SharedArena::on_fault(int sig, void* info_v, void* context) {
  auto* info = static_cast<siginfo_t*>(info_v);
  SharedArena* a = get();
  const auto* addr = static_cast<const uint8_t*>(info->si_addr);
  if (a != nullptr && addr >= a->base_ && addr < a->base_ + a->size_) {
    const size_t c = static_cast<size_t>(addr - a->base_) / kMinBytes;
    uint8_t state = chunk_state(a->chunks_, c).load();
    if (state == kSealed || state == kWritten) {
      // kWritten: another thread reopened it between our fault and now; the retry succeeds.
      if (state == kSealed) {
        chunk_state(a->chunks_, c).store(kWritten);
        mprotect(a->base_ + c * kMinBytes, kMinBytes, PROT_READ | PROT_WRITE);
      }
      return;
    }
  }
  if (g_previous_segv.sa_flags & SA_SIGINFO) {
    if (g_previous_segv.sa_sigaction != nullptr) {
      g_previous_segv.sa_sigaction(sig, info, context);
      return;
    }
  } else if (g_previous_segv.sa_handler != SIG_DFL && g_previous_segv.sa_handler != SIG_IGN) {
    g_previous_segv.sa_handler(sig);
    return;
  }
  sigaction(SIGSEGV, &g_previous_segv, nullptr);  // the fault repeats under the old action
}

SharedArena* SharedArena::get() {
  static SharedArena* const arena = []() -> SharedArena* {
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
    // The chunk states: one byte per kMinBytes (16 MiB of address space, touched sparsely).
    void* chunks = mmap(nullptr, kArenaBytes / kMinBytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED || ro < 0 || chunks == MAP_FAILED) {
      if (base != MAP_FAILED) munmap(base, kArenaBytes);
      if (chunks != MAP_FAILED) munmap(chunks, kArenaBytes / kMinBytes);
      if (ro >= 0) close(ro);
      close(fd);
      return nullptr;
    }
    return new SharedArena(fd, ro, static_cast<uint8_t*>(base), kArenaBytes,
                           static_cast<uint8_t*>(chunks));  // never freed
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
    live_[b.offset] = {block, 0};
    unpoison(base_ + b.offset, bytes);
    poison(base_ + b.offset + bytes, block - bytes);
    return base_ + b.offset;
  }
  if (block > size_ - bump_) return nullptr;
  uint8_t* p = base_ + bump_;
  live_[bump_] = {block, 0};
  bump_ += block;
  poison(p + bytes, block - bytes);
  return p;
}

// Caller holds mu_. Reopens a sealed block for writing (chunk states first closed, then pages).
void SharedArena::unseal(size_t offset, size_t block) {
  mprotect(base_ + offset, block, PROT_READ | PROT_WRITE);
  for (size_t c = offset / kMinBytes; c < (offset + block) / kMinBytes; ++c) {
    chunk_state(chunks_, c).store(kOpen);
  }
}

uint64_t SharedArena::publish(const void* p, size_t bytes) {
  const auto* u = static_cast<const uint8_t*>(p);
  if (u < base_ || u >= base_ + size_) return 0;
  std::call_once(g_handler_once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = [](int sig, siginfo_t* info, void* ctx) { on_fault(sig, info, ctx); };
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_previous_segv);
  });
  const size_t offset = static_cast<size_t>(u - base_);
  const std::lock_guard<std::mutex> lock(mu_);
  const auto it = live_.find(offset);
  if (it == live_.end() || bytes > it->second.block) return 0;
  Live& b = it->second;
  const size_t first = offset / kMinBytes, last = (offset + b.block) / kMinBytes;
  if (b.id != 0) {
    bool unwritten = true;
    for (size_t c = first; c < last && unwritten; ++c) {
      unwritten = chunk_state(chunks_, c).load() == kSealed;
    }
    if (unwritten) return b.id;
  }
  // New bytes (or never published): states before protection, so that a write racing with the
  // seal is seen as a write.
  for (size_t c = first; c < last; ++c) chunk_state(chunks_, c).store(kSealed);
  if (mprotect(base_ + offset, b.block, PROT_READ) != 0) {
    unseal(offset, b.block);
    b.id = 0;
    return 0;  // cannot seal: no identity, the caller copies every time
  }
  b.id = next_id_++;
  return b.id;
}

void SharedArena::inherit(const void* dst, const void* src, size_t bytes) {
  const auto* d = static_cast<const uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  if (d < base_ || d >= base_ + size_ || s < base_ || s >= base_ + size_ || d == s) return;
  const size_t doff = static_cast<size_t>(d - base_), soff = static_cast<size_t>(s - base_);
  const std::lock_guard<std::mutex> lock(mu_);
  const auto si = live_.find(soff), di = live_.find(doff);
  if (si == live_.end() || di == live_.end() || si->second.id == 0) return;
  if (bytes > si->second.block || bytes > di->second.block) return;
  for (size_t c = soff / kMinBytes; c < (soff + si->second.block) / kMinBytes; ++c) {
    if (chunk_state(chunks_, c).load() != kSealed) return;  // the source changed: no identity
  }
  Live& b = di->second;
  const size_t first = doff / kMinBytes, last = (doff + b.block) / kMinBytes;
  for (size_t c = first; c < last; ++c) chunk_state(chunks_, c).store(kSealed);
  if (mprotect(base_ + doff, b.block, PROT_READ) != 0) {
    unseal(doff, b.block);
    b.id = 0;
    return;
  }
  b.id = si->second.id;
}

bool SharedArena::deallocate(void* p, size_t bytes) {
  const auto* u = static_cast<const uint8_t*>(p);
  if (u < base_ || u >= base_ + size_) return false;
  const int k = size_class(bytes);
  const size_t block = kMinBytes << k;
  const size_t offset = static_cast<size_t>(u - base_);
  const std::lock_guard<std::mutex> lock(mu_);
  if (const auto it = live_.find(offset); it != live_.end()) {
    if (it->second.id != 0 || chunk_state(chunks_, offset / kMinBytes).load() != kOpen) {
      unseal(offset, block);
    }
    live_.erase(it);
  }
  if (free_.size() <= static_cast<size_t>(k)) free_.resize(static_cast<size_t>(k) + 1);
  bool resident = idle_resident_ + block <= kIdleResidentBytes;
  if (!resident) {
    // Give the pages back; the block reads as zeros and faults in again when reused.
    resident = fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                         static_cast<off_t>(offset), static_cast<off_t>(block)) != 0;
  }
  if (resident) idle_resident_ += block;
  poison(u, block);
  free_[k].push_back({offset, resident});
  return true;
}

int64_t SharedArena::offset_of(const void* p, size_t bytes) const {
  const auto* u = static_cast<const uint8_t*>(p);
  if (u == nullptr || u < base_ || u >= base_ + size_ || bytes > size_ - (u - base_)) return -1;
  return u - base_;
}

}  // namespace mlafuzz
