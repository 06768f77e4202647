// Transport between mlafuzz and a worker process: framed messages over a pair of pipes, large
// buffers in shared memory (an anonymous memfd the worker inherits as a file descriptor).
//
// Frames: u32 magic "MLAW", u32 message type, u64 payload length (little-endian), payload; the
// same framing as the C++ worker protocol (harness/campaign/worker_protocol.h), so that any
// worker, C++ or Python, can use shared memory for its buffers (docs/WORKER_PROTOCOL.md).
//
// Deadlines: every exchange has one; a child that does not answer in time is killed, one that
// closes its pipe is reaped, and the caller gets a description ("killed by signal 11", "no reply
// within 2 s (hang); killed") instead of an exception.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mlafuzz::ipc {

inline constexpr uint32_t kFrameMagic = 0x57414c4d;  // "MLAW"
inline constexpr uint64_t kMaxFrameBytes = uint64_t{1} << 36;
// The file descriptor number the shared memory has in the child.
inline constexpr int kChildShmFd = 3;
// The file descriptor number the shared arena (core/shared_arena.h) has in the child.
inline constexpr int kChildArenaFd = 4;

// What a fault's description says when the child did not answer in time (Child::kill_and_describe).
inline constexpr std::string_view kHangFault = "no reply within the case timeout (hang)";
// Whether a fault's description is that of a hang (a call that ran past its deadline).
inline bool is_hang(std::string_view fault) { return fault.find(kHangFault) != fault.npos; }

// An anonymous shared-memory file (memfd_create), mapped read-write. The child maps the same
// file through its inherited descriptor; growing it (ftruncate) keeps the descriptor, so the
// child remaps when a request says the file is larger than its mapping.
class SharedMemory {
 public:
  explicit SharedMemory(const char* name = "mlafuzz-shm");
  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  // Makes the file at least `bytes` long (rounded up to 1 MiB; never shrinks). Throws
  // std::runtime_error when the system refuses.
  void reserve(size_t bytes);
  uint8_t* data() { return static_cast<uint8_t*>(map_); }
  size_t size() const { return size_; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  void* map_ = nullptr;
  size_t size_ = 0;
};

// The child's view of a SharedMemory it inherited: maps the descriptor and remaps when the
// parent has grown the file since (refresh(), before reading a request).
class SharedMemoryView {
 public:
  explicit SharedMemoryView(int fd) : fd_(fd) {}
  ~SharedMemoryView();
  SharedMemoryView(const SharedMemoryView&) = delete;
  SharedMemoryView& operator=(const SharedMemoryView&) = delete;
  // Maps the file's current size; throws std::runtime_error when the descriptor cannot be mapped.
  void refresh();
  uint8_t* data() { return static_cast<uint8_t*>(map_); }
  size_t size() const { return size_; }

 private:
  int fd_;
  void* map_ = nullptr;
  size_t size_ = 0;
};

struct ChildSpec {
  std::vector<std::string> argv;  // argv[0] is the executable's path
  std::vector<std::string> env;   // "NAME=value" set on top of this process's environment
  int shm_fd = -1;                // inherited as kChildShmFd when >= 0
  int arena_fd = -1;              // inherited as kChildArenaFd when >= 0
  std::string log_path;           // the child's stderr goes here (appended); "" = inherit
  std::string label;              // names the child in fault descriptions
};

// A child process serving framed requests on its stdin and answering on its stdout. It sets
// MLAFUZZ_WORKER_PARENT=<this pid> so the child can leave when its parent is gone. Not
// thread-safe.
class Child {
 public:
  Child() = default;
  ~Child() { stop(0); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // Starts the child. Throws std::runtime_error when fork or pipe fail (exec failure shows as
  // a child that exits with status 127 on its first call).
  void start(const ChildSpec& spec);
  bool running() const { return pid_ >= 0; }
  pid_t pid() const { return pid_; }

  struct Reply {
    uint32_t type = 0;
    std::string payload;
    std::string fault;  // non-empty: the child crashed, hung or misbehaved and is gone
  };
  // Sends one request and waits for its reply until the deadline.
  Reply call(uint32_t type, std::string_view payload, double timeout_s);
  // call() in two halves, for a request answered by several replies (a batch): send() returns
  // "" or the fault (the child is then gone); receive() waits for the next reply, each with its
  // own deadline.
  std::string send(uint32_t type, std::string_view payload, double timeout_s);
  Reply receive(double timeout_s);
  // Sends `quit_type` (0: none), waits briefly, then kills; reaps the child.
  void stop(uint32_t quit_type);
  // Kills (after a short grace when it is already dying) and describes how the child ended.
  std::string kill_and_describe(const std::string& why);

 private:
  ChildSpec spec_;
  pid_t pid_ = -1;
  int to_fd_ = -1, from_fd_ = -1;
};

// 16-byte frame header.
std::string frame_header(uint32_t type, uint64_t length);

// Runs `argv` (stdin /dev/null, stderr inherited) and returns its stdout, or nullopt when it
// cannot start, fails, exits nonzero or runs past the timeout (then it is killed).
std::optional<std::string> run_capture(const std::vector<std::string>& argv, double timeout_s);

}  // namespace mlafuzz::ipc
