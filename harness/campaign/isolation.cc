#include "harness/campaign/isolation.h"

#include <chrono>

#include "harness/backends/registry.h"

namespace mlafuzz::campaign {

RunResult SelfIsolatedBackend::run_case(const MaterializedCase& m) {
  const auto t0 = std::chrono::steady_clock::now();
  RunResult r = ForwardingBackend::run_case(m);
  // The whole call is the bridge's and the kernel's: the backend measures only its kernel.
  r.phases[Phase::kTransport] =
      std::max(0.0, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() -
                        r.seconds);
  r.phases[Phase::kKernel] = r.seconds;
  totals_->add(r.phases);
  if (r.status == RunStatus::kFault) {
    const std::lock_guard<std::mutex> lock(faults_mu_);
    faults_.push_back({inner_->traits().name, r.message});
  }
  return r;
}

std::vector<FaultRecord> SelfIsolatedBackend::take_faults() {
  const std::lock_guard<std::mutex> lock(faults_mu_);
  std::vector<FaultRecord> out;
  out.swap(faults_);
  return out;
}

std::unique_ptr<Backend> make_isolated_backend(const std::string& name, const IsolationOptions& o) {
  const BackendSpec spec = resolve_backend(name);
  if (spec.isolates_itself) return std::make_unique<SelfIsolatedBackend>(spec.make());
  if (!spec.foreign || o.in_process) return spec.make();
  WorkerSpec w;
  w.exe = o.worker_exe.empty() ? self_executable() : o.worker_exe;
  w.backend = name;
  auto slot = std::make_shared<WorkerSlot>(std::move(w));
  return std::make_unique<ProxyBackend>(std::move(slot), o.case_timeout_s);
}

}  // namespace mlafuzz::campaign
