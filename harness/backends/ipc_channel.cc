#include "harness/backends/ipc_channel.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace mlafuzz::ipc {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

enum class Io { kOk, kEof, kTimeout, kError };

const char* io_name(Io io) {
  switch (io) {
    case Io::kOk:
      return "ok";
    case Io::kEof:
      return "closed its pipe";
    case Io::kTimeout:
      return "timeout";
    case Io::kError:
      return "pipe error";
  }
  return "?";
}

Io wait_fd(int fd, short events, Clock::time_point deadline) {
  while (true) {
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (left <= 0) return Io::kTimeout;
    pollfd p{fd, events, 0};
    const int k = ::poll(&p, 1, static_cast<int>(std::min(left * 1000.0 + 1, 1000.0)));
    if (k < 0 && errno != EINTR) return Io::kError;
    if (k > 0) return Io::kOk;
  }
}

// Frames up to this size go out in one write (the pipe's default capacity is 64 KiB).
constexpr size_t kOneWriteBytes = 64 << 10;

Io write_all(int fd, const char* p, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    const ssize_t k = ::write(fd, p, n);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
    } else if (k < 0 && errno == EINTR) {
      continue;
    } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (const Io w = wait_fd(fd, POLLOUT, deadline); w != Io::kOk) return w;
    } else {
      return errno == EPIPE ? Io::kEof : Io::kError;
    }
  }
  return Io::kOk;
}

Io read_all(int fd, char* p, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    const ssize_t k = ::read(fd, p, n);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
    } else if (k == 0) {
      return Io::kEof;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (const Io w = wait_fd(fd, POLLIN, deadline); w != Io::kOk) return w;
    } else {
      return Io::kError;
    }
  }
  return Io::kOk;
}

std::string describe_status(int st) {
  if (WIFEXITED(st)) return "exited with status " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) {
    const int s = WTERMSIG(st);
    const char* name = ::strsignal(s);
    return "killed by signal " + std::to_string(s) + " (" + (name ? name : "?") + ")";
  }
  return "stopped";
}

bool reap_within(pid_t pid, int* st, int tries, int ms) {
  for (int i = 0; i < tries; ++i) {
    if (::waitpid(pid, st, WNOHANG) == pid) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
  return false;
}

}  // namespace

std::string frame_header(uint32_t type, uint64_t length) {
  std::string h(16, '\0');
  std::memcpy(h.data(), &kFrameMagic, 4);
  std::memcpy(h.data() + 4, &type, 4);
  std::memcpy(h.data() + 8, &length, 8);
  return h;
}

// ---- SharedMemory ----

SharedMemory::SharedMemory(const char* name) {
  fd_ = ::memfd_create(name, MFD_CLOEXEC);
  if (fd_ < 0) fail("memfd_create");
}

SharedMemory::~SharedMemory() {
  if (map_ != nullptr) ::munmap(map_, size_);
  if (fd_ >= 0) ::close(fd_);
}

void SharedMemory::reserve(size_t bytes) {
  if (bytes <= size_ && map_ != nullptr) return;
  constexpr size_t kStep = size_t{1} << 20;
  const size_t want = std::max<size_t>(kStep, (bytes + kStep - 1) / kStep * kStep);
  if (::ftruncate(fd_, static_cast<off_t>(want)) != 0) fail("ftruncate of shared memory");
  void* m = map_ == nullptr ? ::mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0)
                            : ::mremap(map_, size_, want, MREMAP_MAYMOVE);
  if (m == MAP_FAILED) fail("mmap of shared memory");
  map_ = m;
  size_ = want;
}

// ---- SharedMemoryView ----

SharedMemoryView::~SharedMemoryView() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

void SharedMemoryView::refresh() {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail("fstat of shared memory");
  const size_t want = static_cast<size_t>(st.st_size);
  if (want == size_ && map_ != nullptr) return;
  if (map_ != nullptr) ::munmap(map_, size_);
  map_ = nullptr;
  size_ = 0;
  if (want == 0) return;
  void* m = ::mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (m == MAP_FAILED) fail("mmap of shared memory");
  map_ = m;
  size_ = want;
}

// ---- Child ----

