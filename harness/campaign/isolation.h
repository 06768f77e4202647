// Where a backend named on the command line runs, for every command (isolation
// everywhere): foreign code (plugins) in a `mlafuzz worker` process, so that a crash, an exit()
// or a hang in it is a fault outcome and never ends mlafuzz; python: kernels as themselves (each
// already runs in its own Python worker: one hop, with the same fault handling); built-ins in
// this process. `mlafuzz fuzz` plans its backends the same way (plan.cc).
#pragma once

#include <memory>
#include <string>

#include "harness/campaign/worker.h"

namespace mlafuzz::campaign {

// A backend that isolates itself (a python: backend, whose run() already turns a dead or hung
// worker into RunStatus::kFault): records those faults as a ProxyBackend does. It describes
// itself as the backend it wraps (its envelope and invariance claims included).
class SelfIsolatedBackend final : public ForwardingBackend<IsolatedBackend> {
 public:
  explicit SelfIsolatedBackend(std::unique_ptr<Backend> inner)
      : ForwardingBackend<IsolatedBackend>(std::move(inner)) {}
  std::vector<FaultRecord> take_faults() override;
  std::shared_ptr<const CallTotals> totals() const override { return totals_; }

 protected:
  RunResult run_case(const MaterializedCase& m) override;

 private:
  std::mutex faults_mu_;
  std::vector<FaultRecord> faults_;
  std::shared_ptr<CallTotals> totals_ = std::make_shared<CallTotals>();
};

struct IsolationOptions {
  bool in_process = false;  // load plugins into this process (debugging: gdb, sanitizers)
  double case_timeout_s = 60;
  std::string worker_exe;  // the mlafuzz executable (default: this one)
};

// The backend `name` as `run`, `repro` and `mutants` use it (see the top of this file): an
// IsolatedBackend when its code runs in a child process (a python: kernel behind a
// SelfIsolatedBackend, a plugin behind a ProxyBackend), so that its faults can be asked. Throws
// std::runtime_error for an unknown name, or a worker that cannot serve it (the message says
// why).
std::unique_ptr<Backend> make_isolated_backend(const std::string& name, const IsolationOptions& o);

}  // namespace mlafuzz::campaign
