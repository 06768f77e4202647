#include "harness/campaign/worker.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "harness/backends/device_query.h"
#include "harness/backends/registry.h"

extern char** environ;

namespace mlafuzz::campaign {
namespace {

using Clock = std::chrono::steady_clock;

// ---- Worker side ----

struct TestFault {
  std::string kind;  // "", crash, abort, hang, sticky
  int min_heads = 1;
};

TestFault test_fault_from_env() {
  TestFault t;
  const char* v = std::getenv("MLAFUZZ_TEST_FAULT");
  if (!v || !*v) return t;
  std::string s = v;
  const auto colon = s.find(':');
  if (colon != std::string::npos) {
    t.min_heads = std::atoi(s.c_str() + colon + 1);
    s = s.substr(0, colon);
  }
  t.kind = s;
  return t;
}

}  // namespace

int run_worker(const std::string& backend_name, int in_fd, int out_fd) {
  // Keep the protocol channel private: anything a backend prints to stdout goes to stderr.
  const int reply_fd = ::dup(out_fd);
  if (reply_fd < 0) return 3;
  ::dup2(STDERR_FILENO, out_fd);
  // Ctrl-C in a terminal reaches the whole foreground process group; the campaign stops its
  // workers itself.
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  const TestFault tf = test_fault_from_env();
  // Leave when the campaign is gone, even while a backend call hangs (pipes alone would only
  // tell a worker that is reading).
  if (const char* p = std::getenv("MLAFUZZ_WORKER_PARENT"); p && *p) {
    const pid_t parent = static_cast<pid_t>(std::atoll(p));
    if (::getppid() != parent) return 5;
    std::thread([parent] {
      while (true) {
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        if (::getppid() != parent) ::_exit(5);
      }
    }).detach();
  }

  std::unique_ptr<Backend> backend;
  std::string make_error;
  try {
    backend = make_backend(backend_name);
  } catch (const std::exception& e) {
    make_error = e.what();
  }

  MsgType type;
  std::string payload;
  while (true) {
    try {
      if (!read_frame_blocking(in_fd, type, payload)) return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "mlafuzz worker %s: %s\n", backend_name.c_str(), e.what());
      return 3;
    }
    if (type == MsgType::kQuit) return 0;
    if (!backend) {
      write_frame_blocking(reply_fd, MsgType::kError, make_error);
      return 3;
    }
    try {
      if (type == MsgType::kInfo) {
        WorkerInfo i;
        i.name = backend->name();
        i.precision = static_cast<int32_t>(backend->precision());
        const Availability a = backend->availability();
        i.available = a.available;
        i.reason = a.reason;
        i.abs_tol = backend->abs_tol();
        i.rel_tol = backend->rel_tol();
        i.on_device = backend->on_device();
        i.needs_worker = backend->needs_worker();
        i.is_reference = backend->is_reference();
        i.simt_partner = backend->simt_partner();
        i.pid = static_cast<int32_t>(::getpid());
        if (!write_frame_blocking(reply_fd, MsgType::kInfo, encode_info(i))) return 3;
      } else if (type == MsgType::kUnsupported) {
        const MaterializedCase m = decode_case(payload);
        const auto why = backend->unsupported(m);
        std::string reply(1, why ? '\1' : '\0');
        if (why) reply += *why;
        if (!write_frame_blocking(reply_fd, MsgType::kUnsupported, reply)) return 3;
      } else if (type == MsgType::kRun) {
        const auto t_decode = Clock::now();
        const MaterializedCase m = decode_case(payload);
        const double decode_s = std::chrono::duration<double>(Clock::now() - t_decode).count();
        if (!tf.kind.empty() && m.heads >= tf.min_heads) {
          if (tf.kind == "crash") {
            ::signal(SIGSEGV, SIG_DFL);
            ::raise(SIGSEGV);
          } else if (tf.kind == "abort") {
            std::abort();
          } else if (tf.kind == "hang") {
            while (true) ::pause();
          }
        }
        const auto t0 = Clock::now();
        RunResult r = backend->run(m);
        r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        r.phases[Phase::kDecode] = decode_s;
        r.phases[Phase::kRun] = r.seconds;
        std::optional<std::string> sticky;
        if (tf.kind == "sticky" && m.heads >= tf.min_heads) {
          sticky = "cudaErrorIllegalAddress: an illegal memory access was encountered (test hook)";
        } else if (!r.ok() && backend->on_device()) {
          sticky = sticky_device_error();
        }
        if (sticky) {
          // The context is poisoned for good: report, then exit so that a fresh worker follows.
          RunResult f;
          f.status = RunStatus::kFault;
          f.message =
              "device fault: " + *sticky + (r.message.empty() ? "" : " (" + r.message + ")");
          write_frame_blocking(reply_fd, MsgType::kRun, encode_result(f));
          return 4;
        }
        if (!write_frame_blocking(reply_fd, MsgType::kRun, encode_result(r))) return 3;
      } else {
        write_frame_blocking(reply_fd, MsgType::kError, "unknown request type");
        return 3;
      }
    } catch (const std::exception& e) {
      write_frame_blocking(reply_fd, MsgType::kError, e.what());
      return 3;
    }
  }
}

