// The campaign: a thin coordinator of its parts. BackendPool (plan.h) knows where each backend
// runs, CampaignStats (stats.h) what ran, FindingStore (findings.h) what failed, Scheduler
// (scheduler.h) when to stop, and Console (progress.h) what the terminal shows.
#include "harness/campaign/campaign.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "core/fileio.h"
#include "harness/campaign/findings.h"
#include "harness/campaign/plan.h"
#include "harness/campaign/progress.h"
#include "harness/campaign/scheduler.h"
#include "harness/campaign/stats.h"

namespace mlafuzz::campaign {

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

// The selected properties (all when none is named); throws for an unknown name.
std::vector<std::string> selected_properties(const std::vector<std::string>& names) {
  check_property_names(names);
  return names.empty() ? all_properties() : names;
}

// Options the parts rely on; throws std::invalid_argument for a bad one.
const CampaignOptions& checked(const CampaignOptions& o) {
  if (o.backends.empty()) throw std::invalid_argument("no backends selected");
  if (o.isolate != "device" && o.isolate != "all" && o.isolate != "none") {
    throw std::invalid_argument("bad --isolate '" + o.isolate + "' (expected device, all or none)");
  }
  if (!(o.case_timeout_s > 0)) throw std::invalid_argument("--case-timeout must be > 0");
  if (o.shrink_time_s < 0) throw std::invalid_argument("--shrink-time must be >= 0");
  if (o.shrink_evals < 0) throw std::invalid_argument("--shrink-evals must be >= 0");
  return o;
}

bool live_output(const CampaignOptions& o) {
  return o.live_progress == 1 || (o.live_progress < 0 && ::isatty(STDERR_FILENO));
}

class Campaign {
 public:
  explicit Campaign(const CampaignOptions& o)
      : opts_(o),
        gen_(gen_config_for_profile(opts_.profile)),
        properties_(selected_properties(opts_.properties)),
        jobs_(checked(opts_).jobs > 0 ? opts_.jobs
                                      : std::max(1u, std::thread::hardware_concurrency())),
        console_(o.log ? *o.log : std::cerr, live_output(o)),
        pool_(opts_),
        stats_(opts_.seed, opts_.profile),
        scheduler_(opts_, console_),
        findings_(opts_, pool_, properties_, console_, [this] { return scheduler_.stop_cause(); }) {
    gen_.envelope = pool_.envelope();
  }

  int run(Report* out);
  int replay(uint64_t index, const std::string& save_path);

 private:
  void thread_main(int t);
  void evaluate_next(uint64_t n, ThreadBackends& tb);
  void record_evaluated(uint64_t n);
  void print_banner();
  void resume();
  std::string stop_reason() const;
  Report snapshot(bool complete);
  void fill_devices(Report& r) const;
  void write_report(bool complete);
  void progress_line(bool final_line);
  int finish(bool abandoned, Report* out);
  std::string replay_all_command(uint64_t index) const;

