#include "harness/campaign/findings.h"

#include <algorithm>
#include <filesystem>
#include <memory>

#include "harness/backends/ipc_channel.h"

namespace mlafuzz::campaign {
namespace {

// Shrink evaluations that may end in a hang before a shrink gives up with the case so far: each
// costs a --case-timeout, and a failure whose every step hangs would spend minutes on them.
constexpr int kMaxShrinkHangs = 3;

// The note of a record whose shrink has not ended: what a report written meanwhile, or a corpus
// entry left by a campaign killed meanwhile, says.
constexpr const char* kShrinkingNote = "being shrunk (the case as far as shrinking got)";

// The record of `first`'s failure class for case `c` failing as `o`: where it ran (backends,
// GPU), when it was first seen and its count stay `first`'s.
Finding refreshed(const Finding& first, const PropertyOutcome& o, const Case& c, bool shrunk) {
  Finding f = make_finding(o, c, first.seed, first.case_index);
  f.backend_source = first.backend_source;
  f.gpu_name = first.gpu_name;
  f.driver_version = first.driver_version;
  f.cuda_version = first.cuda_version;
  f.found_at = first.found_at;
  f.count = first.count;
  f.corpus_path = first.corpus_path;
  f.shape_class = shape_class(c);
  f.shrunk = shrunk;
  f.summary = format_outcome(o);
  f.shrink_note = first.shrink_note;
  return f;
}

// The failure class of a failure before shrinking: property | backend | shape class of the case.
std::string class_key(const std::string& property, const std::string& backend, const Case& c) {
  return property + "|" + backend + "|" + shape_class(c);
}

}  // namespace

// What a shrink learns as it goes: the failure of the case so far, the hangs met, and for a
// fault the fresh worker it is shrunk through.
struct FindingStore::ShrinkProbe {
  PropertyOutcome last;
  int hangs = 0;  // evaluations that ended in a hang (a call past --case-timeout)
  std::unique_ptr<IsolatedBackend> worker;
};

void FindingStore::add(const PropertyOutcome& o, const Case& c, uint64_t index,
                       const Faults& faults, ThreadBackends& tb) {
  PropertyOutcome failure = o;
  if (o.run_failed && faults.count(o.backend) > 0) {
    failure.property = "fault";
    failure.detail = faults.at(o.backend);
  }
  const std::string pre_key = class_key(failure.property, o.backend, c);
  Finding first = make_finding(failure, c, opts_.seed, index);
  first.backend_source = pool_.backend_source(o.backend, tb);
  pool_.fill_gpu(first, o.backend, tb);
  first.shape_class = shape_class(c);
  first.summary = format_outcome(failure);
  first.shrink_note = kShrinkingNote;
  if (!claim(pre_key, std::move(first), c)) return;
  finish_shrink(pre_key, shrink(failure, c, tb, pre_key));
}

bool FindingStore::claim(const std::string& pre_key, Finding first, const Case& c) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto [it, fresh] = pre_.try_emplace(pre_key);
  PreClass& pc = it->second;
  if (!fresh) {
    if (pc.shrinking) {
      ++pc.pending;
    } else {
      ++findings_.at(pc.signature).finding.count;
    }
    return false;
  }
  pc.record = {std::move(first), c, 0};
  save(pc.record);
  return true;
}

