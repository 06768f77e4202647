// Fault isolation: a backend that runs in a child process (`mlafuzz worker --backend NAME`),
// seen by the campaign as an ordinary Backend.
//
// A device fault (illegal address, trap: the worker reports the sticky error and exits, or just
// dies), a crash (any signal), a hang (no reply within the per-case timeout: the worker is
// killed) or a protocol error becomes a RunResult with RunStatus::kFault; the next call starts
// a fresh worker. Any backend name the worker can construct works: CUDA kernels, plugins
// ("plugin:/path.so"), mutants, host models.
//
// The worker's seams (WorkerHooks) let a test worker (tests/harness/test_worker.cc, started
// through MLAFUZZ_WORKER_EXE) crash, hang or report a sticky device error where a case runs, so
// that isolation is tested without a GPU; `mlafuzz worker` installs none.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/backend.h"
#include "harness/backends/ipc_channel.h"
#include "harness/campaign/worker_protocol.h"

namespace mlafuzz::campaign {

// What a worker's INFO reply says about the backend it serves (Backend's declarations).
WorkerInfo describe_backend(const Backend& backend);

// Seams of the worker's main loop for a test worker (tests/harness/test_worker.cc); each is
// optional, and `mlafuzz worker` sets none.
struct WorkerHooks {
  // Wraps the backend the worker serves (e.g. in one that overlaps two calls).
  std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>)> wrap_backend;
  // Called where a case with `heads` heads has run, before its reply.
  std::function<void(int32_t heads)> before_run;
  // A sticky device error to report instead of the result of a case with `heads` heads.
  std::function<std::optional<std::string>(int32_t heads)> sticky_error;
};

// The worker's main loop: serves requests on in_fd, replies on out_fd, until kQuit or EOF.
// shm_fd (-1: none) is the parent's shared memory for large vectors (worker_protocol.h,
// BulkArea). Returns the process exit code. (harness/cli/worker.cc calls it.)
// arena_fd (-1: none) is a read-only descriptor of the parent's shared arena (flag 3 vectors).
// The worker runs its backend with raw outputs (RunOptions::raw_outputs): the campaign widens
// them.
int run_worker(const std::string& backend_name, int in_fd, int out_fd, int shm_fd = -1,
               int arena_fd = -1, const WorkerHooks& hooks = {});

// Path of the running executable (/proc/self/exe), or MLAFUZZ_WORKER_EXE when set.
std::string self_executable();

struct WorkerSpec {
  std::string exe;           // the mlafuzz binary
  std::string backend;       // name passed to --backend
  int device = -1;           // GPU ordinal, -1: none; sets CUDA_VISIBLE_DEVICES in the child
  std::string visible_list;  // the parent's CUDA_VISIBLE_DEVICES, mapped through when set
  std::string log_path;      // the worker's stderr goes here (appended); "" = inherit
  double start_timeout_s = 120;
};

// One worker process. Not thread-safe: WorkerSlot adds the lock.
class WorkerProcess {
 public:
  explicit WorkerProcess(WorkerSpec spec);
  ~WorkerProcess();
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  // Starts the worker if needed and returns what it serves. Throws std::runtime_error when the
  // worker cannot start or refuses the backend (the message says why).
  const WorkerInfo& info();
  // A request and its reply. On a crash, hang or protocol error: the worker is killed, the
  // reply has `fault` set (a description), and the next call starts a fresh worker.
  struct Reply {
    MsgType type = MsgType::kError;
    std::string payload;
    std::string fault;
  };
  Reply call(MsgType type, const std::string& payload, double timeout_s);
  // Results may carry only the raw outputs (outputs_pending, worker protocol 2): the caller
  // widens them (widen_raw_outputs; ProxyBackend does, outside the slot's lock).
  RunResult run(const MaterializedCase& m, double timeout_s);
  std::optional<std::string> unsupported(const MaterializedCase& m, double timeout_s);
  // unsupported() and run() of every case in one kRunBatch request (each reply within
  // timeout_s of the previous one). When the worker faults on case k, k is the fault and the
  // cases after it run one by one as run() and unsupported() would (on a fresh worker).
  // Each result's phases hold its share of the batch's encode and decode. `same`, when given,
  // is batch_same_masks(cases), computed by the caller before it took the worker (the
  // comparisons of the variants' buffers with the first case's are most of the encoding).
  std::vector<CheckedRun> run_batch(const std::vector<const MaterializedCase*>& cases,
                                    double timeout_s, const std::vector<uint32_t>* same = nullptr,
                                    double same_s = 0);
  int starts() const { return starts_; }
  const WorkerSpec& spec() const { return spec_; }
  void stop();

