// The campaign's backends: where each one runs (in this process or in a worker process) and the
// worker slots that evaluation threads share (one worker per device backend and GPU).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "harness/backends/device_query.h"
#include "harness/campaign/campaign.h"
#include "harness/campaign/time_breakdown.h"
#include "harness/campaign/worker.h"

namespace mlafuzz::campaign {

// Worker faults of one case: backend name -> the fault's message.
using Faults = std::map<std::string, std::string>;

// How one selected backend runs.
struct BackendPlan {
  std::string name;      // as given (plugin path, mutant name, ...)
  bool foreign = false;  // user code (BackendSpec::foreign): never constructed in this process
  bool isolated = false;
  bool on_device = false;  // workers_per_device() workers per GPU, shared by threads
  Envelope envelope;       // what the backend declares it accepts
  // Runs in its own child process (python: kernels): one per thread, talked to directly.
  bool self_isolated = false;
};

// The backends of one evaluation thread.
struct ThreadBackends {
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Backend*> ptrs;
  std::vector<IsolatedBackend*> proxies;  // the isolated ones of `ptrs`
  int device = -1;                        // GPU of this thread's device workers

  // Faults the workers saw since the last call (a fault fails the backend's "run" outcome).
  Faults take_faults();
};

class BackendPool {
 public:
  // Resolves every backend (throws std::runtime_error for an unavailable one), asks a worker
  // which GPUs exist when a device backend runs isolated, and starts the shared device workers.
  explicit BackendPool(const CampaignOptions& opts);

  ThreadBackends for_thread(int thread_index) const;
  // A new worker of `backend` (a name as the backend calls itself) on the GPU `tb` uses for it,
  // so that shrinking a fault does not disturb the campaign's workers.
  std::unique_ptr<IsolatedBackend> fresh_worker(const std::string& backend,
                                                const ThreadBackends& tb) const;
  // The GPU, driver and CUDA version of the worker `tb` runs `backend` on (nothing when the
  // backend runs on no GPU).
  void fill_gpu(Finding& f, const std::string& backend, const ThreadBackends& tb) const;

  const std::vector<BackendPlan>& plan() const { return plan_; }
  // Where the campaign generates: the intersection of every backend's envelope and
  // CampaignOptions::envelope. The constructor throws std::invalid_argument when it is empty.
  const Envelope& envelope() const { return envelope_; }
  const std::vector<int>& devices() const { return devices_; }  // empty: no device workers
  const DeviceInfo& device_info() const { return devinfo_; }
  bool device_info_queried() const { return devinfo_queried_; }
  std::string device_label(int d) const { return d < 0 ? "cpu" : "cuda:" + std::to_string(d); }
  std::string device_name(int d) const;
  std::string names_as_given() const;  // comma-separated, for replay commands
  // The names as given of `backend` (Backend::name(), "a|b" for a pair) in `tb`, files made
  // absolute (absolute_backend_name), comma-separated: what a corpus entry replays from anywhere.
  std::string backend_source(const std::string& backend, const ThreadBackends& tb) const;
  int workers_per_device() const { return workers_per_device_; }
  // Every proxy's calls so far and where their time went, by backend.
  TimeBreakdown time_breakdown() const;

 private:
  void plan_backends();
  void probe_foreign();
  void start_device_workers();
  bool any_device_worker() const;

  void intersect_envelopes();

  const CampaignOptions& opts_;
  Envelope envelope_;
  std::string worker_exe_, worker_log_, visible_;
  std::vector<BackendPlan> plan_;
  DeviceInfo devinfo_;
  bool devinfo_queried_ = false;
  std::vector<int> devices_;  // GPU ordinals for device backends
  // Device workers: workers_per_device_ per (backend, GPU), keyed (backend, GPU, k).
  std::map<std::tuple<std::string, int, int>, std::shared_ptr<WorkerSlot>> slots_;
  int workers_per_device_ = 1;
  mutable std::mutex totals_mu_;
  mutable std::vector<std::pair<std::string, std::shared_ptr<const CallTotals>>> call_totals_;
};

}  // namespace mlafuzz::campaign
