#include "harness/campaign/campaign.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "harness/backends/device_query.h"
#include "harness/backends/registry.h"
#include "harness/campaign/worker.h"
#include "harness/core/fileio.h"
#include "harness/core/materialize.h"

namespace mlafuzz::campaign {
namespace {

using Clock = std::chrono::steady_clock;

std::string fmt_g(double x, int digits = 3) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, x);
  return buf;
}

std::string fmt_duration(double s) {
  if (s < 0) s = 0;
  const long long t = std::llround(s);
  char buf[64];
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", t / 3600, (t % 3600) / 60);
  } else if (t >= 60) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", t / 60, t % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%llds", t);
  }
  return buf;
}

bool has_error_figures(const std::string& property) {
  return property == "tolerance" || property == "mma-vs-simt" || property == "permute" ||
         property == "insert-invalid";
}

// How each selected backend runs.
struct BackendPlan {
  std::string name;      // as given (plugin path, mutant name, ...)
  bool foreign = false;  // user code (BackendSpec::foreign): never constructed in this process
  bool isolated = false;
  bool on_device = false;  // one worker per GPU, shared by threads
};

// The backends of one evaluation thread.
struct ThreadBackends {
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Backend*> ptrs;
  std::vector<ProxyBackend*> proxies;
  int device = -1;  // GPU of this thread's device workers
};

}  // namespace

GenConfig gen_config_for_profile(const std::string& profile) {
  GenConfig cfg;
  if (profile == "default") return cfg;
  const auto fams = all_generator_families();
  if (std::find(fams.begin(), fams.end(), profile) == fams.end()) {
    std::string known = "default";
    for (const auto& f : fams) known += ", " + f;
    throw std::invalid_argument("unknown --profile '" + profile + "' (known: " + known + ")");
  }
  cfg.families = {profile};
  return cfg;
}

namespace {

class Campaign {
 public:
  explicit Campaign(const CampaignOptions& o) : opts_(o), log_(o.log ? *o.log : std::cerr) {
    gen_ = gen_config_for_profile(opts_.profile);
    properties_ = opts_.properties.empty() ? all_properties() : opts_.properties;
    const auto all = all_properties();
    for (const auto& p : properties_) {
      if (std::find(all.begin(), all.end(), p) == all.end()) {
        std::string known;
        for (const auto& a : all) known += " " + a;
        throw std::invalid_argument("unknown property '" + p + "'; known:" + known);
      }
    }
    if (opts_.backends.empty()) throw std::invalid_argument("no backends selected");
    if (opts_.isolate != "device" && opts_.isolate != "all" && opts_.isolate != "none") {
      throw std::invalid_argument("bad --isolate '" + opts_.isolate +
                                  "' (expected device, all or none)");
    }
    if (!(opts_.case_timeout_s > 0)) throw std::invalid_argument("--case-timeout must be > 0");
    if (opts_.shrink_time_s < 0) throw std::invalid_argument("--shrink-time must be >= 0");
    jobs_ = opts_.jobs > 0 ? opts_.jobs : std::max(1u, std::thread::hardware_concurrency());
    worker_exe_ = opts_.worker_exe.empty() ? self_executable() : opts_.worker_exe;
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) visible_ = v;
    plan_backends();
    if (!opts_.report_dir.empty()) {
      make_dirs(opts_.report_dir);
      worker_log_ = (std::filesystem::path(opts_.report_dir) / "workers.log").string();
    }
    make_slots();
  }

  int run(Report* out);
  int replay(uint64_t index, const std::string& save_path);