namespace {

// fork + exec with stdin from `stdin_fd` (-1: /dev/null) and stdout to `stdout_fd`; stderr to
// spec.log_path when set; the shared memory as kChildShmFd, the arena as kChildArenaFd. Everything
// the child needs is prepared before fork: the child only makes async-signal-safe calls (the
// campaign is multi-threaded). Throws std::runtime_error when fork fails.
pid_t spawn(const ChildSpec& spec, int stdin_fd, int stdout_fd) {
  std::vector<std::string> extra = spec.env;
  extra.push_back("MLAFUZZ_WORKER_PARENT=" + std::to_string(::getpid()));
  static std::once_flag ignore_sigpipe;
  std::call_once(ignore_sigpipe, [] { ::signal(SIGPIPE, SIG_IGN); });
  std::vector<char*> args;
  for (const auto& a : spec.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_store;
  for (char** e = environ; *e != nullptr; ++e) {
    const bool replaced = std::any_of(extra.begin(), extra.end(), [&](const std::string& x) {
      return std::strncmp(*e, x.c_str(), x.find('=') + 1) == 0;
    });
    if (!replaced) env_store.emplace_back(*e);
  }
  env_store.insert(env_store.end(), extra.begin(), extra.end());
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);
  const int log_fd =
      spec.log_path.empty()
          ? -1
          : ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  const int null_fd = stdin_fd < 0 ? ::open("/dev/null", O_RDONLY | O_CLOEXEC) : -1;
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Own process group: a terminal's Ctrl-C reaches the parent, which stops its children.
    ::setpgid(0, 0);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(stdin_fd >= 0 ? stdin_fd : null_fd, STDIN_FILENO);
    ::dup2(stdout_fd, STDOUT_FILENO);
    if (log_fd >= 0) ::dup2(log_fd, STDERR_FILENO);
    // The shared memory and the arena at their fixed numbers: first out of the way (a descriptor
    // may already hold the other's number), then in place; dup2 clears close-on-exec.
    const int shm_tmp = spec.shm_fd >= 0 ? ::fcntl(spec.shm_fd, F_DUPFD_CLOEXEC, 10) : -1;
    const int arena_tmp = spec.arena_fd >= 0 ? ::fcntl(spec.arena_fd, F_DUPFD_CLOEXEC, 10) : -1;
    if (shm_tmp >= 0) ::dup2(shm_tmp, kChildShmFd);
    if (arena_tmp >= 0) ::dup2(arena_tmp, kChildArenaFd);
    ::signal(SIGPIPE, SIG_DFL);
    ::signal(SIGINT, SIG_IGN);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  const int fork_errno = errno;
  if (log_fd >= 0) ::close(log_fd);
  if (null_fd >= 0) ::close(null_fd);
  if (pid < 0) {
    errno = fork_errno;
    fail("fork");
  }
  return pid;
}

}  // namespace

void Child::start(const ChildSpec& spec) {
  stop(0);
  spec_ = spec;
  int in_pipe[2], out_pipe[2];
  if (::pipe2(in_pipe, O_CLOEXEC) != 0) fail("pipe");
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(in_pipe[0]);
    ::close(in_pipe[1]);
    errno = err;
    fail("pipe");
  }
  pid_t pid = -1;
  try {
    pid = spawn(spec, in_pipe[0], out_pipe[1]);
  } catch (...) {
    for (int fd : {in_pipe[0], in_pipe[1], out_pipe[0], out_pipe[1]}) ::close(fd);
    throw;
  }
  ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  pid_ = pid;
  to_fd_ = in_pipe[1];
  from_fd_ = out_pipe[0];
  for (const int fd : {to_fd_, from_fd_}) {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    ::fcntl(fd, F_SETPIPE_SZ, 1 << 20);
  }
}

void Child::stop(uint32_t quit_type) {
  if (pid_ < 0) return;
  if (quit_type != 0) {
    const std::string h = frame_header(quit_type, 0);
    (void)write_all(to_fd_, h.data(), h.size(), Clock::now() + std::chrono::milliseconds(100));
  }
  ::close(to_fd_);
  ::close(from_fd_);
  int st = 0;
  if (!reap_within(pid_, &st, 50, 2)) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &st, 0);
  }
  pid_ = -1;
  to_fd_ = from_fd_ = -1;
}