FindingStore::Shrunk FindingStore::shrink(const PropertyOutcome& failure, const Case& c,
                                          ThreadBackends& tb, const std::string& pre_key) {
  Shrunk r{c, false, failure, ""};
  if (!(opts_.shrink_time_s > 0) || opts_.shrink_evals <= 0) {
    r.note = "shrinking is off (--shrink-time 0 or --shrink-evals 0)";
    return r;
  }
  if (const std::string why = stopping_(); !why.empty()) {
    r.note = why + " before shrinking";
    return r;
  }
  const bool fault = failure.property == "fault";
  ShrinkProbe probe;
  probe.last = failure;
  try {
    std::function<bool(const Case&)> still_fails;
    if (fault) {
      still_fails = fault_predicate(failure, c, tb, probe);
    } else {
      auto same = same_failure_predicate(failure, tb.ptrs, &probe.last);
      still_fails = [same, &tb, &probe](const Case& k) {
        tb.take_faults();
        const bool fails = same(k);
        for (const auto& [backend, message] : tb.take_faults()) {
          if (ipc::is_hang(message)) {
            ++probe.hangs;
            break;
          }
        }
        return fails;
      };
    }
    if (!still_fails) {
      r.note = "the fault did not happen again on a fresh worker: the case as found";
      return r;
    }
    ShrinkHooks hooks;
    hooks.on_step = [this, &pre_key, &probe](const Case& k) { step(pre_key, k, probe.last); };
    hooks.stop = [this, &probe] { return probe.hangs >= kMaxShrinkHangs || !stopping_().empty(); };
    const ShrinkResult sr = shrink_case(c, still_fails, {opts_.shrink_evals, opts_.shrink_time_s},
                                        pool_.envelope(), hooks);
    r.minimal = sr.minimal;
    r.shrunk = sr.steps > 0;
    r.outcome = probe.last;
    switch (sr.stopped_by) {
      case ShrinkStop::kFixedPoint:
        break;
      case ShrinkStop::kEvaluations:
        r.note = "shrinking stopped after --shrink-evals " + std::to_string(opts_.shrink_evals) +
                 " evaluations";
        break;
      case ShrinkStop::kSeconds:
        r.note = "shrinking stopped after --shrink-time " + fmt_duration(opts_.shrink_time_s);
        console_.message("\nmlafuzz: shrinking " + pre_key + " hit --shrink-time after " +
                         std::to_string(sr.evaluations) +
                         " evaluations (a result that depends on this machine's speed)\n");
        break;
      case ShrinkStop::kStopped:
        r.note = probe.hangs >= kMaxShrinkHangs
                     ? "shrinking stopped after " + std::to_string(probe.hangs) +
                           " evaluations that hung (each costs --case-timeout)"
                     : stopping_() + " while shrinking";
        break;
    }
  } catch (const std::exception& e) {
    console_.message("\nmlafuzz: shrinking " + pre_key + " stopped: " + e.what() + "\n");
    r.note = std::string("shrinking stopped: ") + e.what();
  }
  return r;
}

std::function<bool(const Case&)> FindingStore::fault_predicate(const PropertyOutcome& failure,
                                                               const Case& c, ThreadBackends& tb,
                                                               ShrinkProbe& probe) {
  probe.worker = pool_.fresh_worker(failure.backend, tb);
  IsolatedBackend* fp = probe.worker.get();
  // Partners stay in the list (mma-vs-simt), the faulting backend is the fresh worker.
  std::vector<Backend*> ptrs = tb.ptrs;
  for (auto*& p : ptrs) {
    if (p->name() == failure.backend) p = fp;
  }
  std::function<bool(const Case&)> still_fails = [this, fp, ptrs, &probe](const Case& k) {
    fp->take_faults();
    try {
      evaluate_case(k, ptrs, properties_);
    } catch (const std::exception&) {
      return false;
    }
    auto f = fp->take_faults();
    if (f.empty()) return false;
    if (std::any_of(f.begin(), f.end(), [](const auto& x) { return ipc::is_hang(x.message); })) {
      ++probe.hangs;
    }
    probe.last.detail = f.front().message;
    return true;
  };
  if (!still_fails(c)) return nullptr;
  return still_fails;
}

void FindingStore::step(const std::string& pre_key, const Case& k, const PropertyOutcome& o) {
  std::lock_guard<std::mutex> lock(mu_);
  PreClass& pc = pre_.at(pre_key);
  if (!pc.shrinking) return;  // settled: the campaign already has its finding
  Entry& e = pc.record;
  e.finding = refreshed(e.finding, o, k, true);
  e.minimal = k;
  save(e);
}

void FindingStore::finish_shrink(const std::string& pre_key, const Shrunk& s) {
  std::lock_guard<std::mutex> lock(mu_);
  PreClass& pc = pre_.at(pre_key);
  if (!pc.shrinking) return;
  Entry e = pc.record;
  e.finding = refreshed(e.finding, s.outcome, s.minimal, s.shrunk);
  e.finding.shrink_note = s.note;
  e.minimal = s.minimal;
  settle(pc, std::move(e));
}

void FindingStore::settle_in_flight(const std::string& cause) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, pc] : pre_) {
    if (!pc.shrinking) continue;
    Entry e = pc.record;
    e.finding.shrink_note = cause + " while shrinking";
    settle(pc, std::move(e));
  }
}

