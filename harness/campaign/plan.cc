#include "harness/campaign/plan.h"

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "core/fileio.h"
#include "harness/backends/python_backend.h"
#include "harness/backends/registry.h"
#include "harness/campaign/isolation.h"

namespace mlafuzz::campaign {

Faults ThreadBackends::take_faults() {
  Faults faults;
  for (auto* p : proxies) {
    for (auto& f : p->take_faults()) faults.emplace(f.backend, f.message);
  }
  return faults;
}

BackendPool::BackendPool(const CampaignOptions& opts) : opts_(opts) {
  worker_exe_ = opts_.worker_exe.empty() ? self_executable() : opts_.worker_exe;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) visible_ = v;
  plan_backends();
  // The Python device workers (one per thread and backend) share the one GPU torch picks.
  int python_device_backends = 0;
  for (const auto& p : plan_) python_device_backends += p.self_isolated && p.on_device ? 1 : 0;
  if (python_device_backends > 0) {
    const int jobs = opts_.jobs > 0
                         ? opts_.jobs
                         : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    set_python_device_workers(jobs * python_device_backends);
  }
  if (!opts_.report_dir.empty()) {
    // The workers' log goes beside the report.
    make_dirs(opts_.report_dir);
    worker_log_ = (std::filesystem::path(opts_.report_dir) / "workers.log").string();
    set_python_worker_log(worker_log_);  // kernels' prints and warnings stay off the terminal
  }
  probe_foreign();
  intersect_envelopes();
  start_device_workers();
}

void BackendPool::intersect_envelopes() {
  envelope_ = opts_.envelope;
  for (const auto& p : plan_) envelope_ = intersect(envelope_, p.envelope);
  const GenConfig g = gen_config_for_profile(opts_.profile);
  if (const auto why =
          envelope_.empty_reason(g.max_batch, g.max_heads, g.max_topk, g.max_page_size)) {
    std::string who;
    for (const auto& p : plan_) who += (who.empty() ? "" : ", ") + p.name;
    if (!opts_.envelope_path.empty()) who += " and --envelope " + opts_.envelope_path;
    throw std::invalid_argument("the envelopes of " + who + " admit no case: " + *why);
  }
}

void BackendPool::plan_backends() {
  bool need_devices = false;
  for (const auto& name : opts_.backends) {
    BackendPlan p;
    p.name = name;
    const BackendSpec spec = resolve_backend(name);
    p.foreign = spec.foreign;
    if (spec.foreign) {
      // Never load foreign code in the campaign process: it may crash on load.
      p.isolated = opts_.isolate != "none";
      p.on_device = false;  // decided by probe_foreign, by asking a worker
      if (p.isolated) need_devices = true;
    } else {
      const BackendTraits t = spec.make()->traits();
      if (!t.availability.available) {
        throw std::runtime_error("backend '" + name +
                                 "' is not available: " + t.availability.reason);
      }
      p.on_device = t.on_device;
      p.envelope = t.envelope;
      // A python: kernel already runs in its own worker: the campaign talks to it directly.
      p.self_isolated = spec.isolates_itself;
      p.isolated = !p.self_isolated &&
                   (opts_.isolate == "all" || (opts_.isolate == "device" && t.needs_worker));
      need_devices = need_devices || (p.isolated && p.on_device);
    }
    plan_.push_back(p);
  }
  if (!need_devices) return;
  const auto text = ipc::run_capture({worker_exe_, "worker", "--device-info"}, 120);
  if (!text) return;
  try {
    devinfo_ = device_info_from_json(*text);
    devinfo_queried_ = true;
  } catch (const std::exception&) {
  }
}

// Plugins: ask a probe worker whether they run on a device.
void BackendPool::probe_foreign() {
  for (auto& p : plan_) {
    if (!p.isolated || !p.foreign) continue;
    WorkerSpec spec{worker_exe_, p.name, devinfo_.count > 0 ? 0 : -1, visible_, worker_log_};
    WorkerProcess probe(spec);
    const BackendTraits& traits = probe.info().traits;
    if (!traits.availability.available) {
      throw std::runtime_error("backend '" + p.name +
                               "' is not available: " + traits.availability.reason);
    }
    p.on_device = traits.on_device;
    p.envelope = traits.envelope;
  }
  // Foreign backends the campaign runs in this process (--isolate none) declare theirs here.
  for (auto& p : plan_) {
    if (p.foreign && !p.isolated) p.envelope = make_backend(p.name)->traits().envelope;
  }
}

bool BackendPool::any_device_worker() const {
  for (const auto& p : plan_) {
    if (p.isolated && p.on_device) return true;
  }
  return false;
}