 private:
  void start();
  std::string kill_and_describe(const std::string& why);
  // The shared memory grown for `m`'s request and reply (starts the worker if needed).
  BulkArea bulk_for(const MaterializedCase& m);
  // A reply that is an error or carries a sticky fault: the worker is killed or reaped and the
  // result is a kFault describing it.
  RunResult fault_from(const std::string& why);

  WorkerSpec spec_;
  ipc::Child child_;
  std::unique_ptr<ipc::SharedMemory> shm_;  // inherited by every worker this object starts
  std::optional<WorkerInfo> info_;
  int starts_ = 0;
};

// A worker shared by several evaluation threads (one per backend and device): calls queue on
// the lock, so many CPU threads feed one GPU worker.
struct WorkerSlot {
  explicit WorkerSlot(WorkerSpec spec) : proc(std::move(spec)) {}
  std::mutex mu;
  WorkerProcess proc;
  int64_t faults = 0;
};

// Calls of one backend, the requests (round trips) that carried them, and where their time went
// (Phase), summed; thread-safe.
class CallTotals {
 public:
  void add(const CallPhases& p, int64_t requests = 1) {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    requests_ += requests;
    phases_ += p;
  }
  std::pair<int64_t, CallPhases> get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {calls_, phases_};
  }
  int64_t requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  mutable std::mutex mu_;
  int64_t calls_ = 0, requests_ = 0;
  CallPhases phases_;
};

// A fault seen by a proxy during the current case.
struct FaultRecord {
  std::string backend, message;
};

// A backend whose code runs in a child process, as a campaign sees it: the faults (crash, exit,
// hang, device error) it met since last asked, and where its calls' time went. ProxyBackend (a
// `mlafuzz worker`) and SelfIsolatedBackend (isolation.h: python: kernels, which run in their
// own Python worker) are the two.
class IsolatedBackend : public Backend {
 public:
  virtual std::vector<FaultRecord> take_faults() = 0;
  virtual int device() const { return -1; }  // the GPU of its worker, -1: none chosen
  virtual std::shared_ptr<const CallTotals> totals() const = 0;
};

// The Backend face of a worker. One object per evaluation thread (it records the faults of the
// case its thread evaluates); the worker behind it may be shared.
class ProxyBackend final : public TraitsBackend<IsolatedBackend> {
 public:
  // Described by the worker's INFO reply (its backend's traits).
  ProxyBackend(std::shared_ptr<WorkerSlot> slot, double case_timeout_s);
  std::optional<std::string> unsupported(const MaterializedCase& m) const override;
  // One kRunBatch request for all cases (the results delivered once the last reply is in). The
  // queue, encode and transport time of the request are split evenly over its calls in the time
  // breakdown. The worker sends raw outputs; they are widened or only checked here as `o` asks.
  std::vector<CheckedRun> run_batch(const std::vector<const MaterializedCase*>& cases,
                                    const RunOptions& o = {}) override;

  std::vector<FaultRecord> take_faults() override;
  int device() const override { return slot_->proc.spec().device; }
  // A result with raw outputs only (protocol 2) widened here (values false: only
  // check_raw_outputs, the sizes), timed as Phase::kWiden.
  static void widen(const MaterializedCase& m, RunResult& r, bool values = true);
  // Calls made through this proxy and where their time went (the campaign's time breakdown);
  // shared so that the campaign reads them while (and after) the proxy's thread runs.
  std::shared_ptr<const CallTotals> totals() const override { return totals_; }

 private:
  // One kRun request (a wrapper's run_case; the results' outputs left as the worker sent them).
  RunResult run_case(const MaterializedCase& m) override;
  std::shared_ptr<WorkerSlot> slot_;
  double timeout_s_;
  mutable std::mutex faults_mu_;
  mutable std::vector<FaultRecord> faults_;
  std::shared_ptr<CallTotals> totals_ = std::make_shared<CallTotals>();
};

}  // namespace mlafuzz::campaign
