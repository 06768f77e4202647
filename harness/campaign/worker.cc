#include "harness/campaign/worker.h"

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
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "core/command.h"
#include "core/settings.h"
#include "core/shared_arena.h"
#include "harness/backends/device_query.h"
#include "harness/backends/ipc_channel.h"
#include "harness/backends/registry.h"

extern char** environ;

namespace mlafuzz::campaign {
namespace {

using Clock = std::chrono::steady_clock;

// Whether workers read the case's arena vectors in the parent's shared arena (protocol 2) instead
// of receiving copies in the bulk area: whenever the parent has an arena.
bool arena_enabled() { return SharedArena::get() != nullptr; }

// ---- Worker side ----

// Leave when the campaign is gone, even while a backend call hangs (pipes alone would only
// tell a worker that is reading). Returns false when the parent is gone already.
bool watch_parent() {
  if (!settings::text("MLAFUZZ_WORKER_PARENT")) return true;
  const auto parent = static_cast<pid_t>(settings::integer("MLAFUZZ_WORKER_PARENT", 0));
  if (::getppid() != parent) return false;
  std::thread([parent] {
    while (true) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      if (::getppid() != parent) ::_exit(5);
    }
  }).detach();
  return true;
}

// The fault to report instead of `r` when the device context is poisoned for good (or the
// sticky_error hook says so): the worker then exits so that a fresh one follows.
std::optional<RunResult> sticky_fault(const Backend& backend, const WorkerHooks& hooks,
                                      int32_t heads, const RunResult& r) {
  std::optional<std::string> sticky;
  if (hooks.sticky_error) sticky = hooks.sticky_error(heads);
  if (!sticky && !r.ok() && backend.traits().on_device) sticky = sticky_device_error();
  if (!sticky) return std::nullopt;
  RunResult f;
  f.status = RunStatus::kFault;
  f.message = "device fault: " + *sticky + (r.message.empty() ? "" : " (" + r.message + ")");
  return f;
}

// One case's result, as the worker replies with it: its time and decode time, the before_run
// hook, the sticky-fault check. Returns the exit code when the worker must exit (4 after a
// sticky device fault: `r` is then the fault to report).
std::optional<int> after_run(const Backend& backend, const MaterializedCase& m, double run_s,
                             double decode_s, const WorkerHooks& hooks, RunResult& r) {
  if (hooks.before_run) hooks.before_run(m.heads);
  r.seconds = run_s;
  r.phases[Phase::kDecode] = decode_s;
  r.phases[Phase::kRun] = r.seconds;
  if (auto f = sticky_fault(backend, hooks, m.heads, r)) {
    r = std::move(*f);
    return 4;
  }
  return std::nullopt;
}

// The worker's replies carry the raw outputs: the campaign widens them (many threads), not this
// process (one call at a time for all of them).
RunOptions worker_options() {
  RunOptions o;
  o.raw_outputs = true;
  return o;
}

// A kRun request: decode, run, and the reply. Returns the exit code when the worker must exit
// (4 after a sticky device fault, 3 when the reply cannot be written).
std::optional<int> serve_run(Backend& backend, const std::string& payload, BulkArea& bulk,
                             const WorkerHooks& hooks, int reply_fd) {
  const auto t_decode = Clock::now();
  const MaterializedCase m = decode_case(payload, &bulk);
  const double decode_s = std::chrono::duration<double>(Clock::now() - t_decode).count();
  std::vector<CheckedRun> ran = backend.run_batch({&m}, worker_options());
  if (ran.size() != 1) throw std::logic_error("the backend lost the case");
  RunResult r;
  if (ran[0].unsupported) {
    r.status = RunStatus::kUnsupported;
    r.message = *ran[0].unsupported;
  } else {
    r = std::move(ran[0].result);
  }
  if (const auto code = after_run(backend, m, ran[0].seconds, decode_s, hooks, r)) {
    write_frame_blocking(reply_fd, MsgType::kRun, encode_result(r));
    return code;
  }
  // The case was copied out of the shared memory: the reply's vectors reuse it.
  if (!write_frame_blocking(reply_fd, MsgType::kRun, encode_result(r, &bulk))) return 3;
  return std::nullopt;
}

// Worker-local names of the decoded vectors (InputTags): a fresh one for each vector decoded,
// the first case's for a vector lent from it, so that a backend keeping device copies knows
// the lent ones without comparing their bytes again.
void tag_inputs(DecodedBatch& batch) {
  static uint64_t next = 0;
  for (size_t k = 0; k < batch.cases.size(); ++k) {
    for (int i = 0; i < 8; ++i) {
      const bool lent = k > 0 && (batch.same_as_first[k] & (1u << i)) != 0;
      batch.cases[k].input_tags.tag[i] = lent ? batch.cases[0].input_tags.tag[i] : ++next;
    }
  }
}

// A kRunBatch request: every case checked (unsupported) and run in order (Backend::run_batch),
// one reply per case as soon as it is done, so that a fault or hang is the case's own. The
// replies' vectors follow each other in the shared memory (the parent reads one while the next
// is written). A later case's vectors that equal the first case's are lent from it while the
// backend reads them (RunOptions::on_inputs: no copy). A backend that overlaps two calls (a
// PipelinedBackend: the CUDA backends) surfaces a device fault when its own case is finished
// (the call queued behind it is never replied to: the worker exits and the campaign reruns the
// rest of the batch one by one), so it stays that case's finding; the before_run hook strikes
// before that case's reply too.
std::optional<int> serve_batch(Backend& backend, const std::string& payload, BulkArea& bulk,
                               const WorkerHooks& hooks, int reply_fd) {
  const auto t_decode = Clock::now();
  DecodedBatch batch = decode_batch(payload, &bulk);
  tag_inputs(batch);
  const size_t n = batch.cases.size();
  const double decode_s =
      std::chrono::duration<double>(Clock::now() - t_decode).count() / std::max<size_t>(n, 1);
  std::vector<const MaterializedCase*> cases;
  for (const MaterializedCase& m : batch.cases) cases.push_back(&m);
  std::optional<int> code;
  RunOptions o = worker_options();
  o.on_inputs = [&](size_t k, bool) {
    swap_vectors(batch.cases[0], batch.cases[k], batch.same_as_first[k]);
  };
  o.on_result = [&](size_t k, CheckedRun& c) {
    if (c.unsupported) {
      if (!write_frame_blocking(reply_fd, MsgType::kRunBatch,
                                encode_checked(c.unsupported, {}, &bulk))) {
        code = 3;
      }
      return !code;
    }
    code = after_run(backend, batch.cases[k], c.seconds, decode_s, hooks, c.result);
    if (code) {  // a sticky fault: the result is the fault, sent without the shared memory
      write_frame_blocking(reply_fd, MsgType::kRunBatch,
                           encode_checked(std::nullopt, c.result, nullptr));
      return false;
    }
    if (!write_frame_blocking(reply_fd, MsgType::kRunBatch,
                              encode_checked(std::nullopt, c.result, &bulk))) {
      code = 3;
    }
    return !code;
  };
  backend.run_batch(cases, o);
  return code;
}

// One request other than kQuit. Returns the exit code when the worker must exit.
// The parent's shared arena, mapped read-only (protocol 2: flag 3 vectors are read there).
struct ArenaView {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

std::optional<int> serve(Backend& backend, MsgType type, const std::string& payload,
                         ipc::SharedMemoryView* shm, const ArenaView& arena,
                         const WorkerHooks& hooks, int reply_fd) {
  BulkArea bulk;
  if (shm != nullptr &&
      (type == MsgType::kRun || type == MsgType::kUnsupported || type == MsgType::kRunBatch)) {
    shm->refresh();  // the parent may have grown it for this case
    bulk = BulkArea{shm->data(), shm->size(), 0};
  }
  bulk.arena = arena.data;
  bulk.arena_size = arena.size;
  if (type == MsgType::kInfo) {
    if (!write_frame_blocking(reply_fd, MsgType::kInfo, encode_info(describe_backend(backend))))
      return 3;
  } else if (type == MsgType::kUnsupported) {
    const auto why = backend.unsupported(decode_case(payload, &bulk));
    std::string reply(1, why ? '\1' : '\0');
    if (why) reply += *why;
    if (!write_frame_blocking(reply_fd, MsgType::kUnsupported, reply)) return 3;
  } else if (type == MsgType::kRun) {
    return serve_run(backend, payload, bulk, hooks, reply_fd);
  } else if (type == MsgType::kRunBatch) {
    return serve_batch(backend, payload, bulk, hooks, reply_fd);
  } else {
    write_frame_blocking(reply_fd, MsgType::kError, "unknown request type");
    return 3;
  }
  return std::nullopt;
}

}  // namespace

WorkerInfo describe_backend(const Backend& backend) {
  WorkerInfo i;
  i.pid = static_cast<int32_t>(::getpid());
  i.traits = backend.traits();
  return i;
}

int run_worker(const std::string& backend_name, int in_fd, int out_fd, int shm_fd, int arena_fd,
               const WorkerHooks& hooks) {
  // Keep the protocol channel private: anything a backend prints to stdout goes to stderr.
  const int reply_fd = ::dup(out_fd);
  if (reply_fd < 0) return 3;
  ::dup2(STDERR_FILENO, out_fd);
  // Ctrl-C in a terminal reaches the whole foreground process group; the campaign stops its
  // workers itself.
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  if (!watch_parent()) return 5;

  std::unique_ptr<Backend> backend;
  std::string make_error;
  try {
    backend = make_backend(backend_name);
    if (hooks.wrap_backend) backend = hooks.wrap_backend(std::move(backend));
  } catch (const std::exception& e) {
    make_error = e.what();
  }
  // The parent's shared memory, when it gave one: large vectors of requests and replies.
  std::unique_ptr<ipc::SharedMemoryView> shm;
  if (shm_fd >= 0) shm = std::make_unique<ipc::SharedMemoryView>(shm_fd);
  // The parent's arena (sparse, its whole size: only the pages read cost anything).
  ArenaView arena;
  if (struct stat st{}; arena_fd >= 0 && ::fstat(arena_fd, &st) == 0 && st.st_size > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ,
                     MAP_SHARED | MAP_NORESERVE, arena_fd, 0);
    if (p != MAP_FAILED) arena = {static_cast<const uint8_t*>(p), static_cast<size_t>(st.st_size)};
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
      if (const auto code = serve(*backend, type, payload, shm.get(), arena, hooks, reply_fd)) {
        return *code;
      }
    } catch (const std::exception& e) {
      write_frame_blocking(reply_fd, MsgType::kError, e.what());
      return 3;
    }
  }
}