 private:
  void plan_backends();
  void make_slots();
  ThreadBackends make_thread_backends(int thread_index);
  void thread_main(int t);
  void mark_done(uint64_t case_number);  // caller holds mu_
  void record(uint64_t case_number, uint64_t index, const Case& c,
              const std::vector<std::string>& tags, const CaseEvaluation& ev,
              const std::map<std::string, std::string>& faults, int device);
  void handle_failure(const PropertyOutcome& o, const Case& c, uint64_t index,
                      const std::map<std::string, std::string>& faults, ThreadBackends& tb);
  Report snapshot(bool complete);
  void write_report(bool complete);
  void progress_line(bool final_line);
  std::string replay_all_command(uint64_t index) const {
    std::string b;
    for (const auto& p : plan_) b += (b.empty() ? "" : ",") + p.name;
    std::string cmd = "mlafuzz fuzz --seed " + std::to_string(opts_.seed) + " --replay-index " +
                      std::to_string(index);
    if (opts_.profile != "default") cmd += " --profile " + opts_.profile;
    return cmd + " --backends " + b;
  }
  bool stopping() const { return stop_.load() || (opts_.signals && opts_.signals->load() > 0); }
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
  std::string device_label(int d) const { return d < 0 ? "cpu" : "cuda:" + std::to_string(d); }
  std::string device_name(int d) const {
    return d >= 0 && d < static_cast<int>(devinfo_.names.size()) ? devinfo_.names[d] : "";
  }

  CampaignOptions opts_;
  std::ostream& log_;
  GenConfig gen_;
  std::vector<std::string> properties_;
  int jobs_ = 1;
  std::string worker_exe_, worker_log_, visible_;
  std::vector<BackendPlan> plan_;
  DeviceInfo devinfo_;
  bool devinfo_queried_ = false;
  std::vector<int> devices_;  // GPU ordinals for device backends
  std::map<std::pair<std::string, int>, std::shared_ptr<WorkerSlot>> slots_;
  std::vector<std::string> backend_names_;  // as the backends call themselves

  Clock::time_point t0_;
  std::string start_iso_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> next_case_{0};
  std::string stop_reason_ = "cases";

  std::mutex mu_;  // guards everything below
  Report acc_;     // results, tags
  std::map<int, int64_t> device_cases_;
  uint64_t done_prefix_ = 0;
  std::set<uint64_t> done_rest_;
  int64_t done_ = 0;
  double eval_seconds_ = 0, oracle_seconds_ = 0;
  int64_t failing_outcomes_ = 0, case_errors_ = 0;
  struct PreClass {
    int state = 0;  // 0 new, 1 shrinking, 2 done
    std::string signature;
    int64_t pending = 0;
  };
  std::map<std::string, PreClass> pre_;
  struct FindingState {
    FindingRecord rec;
    Finding finding;
    Case minimal;
  };
  std::map<std::string, FindingState> findings_;
  int threads_running_ = 0;
  std::condition_variable cv_;
  bool live_ = false;
};

void Campaign::plan_backends() {
  bool need_devices = false;
  for (const auto& name : opts_.backends) {
    BackendPlan p;
    p.name = name;
    const BackendSpec spec = resolve_backend(name);
    p.foreign = spec.foreign;
    if (spec.foreign) {
      // Never load foreign code in the campaign process: it may crash on load.
      p.isolated = opts_.isolate != "none";
      p.on_device = false;  // decided below by asking a worker
      if (p.isolated) need_devices = true;
    } else {
      auto b = spec.make();
      const Availability a = b->availability();
      if (!a.available) {
        throw std::runtime_error("backend '" + name + "' is not available: " + a.reason);
      }
      p.on_device = b->on_device();
      p.isolated = opts_.isolate == "all" || (opts_.isolate == "device" && b->needs_worker());
      need_devices = need_devices || (p.isolated && p.on_device);
    }
    plan_.push_back(p);
  }
  if (need_devices) {
    const auto text = run_capture({worker_exe_, "worker", "--device-info"}, 120);
    if (text) {
      try {
        devinfo_ = device_info_from_json(*text);
        devinfo_queried_ = true;
      } catch (const std::exception&) {
      }
    }
  }
}