// Device workers: one per (backend, GPU). Other isolated backends get one worker per thread
// (made in for_thread).
void BackendPool::start_device_workers() {
  if (!any_device_worker()) return;
  if (devinfo_.count > 0) {
    devices_ = parse_devices(opts_.devices, devinfo_.count);
    if (devices_.empty()) throw std::invalid_argument("--devices selects no GPU");
  } else {
    devices_ = {-1};  // no GPU found: the worker decides (its backend may be unavailable)
  }
  // Several workers per GPU: a call's host work (encoding, the transport, copies, the
  // synchronization) then overlaps other workers' kernels. Threads share them round robin.
  const int jobs = opts_.jobs > 0
                       ? opts_.jobs
                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int per_device = std::max<int>(1, jobs / static_cast<int>(devices_.size()));
  workers_per_device_ =
      std::min(opts_.workers_per_device > 0 ? opts_.workers_per_device : kDefaultWorkersPerDevice,
               per_device);
  for (const auto& p : plan_) {
    if (!(p.isolated && p.on_device)) continue;
    for (int d : devices_) {
      for (int k = 0; k < workers_per_device_; ++k) {
        WorkerSpec spec{worker_exe_, p.name, d, visible_, worker_log_};
        auto slot = std::make_shared<WorkerSlot>(spec);
        const Availability& a = slot->proc.info().traits.availability;
        if (!a.available) {
          throw std::runtime_error("backend '" + p.name + "' is not available on " +
                                   device_label(d) + ": " + a.reason);
        }
        slots_[{p.name, d, k}] = slot;
      }
    }
  }
}

ThreadBackends BackendPool::for_thread(int t) const {
  ThreadBackends tb;
  tb.device = devices_.empty() ? -1 : devices_[t % devices_.size()];
  for (const auto& p : plan_) {
    if (p.self_isolated) {
      auto b = std::make_unique<SelfIsolatedBackend>(make_backend(p.name));
      {
        std::lock_guard<std::mutex> lock(totals_mu_);
        call_totals_.emplace_back(b->traits().name, b->totals());
      }
      tb.proxies.push_back(b.get());
      tb.owned.push_back(std::move(b));
    } else if (!p.isolated) {
      tb.owned.push_back(make_backend(p.name));
    } else {
      std::shared_ptr<WorkerSlot> slot;
      if (p.on_device) {
        const int k = (t / static_cast<int>(devices_.size())) % workers_per_device_;
        slot = slots_.at({p.name, tb.device, k});
      } else {
        slot = std::make_shared<WorkerSlot>(WorkerSpec{worker_exe_, p.name, -1, "", worker_log_});
      }
      auto proxy = std::make_unique<ProxyBackend>(slot, opts_.case_timeout_s);
      {
        std::lock_guard<std::mutex> lock(totals_mu_);
        call_totals_.emplace_back(proxy->traits().name, proxy->totals());
      }
      tb.proxies.push_back(proxy.get());
      tb.owned.push_back(std::move(proxy));
    }
    tb.ptrs.push_back(tb.owned.back().get());
  }
  if (!any_device_worker()) tb.device = -1;
  return tb;
}

std::unique_ptr<IsolatedBackend> BackendPool::fresh_worker(const std::string& backend,
                                                           const ThreadBackends& tb) const {
  int dev = -1;
  std::string spec_name = backend;
  bool self_isolated = false;
  for (size_t i = 0; i < tb.ptrs.size(); ++i) {
    if (tb.ptrs[i]->traits().name == backend) {
      spec_name = plan_[i].name;
      self_isolated = plan_[i].self_isolated;
    }
  }
  if (self_isolated) return std::make_unique<SelfIsolatedBackend>(make_backend(spec_name));
  for (auto* p : tb.proxies) {
    if (p->traits().name == backend) dev = p->device();
  }
  auto slot =
      std::make_shared<WorkerSlot>(WorkerSpec{worker_exe_, spec_name, dev, visible_, worker_log_});
  return std::make_unique<ProxyBackend>(slot, opts_.case_timeout_s);
}

void BackendPool::fill_gpu(Finding& f, const std::string& backend, const ThreadBackends& tb) const {
  if (backend.find('|') != std::string::npos) return;  // a pair: no single GPU
  for (auto* p : tb.proxies) {
    if (p->traits().name == backend && p->traits().on_device && tb.device >= 0) {
      f.gpu_name = device_name(tb.device);
      f.driver_version = devinfo_.driver;
      f.cuda_version = devinfo_.runtime;
    }
  }
}

std::string BackendPool::device_name(int d) const {
  return d >= 0 && d < static_cast<int>(devinfo_.names.size()) ? devinfo_.names[d] : "";
}

std::string BackendPool::names_as_given() const {
  std::string b;
  for (const auto& p : plan_) b += (b.empty() ? "" : ",") + p.name;
  return b;
}

std::string BackendPool::backend_source(const std::string& backend,
                                        const ThreadBackends& tb) const {
  std::string out;
  size_t from = 0;
  while (from <= backend.size()) {
    const size_t bar = std::min(backend.find('|', from), backend.size());
    const std::string part = backend.substr(from, bar - from);
    std::string given = part;
    for (size_t i = 0; i < tb.ptrs.size() && i < plan_.size(); ++i) {
      if (tb.ptrs[i]->traits().name == part) given = plan_[i].name;
    }
    if (!out.empty()) out.push_back(',');
    out.append(absolute_backend_name(given));
    from = bar + 1;
  }
  return out;
}

TimeBreakdown BackendPool::time_breakdown() const {
  std::lock_guard<std::mutex> lock(totals_mu_);
  TimeBreakdown t;
  for (const auto& [backend, totals] : call_totals_) {
    const auto [calls, phases] = totals->get();
    t[backend].calls += calls;
    t[backend].requests += totals->requests();
    t[backend].phases += phases;
  }
  return t;
}

}  // namespace mlafuzz::campaign