void FindingStore::settle(PreClass& pc, Entry e) {
  pc.shrinking = false;
  pc.signature = e.finding.signature;
  const int64_t seen = 1 + pc.pending;
  pc.pending = 0;
  const std::string record_file = pc.record.finding.corpus_path;
  auto it = findings_.find(e.finding.signature);
  if (it != findings_.end()) {
    it->second.finding.count += seen;
    pc.record = {};
    if (!record_file.empty() && !file_in_use(record_file)) {
      std::error_code ec;
      std::filesystem::remove(record_file, ec);
    }
    return;
  }
  pc.record = {};
  e.finding.count = seen;
  save(e);
  const Finding& n = e.finding;
  const std::string how = n.shrink_note.empty() ? (n.shrunk ? ", shrunk" : "")
                          : n.shrunk            ? ", partly shrunk: " + n.shrink_note
                                                : ", not shrunk: " + n.shrink_note;
  console_.message("mlafuzz: new finding " + n.signature + " (case " +
                   std::to_string(n.case_index) + how + ")\n  " + n.summary +
                   "\n  saved: " + n.corpus_path + "\n  reproduce: " + n.repro + "\n");
  findings_.emplace(n.signature, std::move(e));
}

void FindingStore::save(Entry& e) {
  Finding& f = e.finding;
  const std::string before = f.corpus_path;
  try {
    f.corpus_path = save_corpus_entry(opts_.corpus_dir, e.minimal, f);
    e.saved_count = f.count;
    f.corpus_entries = {f.corpus_path};
    // The names as given, files absolute: the command works from any directory. A fault may
    // be a hang: the campaign's case timeout, not repro's default.
    f.repro = repro_command(f.corpus_path, f.backend_source);
    if (f.property == "fault") f.repro += " --case-timeout " + fmt_g(opts_.case_timeout_s, 6) + "s";
  } catch (const std::exception& ex) {
    console_.message("\nmlafuzz: cannot save the finding " + f.signature + ": " + ex.what() + "\n");
    if (!before.empty()) return;  // the entry saved before stays
    // A fault is the "run" property's failure.
    const std::string property = f.property == "fault" ? "run" : f.property;
    f.repro = replay_command(opts_.seed, f.case_index, opts_.profile, f.backend, property);
    return;
  }
  if (!before.empty() && before != f.corpus_path && !file_in_use(before)) {
    std::error_code ec;
    std::filesystem::remove(before, ec);
  }
}

bool FindingStore::file_in_use(const std::string& path) const {
  for (const auto& [key, pc] : pre_) {
    if (pc.shrinking && pc.record.finding.corpus_path == path) return true;
  }
  for (const auto& [sig, e] : findings_) {
    if (e.finding.corpus_path == path) return true;
  }
  return false;
}

void FindingStore::save_final_counts() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [sig, e] : findings_) {
    if (e.finding.corpus_path.empty() || e.saved_count == e.finding.count) continue;
    try {
      // Same signature and case: the same file.
      save_corpus_entry(opts_.corpus_dir, e.minimal, e.finding);
      e.saved_count = e.finding.count;
    } catch (const std::exception& ex) {
      console_.message("mlafuzz: cannot update " + e.finding.corpus_path + ": " + ex.what() + "\n");
    }
  }
}

void FindingStore::restore(const std::vector<Finding>& earlier,
                           const std::function<Case(uint64_t index)>& first_case) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Finding& f : earlier) {
    Entry e{f, Case{}, f.count};
    try {
      e.minimal = load_corpus_entry(f.corpus_path).c;
    } catch (const std::exception& ex) {
      // Kept in the report; its entry is not rewritten from a case it does not hold.
      console_.message("mlafuzz: resumed finding " + f.signature + ": " + ex.what() + "\n");
      e.finding.corpus_path.clear();
    }
    PreClass& pc = pre_[class_key(f.property, f.backend, first_case(f.case_index))];
    pc.shrinking = false;
    pc.signature = f.signature;
    findings_.emplace(f.signature, std::move(e));
  }
}

std::vector<Finding> FindingStore::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, Finding> merged;
  for (const auto& [sig, e] : findings_) merged.emplace(sig, e.finding);
  for (const auto& [key, pc] : pre_) {
    if (!pc.shrinking) continue;
    const Finding& f = pc.record.finding;
    const auto [it, fresh] = merged.emplace(f.signature, f);
    if (fresh) it->second.count = 0;
    it->second.count += 1 + pc.pending;
  }
  std::vector<Finding> out;
  for (auto& [sig, f] : merged) out.push_back(std::move(f));
  return out;
}

int64_t FindingStore::size() const { return static_cast<int64_t>(records().size()); }

}  // namespace mlafuzz::campaign