void Campaign::make_slots() {
  // Device workers: one per (backend, GPU). Plugins: ask a probe worker whether they run on a
  // device. Other isolated backends get one worker per thread (made in make_thread_backends).
  for (auto& p : plan_) {
    if (!p.isolated) continue;
    if (p.foreign) {
      WorkerSpec spec{worker_exe_, p.name, devinfo_.count > 0 ? 0 : -1, visible_, worker_log_};
      WorkerProcess probe(spec);
      const WorkerInfo& info = probe.info();
      if (!info.available) {
        throw std::runtime_error("backend '" + p.name + "' is not available: " + info.reason);
      }
      p.on_device = info.on_device;
    }
  }
  bool any_device = false;
  for (const auto& p : plan_) any_device = any_device || (p.isolated && p.on_device);
  if (any_device) {
    if (devinfo_.count > 0) {
      devices_ = parse_devices(opts_.devices, devinfo_.count);
      if (devices_.empty()) throw std::invalid_argument("--devices selects no GPU");
    } else {
      devices_ = {-1};  // no GPU found: the worker decides (its backend may be unavailable)
    }
    for (const auto& p : plan_) {
      if (!(p.isolated && p.on_device)) continue;
      for (int d : devices_) {
        WorkerSpec spec{worker_exe_, p.name, d, visible_, worker_log_};
        auto slot = std::make_shared<WorkerSlot>(spec);
        const WorkerInfo& info = slot->proc.info();
        if (!info.available) {
          throw std::runtime_error("backend '" + p.name + "' is not available on " +
                                   device_label(d) + ": " + info.reason);
        }
        slots_[{p.name, d}] = slot;
      }
    }
  }
}

ThreadBackends Campaign::make_thread_backends(int t) {
  ThreadBackends tb;
  tb.device = devices_.empty() ? -1 : devices_[t % devices_.size()];
  for (const auto& p : plan_) {
    if (!p.isolated) {
      tb.owned.push_back(make_backend(p.name));
    } else {
      std::shared_ptr<WorkerSlot> slot;
      if (p.on_device) {
        slot = slots_.at({p.name, tb.device});
      } else {
        slot = std::make_shared<WorkerSlot>(WorkerSpec{worker_exe_, p.name, -1, "", worker_log_});
      }
      auto proxy = std::make_unique<ProxyBackend>(slot, opts_.case_timeout_s);
      tb.proxies.push_back(proxy.get());
      tb.owned.push_back(std::move(proxy));
    }
    tb.ptrs.push_back(tb.owned.back().get());
  }
  bool uses_device = false;
  for (const auto& p : plan_) uses_device = uses_device || (p.isolated && p.on_device);
  if (!uses_device) tb.device = -1;
  return tb;
}

void Campaign::mark_done(uint64_t case_number) {
  ++done_;
  if (case_number == done_prefix_) {
    ++done_prefix_;
    while (!done_rest_.empty() && *done_rest_.begin() == done_prefix_) {
      done_rest_.erase(done_rest_.begin());
      ++done_prefix_;
    }
  } else {
    done_rest_.insert(case_number);
  }
}

void Campaign::record(uint64_t case_number, uint64_t index, const Case& c,
                      const std::vector<std::string>& tags, const CaseEvaluation& ev,
                      const std::map<std::string, std::string>& faults, int device) {
  std::lock_guard<std::mutex> lock(mu_);
  mark_done(case_number);
  ++device_cases_[device];
  eval_seconds_ += ev.seconds;
  oracle_seconds_ += ev.oracle_seconds;
  for (const auto& tag : tags) ++acc_.tags[tag];
  const uint64_t key = sample_key(opts_.seed, index);
  std::string shape;  // computed once, only if a worst list takes it
  for (const auto& o : ev.outcomes) {
    PropertyStats& s = acc_.stats(o.backend, o.property);
    ++s.cases;
    if (!o.applicable) {
      ++s.not_applicable;
      continue;
    }
    const bool failed = !o.passed;
    if (failed) {
      ++s.failures;
      ++failing_outcomes_;
    }
    if (o.property == "tolerance" && !o.flashmla_pass) ++s.flashmla_failures;
    s.max_abs = std::isnan(o.max_abs) ? INFINITY : std::max(s.max_abs, o.max_abs);
    s.sum_mean_abs += std::isfinite(o.mean_abs) ? o.mean_abs : 0;
    s.max_rel = std::isnan(o.max_rel) ? INFINITY : std::max(s.max_rel, o.max_rel);
    s.max_cos_diff = std::isnan(o.cos_diff) ? INFINITY : std::max(s.max_cos_diff, o.cos_diff);
    s.lse_max_abs = std::isnan(o.lse_max_abs) ? INFINITY : std::max(s.lse_max_abs, o.lse_max_abs);
    s.max_tightness = std::isnan(o.tightness) ? INFINITY : std::max(s.max_tightness, o.tightness);
    s.tightness.add(o.tightness);
    WorstCase w;
    w.seed = opts_.seed;
    w.case_index = index;
    w.failed = failed;
    w.tightness = o.tightness;
    w.max_abs = o.max_abs;
    if (s.would_keep(w)) {
      if (shape.empty()) shape = shape_class(c);
      w.shape = shape;
      w.detail = o.detail;
      if (o.property == "run" && faults.count(o.backend)) w.detail = faults.at(o.backend);
      w.repro = replay_command(opts_.seed, index, opts_.profile, o.backend, o.property);
      s.add_worst(w);
    }
    if (has_error_figures(o.property)) {
      Sample p;
      p.key = key;
      p.seed = opts_.seed;
      p.case_index = index;
      p.out_max_ref = o.out_max_ref;
      p.max_abs = o.max_abs;
      p.tightness = o.tightness;
      p.topk = c.topk;
      p.page_size = c.geom.page_size;
      p.failed = failed;
      s.add_sample(p);
    }
  }
}