  CampaignOptions opts_;
  GenConfig gen_;
  std::vector<std::string> properties_;
  int jobs_ = 1;
  Console console_;
  BackendPool pool_;
  CampaignStats stats_;
  Scheduler scheduler_;
  FindingStore findings_;
  std::vector<std::string> backend_names_;  // as the backends call themselves
  std::string start_iso_;
  bool resumed_ = false;
  double resumed_s_ = 0;                  // the earlier runs' duration (--resume)
  TimeBreakdown resumed_time_breakdown_;  // and their worker calls
  std::atomic<uint64_t> next_case_{0};
  // Failing cases evaluated whose failures are being recorded (shrunk): a case is recorded once
  // its findings are, or by finish() when the campaign leaves it in flight. A report written
  // meanwhile never holds a case done whose finding it lacks, so that --resume, which does not
  // run done cases again, loses no finding.
  struct Evaluated {
    uint64_t index = 0;
    Case c;
    std::vector<std::string> tags;
    CaseEvaluation ev;
    Faults faults;
    int device = -1;
  };
  std::mutex evaluated_mu_;
  std::map<uint64_t, Evaluated> evaluated_;  // by case number
};

std::string Campaign::replay_all_command(uint64_t index) const {
  std::string cmd = "mlafuzz fuzz --seed " + std::to_string(opts_.seed) + " --replay-index " +
                    std::to_string(index);
  if (opts_.profile != "default") cmd += " --profile " + opts_.profile;
  if (!opts_.envelope_path.empty()) cmd += " --envelope " + opts_.envelope_path;
  return cmd + " --backends " + pool_.names_as_given();
}

void Campaign::thread_main(int t) {
  ThreadBackends tb;
  try {
    tb = pool_.for_thread(t);
  } catch (const std::exception& e) {
    console_.message("\nmlafuzz: evaluation thread " + std::to_string(t) +
                     " cannot start: " + e.what() + "\n");
    scheduler_.stop();
    return;
  }
  while (!scheduler_.stopping()) {
    const uint64_t n = next_case_.fetch_add(1);
    if (opts_.max_cases && n >= *opts_.max_cases) break;
    if (opts_.time_s && scheduler_.elapsed() >= *opts_.time_s) break;
    if (resumed_ && stats_.done(n)) continue;  // an earlier run of the shard did it
    evaluate_next(n, tb);
  }
}

// Case number n: generate, evaluate, record, and hand each failure to the finding store.
void Campaign::evaluate_next(uint64_t n, ThreadBackends& tb) {
  const uint64_t index = opts_.shard.global_index(n);
  std::vector<std::string> tags;
  Case c;
  CaseEvaluation ev;
  tb.take_faults();
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const double cpu0 = thread_cpu_seconds();
    c = generate_case(opts_.seed, index, gen_, &tags);
    const double generate_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ev = evaluate_case(c, tb.ptrs, properties_);
    ev.steps[CaseStep::kGenerate] = generate_s;
    ev.steps.wall += generate_s;
    ev.steps.thread_cpu = thread_cpu_seconds() - cpu0;
  } catch (const std::exception& e) {
    // A generator or evaluation bug, not a backend failure: say so, keep going.
    stats_.record_error(n);
    console_.message("mlafuzz: case " + std::to_string(index) + " could not be evaluated: " +
                     e.what() + "\n  reproduce: " + replay_all_command(index) + "\n");
    return;
  }
  const Faults faults = tb.take_faults();
  const auto failures = ev.failures();
  if (failures.empty()) {
    stats_.record(n, index, c, tags, ev, faults, tb.device);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(evaluated_mu_);
    evaluated_[n] = Evaluated{index, c, tags, ev, faults, tb.device};
  }
  std::set<std::string> faulted;  // a worker fault is one failure of its backend per case
  for (const PropertyOutcome* o : failures) {
    if (o->run_failed && faults.count(o->backend) && !faulted.insert(o->backend).second) continue;
    findings_.add(*o, c, index, faults, tb);
  }
  record_evaluated(n);
}

// Records case number n if it is still waiting (finish() may have recorded it); all waiting
// cases for n = UINT64_MAX.
void Campaign::record_evaluated(uint64_t n) {
  std::map<uint64_t, Evaluated> take;
  {
    std::lock_guard<std::mutex> lock(evaluated_mu_);
    if (n == UINT64_MAX) {
      take.swap(evaluated_);
    } else if (auto it = evaluated_.find(n); it != evaluated_.end()) {
      take.insert(evaluated_.extract(it));
    }
  }
  for (const auto& [k, e] : take) stats_.record(k, e.index, e.c, e.tags, e.ev, e.faults, e.device);
}

void Campaign::fill_devices(Report& r) const {
  const auto& devices = pool_.devices();
  bool on_gpu = false;
  for (int d : devices) on_gpu = on_gpu || d >= 0;
  if (on_gpu) {
    std::set<std::string> names;
    for (int d : devices) names.insert(pool_.device_name(d));
    r.gpu_name.clear();
    for (const auto& n : names) r.gpu_name += (r.gpu_name.empty() ? "" : ", ") + n;
  }
  if (pool_.device_info_queried()) {
    r.driver_version = pool_.device_info().driver;
    r.cuda_version = pool_.device_info().runtime;
  }
  if (devices.empty()) {
    r.devices.push_back({"cpu", "", r.cases});
    return;
  }
  for (int d : devices) {
    r.devices.push_back({pool_.device_label(d), pool_.device_name(d), stats_.device_cases(d)});
  }
}