std::string self_executable() {
  if (const char* e = std::getenv("MLAFUZZ_WORKER_EXE"); e && *e) return e;
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("cannot find the mlafuzz executable (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

// ---------------------------------------------------------------------------------------------
// Parent side
// ---------------------------------------------------------------------------------------------

namespace {

struct Spawned {
  pid_t pid = -1;
  int to = -1, from = -1;
};

std::string describe_status(int st) {
  if (WIFEXITED(st)) return "exited with status " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) {
    const int s = WTERMSIG(st);
    const char* name = ::strsignal(s);
    return "killed by signal " + std::to_string(s) + " (" + (name ? name : "?") + ")";
  }
  return "stopped";
}

// fork + exec with stdin/stdout on pipes. Everything the child needs is prepared before fork,
// so that the child only makes async-signal-safe calls (the campaign is multi-threaded).
Spawned spawn(const std::vector<std::string>& argv, std::vector<std::string> extra_env,
              const std::string& log_path, bool pipe_stdin) {
  extra_env.push_back("MLAFUZZ_WORKER_PARENT=" + std::to_string(::getpid()));
  static std::once_flag ignore_sigpipe;
  std::call_once(ignore_sigpipe, [] { ::signal(SIGPIPE, SIG_IGN); });
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e) {
    bool replaced = false;
    for (const auto& x : extra_env) {
      const auto eq = x.find('=');
      if (std::strncmp(*e, x.c_str(), eq + 1) == 0) replaced = true;
    }
    if (!replaced) env_store.emplace_back(*e);
  }
  for (const auto& x : extra_env) env_store.push_back(x);
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);

  int in_pipe[2] = {-1, -1}, out_pipe[2] = {-1, -1};
  if (pipe_stdin && ::pipe2(in_pipe, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    const int err = errno;
    if (pipe_stdin) {
      ::close(in_pipe[0]);
      ::close(in_pipe[1]);
    }
    throw std::runtime_error(std::string("pipe: ") + std::strerror(err));
  }
  int log_fd = -1;
  if (!log_path.empty()) {
    log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Child: own process group (a terminal's Ctrl-C goes to the campaign only), stdin/stdout
    // on the pipes, stderr to the log. (Not PR_SET_PDEATHSIG: it fires when the forking
    // *thread* ends, and evaluation threads end before the campaign does; the worker watches
    // its parent instead, see run_worker.)
    ::setpgid(0, 0);
    if (::getppid() != parent) ::_exit(127);
    if (pipe_stdin) {
      ::dup2(in_pipe[0], STDIN_FILENO);
    } else {
      const int devnull = ::open("/dev/null", O_RDONLY);
      if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    }
    ::dup2(out_pipe[1], STDOUT_FILENO);
    if (log_fd >= 0) ::dup2(log_fd, STDERR_FILENO);
    ::signal(SIGPIPE, SIG_DFL);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  const int fork_errno = errno;
  if (log_fd >= 0) ::close(log_fd);
  if (pipe_stdin) ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  if (pid < 0) {
    if (pipe_stdin) ::close(in_pipe[1]);
    ::close(out_pipe[0]);
    throw std::runtime_error(std::string("fork: ") + std::strerror(fork_errno));
  }
  Spawned s;
  s.pid = pid;
  s.to = pipe_stdin ? in_pipe[1] : -1;
  s.from = out_pipe[0];
  if (s.to >= 0) {
    ::fcntl(s.to, F_SETFL, ::fcntl(s.to, F_GETFL) | O_NONBLOCK);
    ::fcntl(s.to, F_SETPIPE_SZ, 1 << 20);
  }
  ::fcntl(s.from, F_SETFL, ::fcntl(s.from, F_GETFL) | O_NONBLOCK);
  ::fcntl(s.from, F_SETPIPE_SZ, 1 << 20);
  return s;
}

// Result of a deadline-bounded transfer.
enum class Io { kOk, kEof, kTimeout, kError };

double remaining(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

Io wait_fd(int fd, short events, Clock::time_point deadline) {
  while (true) {
    const double left = remaining(deadline);
    if (left <= 0) return Io::kTimeout;
    pollfd p{fd, events, 0};
    const int ms = static_cast<int>(std::min(left * 1000.0 + 1, 1000.0));
    const int k = ::poll(&p, 1, ms);
    if (k < 0) {
      if (errno == EINTR) continue;
      return Io::kError;
    }
    if (k > 0) return Io::kOk;
  }
}

Io write_all(int fd, const char* p, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    const ssize_t k = ::write(fd, p, n);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const Io w = wait_fd(fd, POLLOUT, deadline);
      if (w != Io::kOk) return w;
      continue;
    }
    return errno == EPIPE ? Io::kEof : Io::kError;
  }
  return Io::kOk;
}

Io read_all(int fd, char* p, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    const ssize_t k = ::read(fd, p, n);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k == 0) return Io::kEof;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const Io w = wait_fd(fd, POLLIN, deadline);
      if (w != Io::kOk) return w;
      continue;
    }
    return Io::kError;
  }
  return Io::kOk;
}

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

}  // namespace