void Campaign::handle_failure(const PropertyOutcome& o, const Case& c, uint64_t index,
                              const std::map<std::string, std::string>& faults,
                              ThreadBackends& tb) {
  const bool fault = o.property == "run" && faults.count(o.backend) > 0;
  PropertyOutcome mo = o;
  if (fault) {
    mo.property = "fault";
    mo.detail = faults.at(o.backend);
  }
  const std::string pre_key = mo.property + "|" + o.backend + "|" + shape_class(c);
  {
    std::lock_guard<std::mutex> lock(mu_);
    PreClass& pc = pre_[pre_key];
    if (pc.state == 2) {
      auto& f = findings_.at(pc.signature);
      ++f.rec.count;
      return;
    }
    if (pc.state == 1) {
      ++pc.pending;
      return;
    }
    pc.state = 1;
  }
  Case minimal = c;
  bool shrunk = false;
  if (opts_.shrink_time_s > 0 && !stopping()) {
    try {
      std::function<bool(const Case&)> still_fails;
      std::unique_ptr<ProxyBackend> fresh;
      std::string last_fault = mo.detail;
      if (fault) {
        // Through a fresh worker of the faulting backend (same GPU), so that the shrink
        // predicate sees the fault and restarts do not disturb the campaign's workers.
        int dev = -1;
        std::string spec_name = o.backend;
        for (size_t i = 0; i < tb.ptrs.size(); ++i) {
          if (tb.ptrs[i]->name() == o.backend) spec_name = plan_[i].name;
        }
        for (auto* p : tb.proxies) {
          if (p->name() == o.backend) dev = p->device();
        }
        auto slot = std::make_shared<WorkerSlot>(
            WorkerSpec{worker_exe_, spec_name, dev, visible_, worker_log_});
        fresh = std::make_unique<ProxyBackend>(slot, opts_.case_timeout_s);
        ProxyBackend* fp = fresh.get();
        // Partners stay in the list (mma-vs-simt), the faulting backend is the fresh proxy.
        std::vector<Backend*> ptrs = tb.ptrs;
        for (auto*& p : ptrs) {
          if (p->name() == o.backend) p = fp;
        }
        still_fails = [this, fp, ptrs, &last_fault](const Case& k) {
          if (stopping()) return false;
          fp->take_faults();
          try {
            evaluate_case(k, ptrs, properties_);
          } catch (const std::exception&) {
            return false;
          }
          auto f = fp->take_faults();
          if (f.empty()) return false;
          last_fault = f.front().message;
          return true;
        };
        if (!still_fails(c)) still_fails = nullptr;  // not reproducible alone: keep the case
      } else {
        auto pred = same_failure_predicate(o, tb.ptrs);
        still_fails = [this, pred](const Case& k) { return !stopping() && pred(k); };
      }
      if (still_fails) {
        const ShrinkResult sr = shrink_case(c, still_fails, opts_.shrink_time_s);
        minimal = sr.minimal;
        shrunk = sr.steps > 0;
        if (fault) {
          mo.detail = last_fault;
        } else {
          // The finding describes the minimal case.
          const CaseEvaluation ev = evaluate_case(minimal, tb.ptrs, {o.property});
          for (const auto& x : ev.outcomes) {
            if (x.backend == o.backend && x.property == o.property && !x.passed) {
              mo = x;
              break;
            }
          }
        }
      }
    } catch (const std::exception& e) {
      log_ << "\nmlafuzz: shrinking " << pre_key << " stopped: " << e.what() << "\n";
    }
  }
  Finding f = make_finding(mo, minimal, opts_.seed, index);
  if (o.backend.find('|') == std::string::npos) {
    for (auto* p : tb.proxies) {
      if (p->name() == o.backend && p->on_device() && tb.device >= 0) {
        f.gpu_name = device_name(tb.device);
        f.driver_version = devinfo_.driver;
        f.cuda_version = devinfo_.runtime;
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  PreClass& pc = pre_[pre_key];
  pc.state = 2;
  pc.signature = f.signature;
  const int64_t seen = 1 + pc.pending;
  pc.pending = 0;
  auto it = findings_.find(f.signature);
  if (it != findings_.end()) {
    it->second.rec.count += seen;
    return;
  }
  FindingState st;
  st.finding = f;
  st.minimal = minimal;
  st.rec.signature = f.signature;
  st.rec.property = mo.property;
  st.rec.backend = o.backend;
  st.rec.shape_class = shape_class(minimal);
  st.rec.count = seen;
  st.rec.seed = opts_.seed;
  st.rec.case_index = index;
  st.rec.tightness = mo.tightness;
  st.rec.shrunk = shrunk;
  st.rec.detail = format_outcome(mo);
  try {
    f.count = static_cast<int>(seen);
    st.rec.corpus_path = save_corpus_entry(opts_.corpus_dir, minimal, f);
    st.rec.corpus_entries = {st.rec.corpus_path};
    std::string b = o.backend;
    std::replace(b.begin(), b.end(), '|', ',');
    st.rec.repro = repro_command(st.rec.corpus_path, b);
  } catch (const std::exception& e) {
    log_ << "\nmlafuzz: cannot save the finding " << f.signature << ": " << e.what() << "\n";
    st.rec.repro = replay_command(opts_.seed, index, opts_.profile, o.backend, o.property);
  }
  log_ << (live_ ? "\r\x1b[K" : "") << "mlafuzz: new finding " << f.signature << " (case " << index
       << (shrunk ? ", shrunk" : "") << ")\n  " << st.rec.detail
       << "\n  saved: " << st.rec.corpus_path << "\n  reproduce: " << st.rec.repro << "\n";
  findings_.emplace(f.signature, std::move(st));
}

void Campaign::thread_main(int t) {
  ThreadBackends tb;
  try {
    tb = make_thread_backends(t);
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mu_);
    log_ << "\nmlafuzz: evaluation thread " << t << " cannot start: " << e.what() << "\n";
    stop_ = true;
    return;
  }
  while (!stopping()) {
    const uint64_t n = next_case_.fetch_add(1);
    if (opts_.max_cases && n >= *opts_.max_cases) break;
    if (opts_.time_s && elapsed() >= *opts_.time_s) break;
    const uint64_t index = opts_.shard.global_index(n);
    std::vector<std::string> tags;
    Case c;
    CaseEvaluation ev;
    for (auto* p : tb.proxies) p->take_faults();
    try {
      c = generate_case(opts_.seed, index, gen_, &tags);
      ev = evaluate_case(c, tb.ptrs, properties_);
    } catch (const std::exception& e) {
      // A generator or evaluation bug, not a backend failure: say so, keep going.
      std::lock_guard<std::mutex> lock(mu_);
      mark_done(n);
      ++case_errors_;
      log_ << (live_ ? "\r\x1b[K" : "") << "mlafuzz: case " << index
           << " could not be evaluated: " << e.what()
           << "\n  reproduce: " << replay_all_command(index) << "\n";
      continue;
    }
    std::map<std::string, std::string> faults;
    for (auto* p : tb.proxies) {
      for (auto& f : p->take_faults()) faults.emplace(f.backend, f.message);
    }
    record(n, index, c, tags, ev, faults, tb.device);
    for (const PropertyOutcome* o : ev.failures()) handle_failure(*o, c, index, faults, tb);
  }
}

Report Campaign::snapshot(bool complete) {
  Report r;
  std::lock_guard<std::mutex> lock(mu_);
  r.results = acc_.results;
  r.tags = acc_.tags;
  r.complete = complete;
  r.seed = opts_.seed;
  r.profile = opts_.profile;
  r.backends = backend_names_;
  r.properties = properties_;
  r.commit = build_commit();
  r.host = host_name();
  bool on_gpu = false;
  for (int d : devices_) on_gpu = on_gpu || d >= 0;
  if (on_gpu) {
    std::set<std::string> names;
    for (int d : devices_) names.insert(device_name(d));
    r.gpu_name.clear();
    for (const auto& n : names) r.gpu_name += (r.gpu_name.empty() ? "" : ", ") + n;
  }
  if (devinfo_queried_) {
    r.driver_version = devinfo_.driver;
    r.cuda_version = devinfo_.runtime;
  }
  r.start = start_iso_;
  r.end = utc_now_iso8601();
  r.duration_s = elapsed();
  r.stop_reason = complete ? stop_reason_ : "running";
  r.cases = done_;
  r.cases_per_s = r.duration_s > 0 ? done_ / r.duration_s : 0;
  r.eval_seconds = eval_seconds_;
  r.oracle_seconds = oracle_seconds_;
  ShardRun sr;
  sr.index = opts_.shard.index;
  sr.count = opts_.shard.count;
  sr.host = r.host;
  sr.commit = r.commit;
  sr.start = r.start;
  sr.end = r.end;
  sr.duration_s = r.duration_s;
  sr.stop_reason = r.stop_reason;
  sr.cases = done_;
  if (done_prefix_ > 0) sr.case_ranges.emplace_back(0, done_prefix_);
  for (uint64_t n : done_rest_) {
    if (!sr.case_ranges.empty() && sr.case_ranges.back().second == n) {
      ++sr.case_ranges.back().second;
    } else {
      sr.case_ranges.emplace_back(n, n + 1);
    }
  }
  r.shards = {sr};
  if (devices_.empty()) {
    r.devices.push_back({"cpu", "", done_});
  } else {
    for (int d : devices_) {
      auto it = device_cases_.find(d);
      r.devices.push_back(
          {device_label(d), device_name(d), it == device_cases_.end() ? 0 : it->second});
    }
  }
  for (const auto& [sig, f] : findings_) r.findings.push_back(f.rec);
  return r;
}

void Campaign::write_report(bool complete) {
  if (opts_.report_dir.empty()) return;
  const Report r = snapshot(complete);
  namespace fs = std::filesystem;
  const fs::path dir(opts_.report_dir);
  try {
    make_dirs(opts_.report_dir);
    save_report(r, (dir / "report.json").string());
    write_file_atomic((dir / "junit.xml").string(), render_junit(r));
    write_file_atomic((dir / "report.html").string(), render_html(r));
  } catch (const std::exception& e) {
    log_ << "\nmlafuzz: cannot write the report: " << e.what() << "\n";
  }
}

void Campaign::progress_line(bool final_line) {
  int64_t done, findings, fails;
  double worst = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done = done_;
    findings = static_cast<int64_t>(findings_.size());
    fails = failing_outcomes_;
    for (const auto& s : acc_.results) {
      if (has_error_figures(s.property)) worst = std::max(worst, s.max_tightness);
    }
  }
  const double t = elapsed();
  std::ostringstream os;
  os << "mlafuzz: " << done << " cases, " << fmt_g(t > 0 ? done / t : 0) << " cases/s, " << fails
     << " failures (" << findings
     << " findings), worst tightness "
     // The property layer scores a non-finite position mismatch as 1e300.
     << (worst >= 1e300 ? std::string("non-finite mismatch") : fmt_g(worst));
  if (opts_.time_s) {
    os << ", " << fmt_duration(*opts_.time_s - t) << " left";
  } else if (opts_.max_cases) {
    os << ", " << (*opts_.max_cases > static_cast<uint64_t>(done) ? *opts_.max_cases - done : 0)
       << " cases left";
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (live_) {
    log_ << "\r\x1b[K" << os.str() << (final_line ? "\n" : "") << std::flush;
  } else {
    log_ << os.str() << "\n" << std::flush;
  }
}

int Campaign::run(Report* out) {
  t0_ = Clock::now();
  start_iso_ = utc_now_iso8601();
  live_ = opts_.live_progress == 1 || (opts_.live_progress < 0 && ::isatty(STDERR_FILENO));
  {
    // The names the backends give themselves (plugins: "plugin:<name>").
    ThreadBackends probe = make_thread_backends(0);
    for (auto* b : probe.ptrs) backend_names_.push_back(b->name());
  }
  log_ << "mlafuzz fuzz: seed " << opts_.seed << ", shard " << opts_.shard.index << "/"
       << opts_.shard.count << " (" << opts_.shard.source << "), profile " << opts_.profile << ", "
       << jobs_ << " threads, backends";
  for (size_t i = 0; i < plan_.size(); ++i) {
    log_ << " " << backend_names_[i]
         << (plan_[i].isolated ? (plan_[i].on_device ? " [worker per GPU]" : " [worker]") : "");
  }
  if (!devices_.empty() && devices_.front() >= 0) {
    log_ << ", GPUs";
    for (int d : devices_) log_ << " " << d << " (" << device_name(d) << ")";
  }
  if (opts_.time_s) log_ << ", time " << fmt_duration(*opts_.time_s);
  if (opts_.max_cases) log_ << ", " << *opts_.max_cases << " cases";
  if (!opts_.report_dir.empty()) log_ << ", report " << opts_.report_dir;
  log_ << "\n";

  write_report(false);
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads_running_ = jobs_;
  }
  for (int t = 0; t < jobs_; ++t) {
    threads.emplace_back([this, t] {
      thread_main(t);
      std::lock_guard<std::mutex> lock(mu_);
      --threads_running_;
      cv_.notify_all();
    });
  }
  const double progress_every = live_ ? 0.5 : opts_.plain_progress_interval_s;
  auto next_progress = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(progress_every));
  auto next_report = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(opts_.report_interval_s));
  std::optional<Clock::time_point> stop_seen;
  bool abandon = false;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return threads_running_ == 0; });
      if (threads_running_ == 0) break;
    }
    const int sig = opts_.signals ? opts_.signals->load() : 0;
    if (sig > 0 && !stop_seen) {
      stop_seen = Clock::now();
      stop_reason_ = "signal";
      stop_ = true;
      std::lock_guard<std::mutex> lock(mu_);
      log_ << (live_ ? "\r\x1b[K" : "")
           << "mlafuzz: stopping (signal): finishing the cases in flight, then writing the "
              "report (signal again to stop at once)\n";
    }
    // In-flight cases finish within the case timeout; a second signal stops at once.
    if (stop_seen && (sig > 1 || Clock::now() - *stop_seen >
                                     std::chrono::duration<double>(opts_.case_timeout_s + 5))) {
      abandon = true;
      break;
    }
    if (!stop_seen && opts_.time_s && opts_.overrun_grace_s >= 0 &&
        elapsed() > *opts_.time_s + opts_.overrun_grace_s) {
      std::lock_guard<std::mutex> lock(mu_);
      log_ << (live_ ? "\r\x1b[K" : "") << "mlafuzz: time budget spent; leaving "
           << threads_running_ << " case(s) in flight unfinished\n";
      stop_ = true;
      abandon = true;
      break;
    }
    const auto now = Clock::now();
    if (now >= next_progress) {
      progress_line(false);
      next_progress = now + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(progress_every));
    }
    if (now >= next_report) {
      write_report(false);
      next_report = now + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(opts_.report_interval_s));
    }
  }
  if (opts_.signals && opts_.signals->load() > 0) {
    stop_reason_ = "signal";
  } else if (!stop_seen) {
    std::lock_guard<std::mutex> lock(mu_);
    stop_reason_ = opts_.max_cases && static_cast<uint64_t>(done_) >= *opts_.max_cases
                       ? "cases"
                       : (opts_.time_s ? "time" : "cases");
  }
  progress_line(true);
  // Final counts into the corpus entries (same file: same signature and case).
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [sig, f] : findings_) {
      if (f.rec.corpus_path.empty() || f.finding.count == f.rec.count) continue;
      f.finding.count = static_cast<int>(f.rec.count);
      try {
        save_corpus_entry(opts_.corpus_dir, f.minimal, f.finding);
      } catch (const std::exception& e) {
        log_ << "mlafuzz: cannot update " << f.rec.corpus_path << ": " << e.what() << "\n";
      }
    }
  }
  write_report(true);
  const Report r = snapshot(true);
  log_ << render_summary(r);
  if (case_errors_ > 0) log_ << case_errors_ << " case(s) could not be evaluated (see above)\n";
  if (!opts_.report_dir.empty()) {
    log_ << "report: " << opts_.report_dir << "/report.json, junit.xml, report.html\n";
  }
  const int code = r.findings.empty() && case_errors_ == 0 ? 0 : 1;
  if (abandon) {
    // Threads still inside a case: leave without waiting for them (workers notice and exit).
    log_ << std::flush;
    std::fflush(nullptr);
    std::_Exit(code);
  }
  for (auto& th : threads) th.join();
  if (out) *out = r;
  return code;
}