std::string self_executable() {
  if (auto e = settings::text("MLAFUZZ_WORKER_EXE")) return *e;
  std::string exe = executable_path();
  if (exe.empty()) throw std::runtime_error("cannot find the mlafuzz executable (/proc/self/exe)");
  return exe;
}

// ---------------------------------------------------------------------------------------------
// Parent side
// ---------------------------------------------------------------------------------------------

WorkerProcess::WorkerProcess(WorkerSpec spec) : spec_(std::move(spec)) {}

WorkerProcess::~WorkerProcess() { stop(); }

void WorkerProcess::start() {
  ipc::ChildSpec c;
  if (spec_.device >= 0) {
    // Map through the parent's own CUDA_VISIBLE_DEVICES list when it has one.
    std::string dev = std::to_string(spec_.device);
    if (!spec_.visible_list.empty()) {
      std::vector<std::string> items;
      size_t pos = 0;
      while (pos <= spec_.visible_list.size()) {
        const size_t comma = spec_.visible_list.find(',', pos);
        items.push_back(
            spec_.visible_list.substr(pos, comma == std::string::npos ? comma : comma - pos));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
      if (spec_.device < static_cast<int>(items.size())) dev = items[spec_.device];
    }
    c.env.push_back("CUDA_VISIBLE_DEVICES=" + dev);
  }
  if (!shm_) shm_ = std::make_unique<ipc::SharedMemory>("mlafuzz-worker");
  c.argv = {spec_.exe,     "worker",   "--backend",
            spec_.backend, "--shm-fd", std::to_string(ipc::kChildShmFd)};
  c.shm_fd = shm_->fd();
  if (arena_enabled()) {
    c.arena_fd = SharedArena::get()->read_only_fd();
    c.argv.insert(c.argv.end(), {"--arena-fd", std::to_string(ipc::kChildArenaFd)});
  }
  c.log_path = spec_.log_path;
  c.label = "worker for " + spec_.backend;
  if (spec_.device >= 0) c.label += " on GPU " + std::to_string(spec_.device);
  child_.start(c);
  ++starts_;
}

void WorkerProcess::stop() { child_.stop(static_cast<uint32_t>(MsgType::kQuit)); }

std::string WorkerProcess::kill_and_describe(const std::string& why) {
  return child_.kill_and_describe(why);
}

WorkerProcess::Reply WorkerProcess::call(MsgType type, const std::string& payload,
                                         double timeout_s) {
  if (!child_.running()) start();
  ipc::Child::Reply r = child_.call(static_cast<uint32_t>(type), payload, timeout_s);
  return Reply{static_cast<MsgType>(r.type), std::move(r.payload), std::move(r.fault)};
}

BulkArea WorkerProcess::bulk_for(const MaterializedCase& m) {
  if (!child_.running()) start();
  shm_->reserve(bulk_bytes_needed(m));
  BulkArea b{shm_->data(), shm_->size(), 0};
  b.use_arena = arena_enabled();
  return b;
}

const WorkerInfo& WorkerProcess::info() {
  if (info_ && child_.running()) return *info_;
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
  if (!child_.running()) {
    try {
      info();  // a fresh worker: start it (device init) outside the case's timeout
    } catch (const std::exception& e) {
      res.status = RunStatus::kFault;
      res.message = std::string("worker restart failed: ") + e.what();
      return res;
    }
  }
  const auto t_encode = Clock::now();
  BulkArea bulk = bulk_for(m);
  const std::string request = encode_case(m, &bulk);
  const double encode_s = std::chrono::duration<double>(Clock::now() - t_encode).count();
  const Reply r = call(MsgType::kRun, request, timeout_s);
  if (!r.fault.empty()) {
    res.status = RunStatus::kFault;
    res.message = r.fault;
    return res;
  }
  if (r.type == MsgType::kError) return fault_from("reported: " + r.payload);
  try {
    res = decode_result(r.payload, &bulk);
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

RunResult WorkerProcess::fault_from(const std::string& why) {
  RunResult res;
  res.status = RunStatus::kFault;
  res.message = kill_and_describe(why);
  return res;
}

std::vector<CheckedRun> WorkerProcess::run_batch(const std::vector<const MaterializedCase*>& cases,
                                                 double timeout_s,
                                                 const std::vector<uint32_t>* same, double same_s) {
  std::vector<CheckedRun> out(cases.size());
  if (cases.empty()) return out;
  if (!child_.running()) {
    try {
      info();  // a fresh worker: start it (device init) outside the case's timeout
    } catch (const std::exception& e) {
      for (CheckedRun& c : out) {
        c.result.status = RunStatus::kFault;
        c.result.message = std::string("worker restart failed: ") + e.what();
      }
      return out;
    }
  }
  const auto t_encode = Clock::now();
  size_t need = 0;
  for (const MaterializedCase* m : cases) need += bulk_bytes_needed(*m);
  shm_->reserve(need);
  BulkArea bulk{shm_->data(), shm_->size(), 0};
  bulk.use_arena = arena_enabled();
  const std::string request = encode_batch(cases, &bulk, same);
  const double encode_s =
      (same_s + std::chrono::duration<double>(Clock::now() - t_encode).count()) / cases.size();
  // The worker writes its replies' vectors from the start of the area (it copied the request
  // out first), each after the previous one; a reply names its vectors' offsets.
  std::string fault = child_.send(static_cast<uint32_t>(MsgType::kRunBatch), request, timeout_s);
  size_t k = 0;
  for (; k < cases.size() && fault.empty(); ++k) {
    const ipc::Child::Reply r = child_.receive(timeout_s);
    if (!r.fault.empty()) {
      fault = r.fault;
      break;
    }
    const auto type = static_cast<MsgType>(r.type);
    if (type != MsgType::kRunBatch) {
      out[k].result = fault_from(type == MsgType::kError ? "reported: " + r.payload
                                                         : std::string("sent an unexpected reply"));
      ++k;
      break;
    }
    try {
      out[k] = decode_checked(r.payload, &bulk);
    } catch (const std::exception& e) {
      out[k].result = fault_from(std::string("sent a malformed result: ") + e.what());
      ++k;
      break;
    }
    if (!out[k].unsupported && out[k].result.status == RunStatus::kFault) {
      out[k].result.message = kill_and_describe(out[k].result.message);
      ++k;
      break;
    }
    out[k].result.phases[Phase::kEncode] = encode_s;
  }
  if (!fault.empty() && k < cases.size()) {
    out[k].result.status = RunStatus::kFault;
    out[k].result.message = fault;
    ++k;
  }
  // After a fault: the rest of the batch one by one, on a fresh worker, as unbatched calls.
  for (; k < cases.size(); ++k) {
    out[k].unsupported = unsupported(*cases[k], timeout_s);
    if (!out[k].unsupported) out[k].result = run(*cases[k], timeout_s);
  }
  return out;
}

std::optional<std::string> WorkerProcess::unsupported(const MaterializedCase& m, double timeout_s) {
  if (!child_.running()) info();
  BulkArea bulk = bulk_for(m);
  const Reply r = call(MsgType::kUnsupported, encode_case(m, &bulk), timeout_s);
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
  traits_ = slot_->proc.info().traits;
}

std::optional<std::string> ProxyBackend::unsupported(const MaterializedCase& m) const {
  std::lock_guard<std::mutex> lock(slot_->mu);
  try {
    return slot_->proc.unsupported(m, timeout_s_);
  } catch (const std::exception&) {
    return std::nullopt;  // the run will record the fault
  }
}

RunResult ProxyBackend::run_case(const MaterializedCase& m) {
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
    faults_.push_back({traits_.name, r.message});
  }
  return r;
}

std::vector<CheckedRun> ProxyBackend::run_batch(const std::vector<const MaterializedCase*>& cases,
                                                const RunOptions& o) {
  if (cases.empty()) return {};
  std::vector<CheckedRun> out;
  // The variants' buffers compared with the first case's before the worker is taken: the
  // comparisons (whole caches, byte for byte) run on this thread while the worker serves others.
  const auto t_same = Clock::now();
  const std::vector<uint32_t> same = batch_same_masks(cases);
  const double same_s = std::chrono::duration<double>(Clock::now() - t_same).count();
  const auto t_wait = Clock::now();
  {
    std::lock_guard<std::mutex> lock(slot_->mu);
    const auto t_call = Clock::now();
    out = slot_->proc.run_batch(cases, timeout_s_, &same, same_s);
    const auto t_end = Clock::now();
    const double n = static_cast<double>(cases.size());
    const double queue_s = std::chrono::duration<double>(t_call - t_wait).count() / n;
    const double call_s = std::chrono::duration<double>(t_end - t_call).count() / n;
    double inside = 0;  // the calls' own encode, decode and run, summed
    for (const CheckedRun& c : out) {
      inside += c.result.phases[Phase::kEncode] + c.result.phases[Phase::kDecode] +
                c.result.phases[Phase::kRun];
    }
    const double transport_s = std::max(0.0, call_s - inside / n);
    for (CheckedRun& c : out) {
      if (c.result.status == RunStatus::kFault) ++slot_->faults;
      c.result.phases[Phase::kQueue] = queue_s;
      c.result.phases[Phase::kTransport] = transport_s;
      c.seconds = queue_s + call_s;
    }
  }
  // Outside the lock: the threads widen in parallel.
  for (size_t i = 0; i < out.size(); ++i) {
    if (!out[i].unsupported) widen(*cases[i], out[i].result, !o.raw_outputs);
    // One request carried the whole batch: counted with its first call.
    totals_->add(out[i].result.phases, i == 0 ? 1 : 0);
    if (out[i].result.status == RunStatus::kFault) {
      std::lock_guard<std::mutex> lock(faults_mu_);
      faults_.push_back({traits_.name, out[i].result.message});
    }
  }
  if (o.on_result) {
    for (size_t i = 0; i < out.size(); ++i) {
      if (!o.on_result(i, out[i])) {
        out.resize(i + 1);
        break;
      }
    }
  }
  return out;
}

void ProxyBackend::widen(const MaterializedCase& m, RunResult& r, bool values) {
  if (!r.outputs_pending) return;
  const auto t0 = Clock::now();
  if (values) {
    widen_raw_outputs(m, r);
  } else {
    check_raw_outputs(m, r);
  }
  r.phases[Phase::kWiden] = std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<FaultRecord> ProxyBackend::take_faults() {
  std::lock_guard<std::mutex> lock(faults_mu_);
  std::vector<FaultRecord> out;
  out.swap(faults_);
  return out;
}

}  // namespace mlafuzz::campaign