WorkerProcess::WorkerProcess(WorkerSpec spec) : spec_(std::move(spec)) {}

WorkerProcess::~WorkerProcess() { stop(); }

void WorkerProcess::start() {
  std::vector<std::string> env;
  if (spec_.device >= 0) {
    // Map through the parent's own CUDA_VISIBLE_DEVICES list when it has one.
    std::string dev = std::to_string(spec_.device);
    if (!spec_.visible_list.empty()) {
      std::vector<std::string> items;
      size_t pos = 0;
      while (pos <= spec_.visible_list.size()) {
        const size_t c = spec_.visible_list.find(',', pos);
        items.push_back(spec_.visible_list.substr(pos, c == std::string::npos ? c : c - pos));
        if (c == std::string::npos) break;
        pos = c + 1;
      }
      if (spec_.device < static_cast<int>(items.size())) dev = items[spec_.device];
    }
    env.push_back("CUDA_VISIBLE_DEVICES=" + dev);
  }
  const Spawned s =
      spawn({spec_.exe, "worker", "--backend", spec_.backend}, env, spec_.log_path, true);
  pid_ = s.pid;
  to_fd_ = s.to;
  from_fd_ = s.from;
  ++starts_;
}

void WorkerProcess::stop() {
  if (pid_ < 0) return;
  // Polite first (the worker exits on kQuit or EOF), then SIGKILL.
  const std::string h = frame_header(MsgType::kQuit, 0);
  (void)write_all(to_fd_, h.data(), h.size(), Clock::now() + std::chrono::milliseconds(100));
  ::close(to_fd_);
  ::close(from_fd_);
  int st = 0;
  bool reaped = false;
  for (int i = 0; i < 50 && !reaped; ++i) {
    if (::waitpid(pid_, &st, WNOHANG) == pid_) {
      reaped = true;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  if (!reaped) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &st, 0);
  }
  pid_ = -1;
  to_fd_ = from_fd_ = -1;
}