int Campaign::replay(uint64_t index, const std::string& save_path) {
  std::vector<std::string> tags;
  const Case c = generate_case(opts_.seed, index, gen_, &tags);
  log_ << "case " << index << " of seed " << opts_.seed << " (profile " << opts_.profile
       << "): " << shape_class(c) << "\n  tags:";
  for (const auto& t : tags) log_ << " " << t;
  log_ << "\n";
  if (!save_path.empty()) {
    save_case(c, save_path);
    log_ << "  recipe saved to " << save_path << "\n";
  }
  ThreadBackends tb = make_thread_backends(0);
  const CaseEvaluation ev = evaluate_case(c, tb.ptrs, properties_);
  std::map<std::string, std::string> faults;
  for (auto* p : tb.proxies) {
    for (auto& f : p->take_faults()) faults.emplace(f.backend, f.message);
  }
  int failed = 0;
  for (const auto& o : ev.outcomes) {
    const char* verdict = !o.applicable ? "n/a " : (o.passed ? "pass" : "FAIL");
    log_ << "  " << verdict << "  " << o.backend << " / " << o.property;
    if (o.applicable && has_error_figures(o.property)) {
      log_ << "  tightness " << fmt_g(o.tightness) << ", max abs " << fmt_g(o.max_abs);
    }
    log_ << "\n";
    if (o.applicable && !o.passed) {
      ++failed;
      if (o.property == "run" && faults.count(o.backend)) {
        log_ << "    fault: " << faults.at(o.backend) << "\n";
      } else {
        log_ << "    " << format_outcome(o) << "\n";
      }
    }
  }
  log_ << (failed ? std::to_string(failed) + " failure(s)\n" : "all properties pass\n");
  return failed ? 1 : 0;
}

}  // namespace

int run_campaign(const CampaignOptions& opts, Report* report) {
  CampaignOptions o = opts;
  if (!o.max_cases && !o.time_s) o.time_s = 60;
  Campaign c(o);
  return c.run(report);
}

int replay_case(const CampaignOptions& opts, uint64_t index, const std::string& save_path) {
  CampaignOptions o = opts;
  o.report_dir.clear();
  o.jobs = 1;
  Campaign c(o);
  return c.replay(index, save_path);
}

}  // namespace mlafuzz::campaign