std::string Child::kill_and_describe(const std::string& why) {
  std::string desc = spec_.label.empty() ? "worker" : spec_.label;
  if (pid_ < 0) return desc + ": " + why;
  desc += " (pid " + std::to_string(pid_) + ")";
  int st = 0;
  // A child that closed its pipe is probably dying: give it a moment to say how.
  const bool reaped = why != "timeout" && reap_within(pid_, &st, 200, 5);
  if (!reaped) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &st, 0);
  }
  if (why == "timeout") {
    desc.append(": ").append(kHangFault).append("; killed");
  } else {
    desc.append(" ").append(describe_status(st)).append(" (").append(why).append(")");
  }
  if (!spec_.log_path.empty()) desc.append("; its stderr is in ").append(spec_.log_path);
  ::close(to_fd_);
  ::close(from_fd_);
  pid_ = -1;
  to_fd_ = from_fd_ = -1;
  return desc;
}

namespace {

Clock::time_point deadline_in(double timeout_s) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
}

}  // namespace

Child::Reply Child::call(uint32_t type, std::string_view payload, double timeout_s) {
  Reply reply;
  reply.fault = send(type, payload, timeout_s);
  if (!reply.fault.empty()) return reply;
  return receive(timeout_s);
}

std::string Child::send(uint32_t type, std::string_view payload, double timeout_s) {
  if (pid_ < 0) return (spec_.label.empty() ? "worker" : spec_.label) + ": not running";
  const auto deadline = deadline_in(timeout_s);
  std::string h = frame_header(type, payload.size());
  Io io;
  if (payload.size() <= kOneWriteBytes) {
    // One write for header and payload: a reader woken by the header alone would block again
    // on the payload: a second wake-up per request.
    h.append(payload);
    io = write_all(to_fd_, h.data(), h.size(), deadline);
  } else {
    io = write_all(to_fd_, h.data(), h.size(), deadline);
    if (io == Io::kOk) io = write_all(to_fd_, payload.data(), payload.size(), deadline);
  }
  return io == Io::kOk ? std::string() : kill_and_describe(io_name(io));
}

Child::Reply Child::receive(double timeout_s) {
  Reply reply;
  if (pid_ < 0) {
    reply.fault = (spec_.label.empty() ? "worker" : spec_.label) + ": not running";
    return reply;
  }
  const auto deadline = deadline_in(timeout_s);
  char hdr[16];
  Io io = read_all(from_fd_, hdr, sizeof hdr, deadline);
  if (io != Io::kOk) {
    reply.fault = kill_and_describe(io_name(io));
    return reply;
  }
  uint32_t magic = 0;
  uint64_t len = 0;
  std::memcpy(&magic, hdr, 4);
  std::memcpy(&reply.type, hdr + 4, 4);
  std::memcpy(&len, hdr + 8, 8);
  if (magic != kFrameMagic || len > kMaxFrameBytes) {
    reply.fault = kill_and_describe("sent a malformed reply");
    return reply;
  }
  reply.payload.resize(len);
  io = read_all(from_fd_, reply.payload.data(), len, deadline);
  if (io != Io::kOk) reply.fault = kill_and_describe(io_name(io));
  return reply;
}

std::optional<std::string> run_capture(const std::vector<std::string>& argv, double timeout_s) {
  int out_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return std::nullopt;
  ChildSpec spec;
  spec.argv = argv;
  pid_t pid = -1;
  try {
    pid = spawn(spec, -1, out_pipe[1]);
  } catch (const std::exception&) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return std::nullopt;
  }
  ::close(out_pipe[1]);
  const int from = out_pipe[0];
  ::fcntl(from, F_SETFL, ::fcntl(from, F_GETFL) | O_NONBLOCK);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  std::string out;
  char buf[4096];
  bool ok = true;
  while (true) {
    const ssize_t k = ::read(from, buf, sizeof buf);
    if (k > 0) {
      out.append(buf, static_cast<size_t>(k));
    } else if (k == 0) {
      break;
    } else if (errno != EINTR && !(errno == EAGAIN && wait_fd(from, POLLIN, deadline) == Io::kOk)) {
      ok = false;
      break;
    }
  }
  ::close(from);
  int st = 0;
  if (!ok) ::kill(pid, SIGKILL);
  ::waitpid(pid, &st, 0);
  if (!ok || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return std::nullopt;
  return out;
}

}  // namespace mlafuzz::ipc
