// Where a backend named on the command line runs, for every command (issue 14: isolation
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
// worker into RunStatus::kFault): records those faults as a ProxyBackend does.
class SelfIsolatedBackend final : public IsolatedBackend {
 public:
  explicit SelfIsolatedBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  Precision precision() const override { return inner_->precision(); }
  Availability availability() const override { return inner_->availability(); }
  std::optional<std::string> unsupported(const MaterializedCase& m) const override {
    return inner_->unsupported(m);
  }
  double abs_tol() const override { return inner_->abs_tol(); }
  double rel_tol() const override { return inner_->rel_tol(); }
  bool on_device() const override { return inner_->on_device(); }
  bool needs_worker() const override { return inner_->needs_worker(); }
  bool is_reference() const override { return inner_->is_reference(); }
  std::string simt_partner() const override { return inner_->simt_partner(); }
  bool splits_kv() const override { return inner_->splits_kv(); }
  int token_tile() const override { return inner_->token_tile(); }
  RunResult run(const MaterializedCase& m) override;

  std::vector<FaultRecord> take_faults() override;
  std::shared_ptr<const CallTotals> totals() const override { return totals_; }

 private:
  std::unique_ptr<Backend> inner_;
  std::mutex faults_mu_;
  std::vector<FaultRecord> faults_;
  std::shared_ptr<CallTotals> totals_ = std::make_shared<CallTotals>();
};

struct IsolationOptions {
  bool in_process = false;  // load plugins into this process (debugging: gdb, sanitizers)
  double case_timeout_s = 60;
  std::string worker_exe;  // the mlafuzz executable (default: this one)
};

// The backend `name` as `run`, `repro` and `mutants` use it (see the top of this file). Throws
// std::runtime_error for an unknown name, or a worker that cannot serve it (the message says
// why).
std::unique_ptr<Backend> make_isolated_backend(const std::string& name, const IsolationOptions& o);

}  // namespace mlafuzz::campaign