Report Campaign::snapshot(bool complete) {
  Report r;
  ShardRun sr;
  stats_.fill(r, sr);
  r.time_breakdown = pool_.time_breakdown();
  merge_time_breakdown(r.time_breakdown, resumed_time_breakdown_);
  r.complete = complete;
  r.seed = opts_.seed;
  r.profile = opts_.profile;
  r.backends = backend_names_;
  r.properties = properties_;
  r.commit = build_commit();
  r.host = host_name();
  r.start = start_iso_;
  r.end = utc_now_iso8601();
  r.duration_s = resumed_s_ + scheduler_.elapsed();
  r.stop_reason = complete ? stop_reason() : "running";
  r.cases_per_s = r.duration_s > 0 ? r.cases / r.duration_s : 0;
  sr.index = opts_.shard.index;
  sr.count = opts_.shard.count;
  sr.host = r.host;
  sr.commit = r.commit;
  sr.start = r.start;
  sr.end = r.end;
  sr.duration_s = r.duration_s;
  sr.stop_reason = r.stop_reason;
  r.shards = {sr};
  fill_devices(r);
  r.findings = findings_.records();
  if (opts_.known) {
    const LedgerResult lr = apply_ledger(*opts_.known, r.findings, utc_today());
    for (size_t i : lr.expired) {
      const KnownEntry& e = opts_.known->entries[i];
      r.warnings.push_back("known-failure entry " + std::to_string(i) + " (" + e.id +
                           ") expired on " + e.expires);
    }
  }
  if (complete && r.stop_reason == "time" && r.cases <= jobs_) {
    // The time budget ended with each thread through at most one case: the backends set the
    // pace.
    r.warnings.push_back(std::to_string(r.cases) + " case(s) completed in " +
                         fmt_g(r.duration_s, 3) + " s: the backends were too slow or hung" +
                         (stats_.totals().failing_outcomes > 0 ? "; see the failures above" : ""));
  }
  return r;
}

std::string Campaign::stop_reason() const {
  if (opts_.signals && opts_.signals->load() > 0) return "signal";
  if (scheduler_.signalled()) return "signal";
  if (opts_.max_cases && static_cast<uint64_t>(stats_.totals().cases) >= *opts_.max_cases) {
    return "cases";
  }
  return opts_.time_s ? "time" : "cases";
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
    console_.message("\nmlafuzz: cannot write the report: " + std::string(e.what()) + "\n");
  }
}

void Campaign::progress_line(bool final_line) {
  const CampaignStats::Totals t = stats_.totals();
  ProgressFigures p;
  p.cases = t.cases;
  p.failures = t.failing_outcomes;
  p.findings = findings_.size();
  p.worst_tightness = t.worst_tightness;
  p.nonfinite_mismatch = t.nonfinite_mismatch;
  p.elapsed_s = scheduler_.elapsed();
  p.time_s = opts_.time_s;
  p.max_cases = opts_.max_cases;
  console_.status(progress_text(p), final_line);
}

void Campaign::print_banner() {
  std::ostream& log = console_.out();
  log << "mlafuzz fuzz: seed " << opts_.seed << ", shard " << opts_.shard.index << "/"
      << opts_.shard.count << " (" << opts_.shard.source << "), profile " << opts_.profile << ", "
      << jobs_ << " threads, backends";
  const auto& plan = pool_.plan();
  for (size_t i = 0; i < plan.size(); ++i) {
    log << " " << backend_names_[i]
        << (!plan[i].isolated ? ""
            : plan[i].on_device
                ? " [" + std::to_string(pool_.workers_per_device()) + " worker(s) per GPU]"
                : " [worker]");
  }
  const auto& devices = pool_.devices();
  if (!devices.empty() && devices.front() >= 0) {
    log << ", GPUs";
    for (int d : devices) log << " " << d << " (" << pool_.device_name(d) << ")";
  }
  if (opts_.time_s) log << ", time " << fmt_duration(*opts_.time_s);
  if (opts_.max_cases) log << ", " << *opts_.max_cases << " cases";
  if (!opts_.report_dir.empty()) log << ", report " << opts_.report_dir;
  log << "\n";
  const std::string env = gen_.envelope.describe();
  if (!env.empty()) {
    log << "  generating inside the envelope:";
    std::istringstream lines(env);
    for (std::string line; std::getline(lines, line);) log << " " << line << ";";
    log << "\n";
  }
}