std::string WorkerProcess::kill_and_describe(const std::string& why) {
  std::string desc = "worker for " + spec_.backend;
  if (spec_.device >= 0) desc += " on GPU " + std::to_string(spec_.device);
  if (pid_ < 0) return desc + ": " + why;
  desc += " (pid " + std::to_string(pid_) + ")";
  int st = 0;
  bool reaped = false;
  if (why != "timeout") {
    // It closed its pipe: it is probably dying; give it a moment to report how.
    for (int i = 0; i < 200 && !reaped; ++i) {
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        reaped = true;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  }
  if (!reaped) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &st, 0);
  }
  if (why == "timeout") {
    desc += ": no reply within the case timeout (hang); killed";
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

WorkerProcess::Reply WorkerProcess::call(MsgType type, const std::string& payload,
                                         double timeout_s) {
  Reply reply;
  if (pid_ < 0) start();
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  const std::string h = frame_header(type, payload.size());
  Io io = write_all(to_fd_, h.data(), h.size(), deadline);
  if (io == Io::kOk) io = write_all(to_fd_, payload.data(), payload.size(), deadline);
  char hdr[16];
  if (io == Io::kOk) io = read_all(from_fd_, hdr, sizeof hdr, deadline);
  if (io != Io::kOk) {
    reply.fault = kill_and_describe(io_name(io));
    return reply;
  }
  uint32_t magic, t;
  uint64_t len;
  std::memcpy(&magic, hdr, 4);
  std::memcpy(&t, hdr + 4, 4);
  std::memcpy(&len, hdr + 8, 8);
  if (magic != kFrameMagic || len > (uint64_t{1} << 36)) {
    reply.fault = kill_and_describe("sent a malformed reply");
    return reply;
  }
  reply.type = static_cast<MsgType>(t);
  reply.payload.resize(len);
  io = read_all(from_fd_, reply.payload.data(), len, deadline);
  if (io != Io::kOk) {
    reply.fault = kill_and_describe(io_name(io));
    return reply;
  }
  return reply;
}

const WorkerInfo& WorkerProcess::info() {
  if (info_ && pid_ >= 0) return *info_;
  const Reply r = call(MsgType::kInfo, "", spec_.start_timeout_s);
  if (!r.fault.empty()) throw std::runtime_error(r.fault);
  if (r.type == MsgType::kError) {
    const std::string msg = r.payload;
    kill_and_describe("refused");
    throw std::runtime_error(msg);
  }
  if (r.type != MsgType::kInfo) throw std::runtime_error("worker sent an unexpected reply");
  info_ = decode_info(r.payload);
  return *info_;
}

RunResult WorkerProcess::run(const MaterializedCase& m, double timeout_s) {
  RunResult res;
  if (pid_ < 0) {
    try {
      info();  // a fresh worker: start it (device init) outside the case's timeout
    } catch (const std::exception& e) {
      res.status = RunStatus::kFault;
      res.message = std::string("worker restart failed: ") + e.what();
      return res;
    }
  }
  const auto t_encode = Clock::now();
  const std::string request = encode_case(m);
  const double encode_s = std::chrono::duration<double>(Clock::now() - t_encode).count();
  const Reply r = call(MsgType::kRun, request, timeout_s);
  if (!r.fault.empty()) {
    res.status = RunStatus::kFault;
    res.message = r.fault;
    return res;
  }
  if (r.type == MsgType::kError) {
    res.status = RunStatus::kFault;
    res.message = kill_and_describe("reported: " + r.payload);
    return res;
  }
  try {
    res = decode_result(r.payload);
  } catch (const std::exception& e) {
    res = RunResult{};
    res.status = RunStatus::kFault;
    res.message = kill_and_describe(std::string("sent a malformed result: ") + e.what());
    return res;
  }
  if (res.status == RunStatus::kFault) {
    // The worker reported a sticky device error and exits: reap it.
    res.message = kill_and_describe(res.message);
  }
  res.phases[Phase::kEncode] = encode_s;
  return res;
}

std::optional<std::string> WorkerProcess::unsupported(const MaterializedCase& m, double timeout_s) {
  if (pid_ < 0) info();
  const Reply r = call(MsgType::kUnsupported, encode_case(m), timeout_s);
  // A worker that cannot answer will fault on run() too, where the fault is recorded.
  if (!r.fault.empty() || r.type != MsgType::kUnsupported || r.payload.empty()) {
    return std::nullopt;
  }
  if (r.payload[0] == '\0') return std::nullopt;
  return r.payload.substr(1);
}

// ---------------------------------------------------------------------------------------------
// ProxyBackend
// ---------------------------------------------------------------------------------------------

ProxyBackend::ProxyBackend(std::shared_ptr<WorkerSlot> slot, double case_timeout_s)
    : slot_(std::move(slot)), timeout_s_(case_timeout_s) {
  std::lock_guard<std::mutex> lock(slot_->mu);
  info_ = slot_->proc.info();
}

std::optional<std::string> ProxyBackend::unsupported(const MaterializedCase& m) const {
  std::lock_guard<std::mutex> lock(slot_->mu);
  try {
    return slot_->proc.unsupported(m, timeout_s_);
  } catch (const std::exception&) {
    return std::nullopt;  // run() will record the fault
  }
}

RunResult ProxyBackend::run(const MaterializedCase& m) {
  RunResult r;
  const auto t_wait = Clock::now();
  {
    std::lock_guard<std::mutex> lock(slot_->mu);
    const auto t_call = Clock::now();
    r = slot_->proc.run(m, timeout_s_);
    const double call_s = std::chrono::duration<double>(Clock::now() - t_call).count();
    if (r.status == RunStatus::kFault) ++slot_->faults;
    r.phases[Phase::kQueue] = std::chrono::duration<double>(t_call - t_wait).count();
    // The rest of the call is the proxy's encoding, the transport and the worker's decode+run.
    r.phases[Phase::kTransport] = std::max(
        0.0, call_s - r.phases[Phase::kEncode] - r.phases[Phase::kDecode] - r.phases[Phase::kRun]);
  }
  totals_->add(r.phases);
  if (r.status == RunStatus::kFault) {
    std::lock_guard<std::mutex> lock(faults_mu_);
    faults_.push_back({info_.name, r.message});
  }
  return r;
}

std::vector<FaultRecord> ProxyBackend::take_faults() {
  std::lock_guard<std::mutex> lock(faults_mu_);
  std::vector<FaultRecord> out;
  out.swap(faults_);
  return out;
}

// ---------------------------------------------------------------------------------------------

std::optional<std::string> run_capture(const std::vector<std::string>& argv, double timeout_s) {
  Spawned s;
  try {
    s = spawn(argv, {}, "", false);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  std::string out;
  char buf[4096];
  bool ok = true;
  while (true) {
    const ssize_t k = ::read(s.from, buf, sizeof buf);
    if (k > 0) {
      out.append(buf, static_cast<size_t>(k));
      continue;
    }
    if (k == 0) break;
    if (errno == EINTR) continue;
    if (errno == EAGAIN && wait_fd(s.from, POLLIN, deadline) == Io::kOk) continue;
    ok = false;
    break;
  }
  ::close(s.from);
  int st = 0;
  if (!ok) ::kill(s.pid, SIGKILL);
  ::waitpid(s.pid, &st, 0);
  if (!ok || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return std::nullopt;
  return out;
}

}  // namespace mlafuzz::campaign