void Campaign::resume() {
  namespace fs = std::filesystem;
  std::ostream& log = console_.out();
  const std::string path = (fs::path(opts_.report_dir) / "report.json").string();
  if (opts_.report_dir.empty() || !fs::exists(path)) {
    log << "  resume: no report in " << opts_.report_dir << " yet: the shard starts at case 0\n";
    return;
  }
  const Report r = load_report(path);
  auto same = [&](const std::string& what, const std::string& was, const std::string& now) {
    if (was == now) return;
    throw std::invalid_argument("--resume: " + path + " is a campaign with " + what + " " + was +
                                ", this one has " + now +
                                " (resume with the same options, or report into another folder)");
  };
  auto joined = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& x : v) out += (out.empty() ? "" : ",") + x;
    return out;
  };
  same("seed", std::to_string(r.seed), std::to_string(opts_.seed));
  same("profile", r.profile, opts_.profile);
  same("backends", joined(r.backends), joined(backend_names_));
  same("properties", joined(r.properties), joined(properties_));
  same("shard count", std::to_string(r.shards.size()), "1");
  const ShardRun& shard = r.shards.front();
  same("shard", std::to_string(shard.index) + "/" + std::to_string(shard.count),
       std::to_string(opts_.shard.index) + "/" + std::to_string(opts_.shard.count));
  try {
    stats_.restore(r, shard);
  } catch (const ReportError& e) {
    throw std::invalid_argument("--resume: " + path + ": " + e.what());
  }
  // A finding first seen in a case that is not done (in flight when the report was written) is
  // found again when the case runs.
  std::vector<Finding> kept;
  for (const Finding& f : r.findings) {
    if (stats_.done(f.case_index / static_cast<uint64_t>(shard.count))) kept.push_back(f);
  }
  findings_.restore(
      kept, [this](uint64_t index) { return generate_case(opts_.seed, index, gen_, nullptr); });
  resumed_ = true;
  start_iso_ = r.start;
  resumed_s_ = r.duration_s;
  resumed_time_breakdown_ = r.time_breakdown;
  if (opts_.time_s) opts_.time_s = std::max(0.0, *opts_.time_s - resumed_s_);
  log << "  resuming " << path << ": " << r.cases << " case(s) done in " << fmt_duration(resumed_s_)
      << ", " << kept.size() << " finding(s) kept";
  if (kept.size() < r.findings.size()) {
    log << ", " << r.findings.size() - kept.size() << " to be found again (cases in flight)";
  }
  if (opts_.time_s) log << "; " << fmt_duration(*opts_.time_s) << " of the time budget left";
  log << "\n";
}

int Campaign::run(Report* out) {
  scheduler_.start_clock();
  start_iso_ = utc_now_iso8601();
  {
    // The names the backends give themselves (plugins: "plugin:<name>").
    ThreadBackends probe = pool_.for_thread(0);
    for (auto* b : probe.ptrs) backend_names_.push_back(b->traits().name);
  }
  print_banner();
  if (opts_.resume) resume();
  write_report(false);
  Scheduler::Ticks ticks;
  ticks.progress_interval_s = console_.live() ? 0.5 : opts_.plain_progress_interval_s;
  ticks.progress = [this] { progress_line(false); };
  ticks.report = [this] { write_report(false); };
  const bool joined = scheduler_.run(
      jobs_, [this](int t) { thread_main(t); }, ticks);
  return finish(!joined, out);
}

// The final progress line, corpus counts, report and summary; leaves the process at once when
// cases were left in flight. Every failure seen is a finding by then, its shrink finished or not.
int Campaign::finish(bool abandoned, Report* out) {
  const std::string cause = scheduler_.stop_cause();
  findings_.settle_in_flight(cause.empty() ? "the campaign ended" : cause);
  record_evaluated(UINT64_MAX);  // cases left in flight while their failures were shrunk
  progress_line(true);
  findings_.save_final_counts();  // final counts into the corpus entries
  write_report(true);
  const Report r = snapshot(true);
  std::ostream& log = console_.out();
  log << render_summary(r);
  const int64_t case_errors = stats_.totals().case_errors;
  if (case_errors > 0) log << case_errors << " case(s) could not be evaluated (see above)\n";
  if (!opts_.report_dir.empty()) {
    log << "report: " << opts_.report_dir << "/report.json, junit.xml, report.html\n";
    const std::filesystem::path workers = std::filesystem::path(opts_.report_dir) / "workers.log";
    std::error_code ec;
    if (std::filesystem::file_size(workers, ec) > 0 && !ec) {
      log << "the workers' stderr (kernels' prints, warnings, tracebacks): " << workers.string()
          << "\n";
    }
  }
  bool failed = !r.findings.empty() || stats_.totals().failing_outcomes > 0;
  if (opts_.known) {
    // Every failing outcome belongs to a finding: the run fails for findings no entry knows,
    // for expired entries, and (strict) for entries whose case now passes.
    std::vector<Finding> findings = r.findings;
    const LedgerResult lr = apply_ledger(*opts_.known, findings, utc_today());
    const std::vector<int> fixed = replay_unseen(*opts_.known, lr, backend_names_);
    log << render_ledger(*opts_.known, lr, fixed);
    const bool stale =
        opts_.strict_known && std::find(fixed.begin(), fixed.end(), 1) != fixed.end();
    failed = lr.unknown > 0 || !lr.expired.empty() || stale ||
             (r.findings.empty() && stats_.totals().failing_outcomes > 0);
    if (stale) log << "--strict-known: an entry's case passes now; remove the entry\n";
  }
  const int code = !failed && case_errors == 0 ? 0 : 1;
  if (abandoned) {
    // Threads still inside a case: leave without waiting for them (workers notice and exit).
    log << std::flush;
    std::fflush(nullptr);
    std::_Exit(code);
  }
  scheduler_.join();
  if (out) *out = r;
  return code;
}

int Campaign::replay(uint64_t index, const std::string& save_path) {
  std::ostream& log = console_.out();
  std::vector<std::string> tags;
  const Case c = generate_case(opts_.seed, index, gen_, &tags);
  log << "case " << index << " of seed " << opts_.seed << " (profile " << opts_.profile
      << "): " << shape_class(c) << "\n  tags:";
  for (const auto& t : tags) log << " " << t;
  log << "\n";
  if (!save_path.empty()) {
    save_case(c, save_path);
    log << "  recipe saved to " << save_path << "\n";
  }
  ThreadBackends tb = pool_.for_thread(0);
  const CaseEvaluation ev = evaluate_case(c, tb.ptrs, properties_);
  const Faults faults = tb.take_faults();
  int failed = 0;
  for (const auto& o : ev.outcomes) {
    const char* verdict = !o.applicable ? "n/a " : (o.passed ? "pass" : "FAIL");
    log << "  " << verdict << "  " << o.backend << " / " << o.property;
    if (o.applicable && has_error_figures(o.property)) {
      log << "  tightness " << fmt_g(o.tightness) << ", max abs " << fmt_g(o.max_abs);
      if (o.nonfinite_mismatch) log << ", non-finite mismatch";
    }
    log << "\n";
    if (!o.applicable || o.passed) continue;
    ++failed;
    if (o.property == "run" && faults.count(o.backend)) {
      log << "    fault: " << faults.at(o.backend) << "\n";
    } else {
      log << "    " << format_outcome(o) << "\n";
    }
  }
  log << (failed ? std::to_string(failed) + " failure(s)\n" : "all properties pass\n");
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
