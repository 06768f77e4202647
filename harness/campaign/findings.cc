#include "harness/campaign/findings.h"

#include <algorithm>
#include <memory>

namespace mlafuzz::campaign {

// The fresh worker a fault is shrunk through, and the last fault it reported.
struct FindingStore::FaultProbe {
  std::unique_ptr<IsolatedBackend> worker;
  std::string last_fault;
};

void FindingStore::add(const PropertyOutcome& o, const Case& c, uint64_t index,
                       const Faults& faults, ThreadBackends& tb) {
  PropertyOutcome failure = o;
  if (o.property == "run" && faults.count(o.backend) > 0) {
    failure.property = "fault";
    failure.detail = faults.at(o.backend);
  }
  const std::string pre_key = failure.property + "|" + o.backend + "|" + shape_class(c);
  if (!claim(pre_key)) return;
  const Shrunk s = shrink(failure, c, tb, pre_key);
  Finding f = make_finding(s.outcome, s.minimal, opts_.seed, index);
  f.backend_source = pool_.backend_source(o.backend, tb);
  pool_.fill_gpu(f, o.backend, tb);
  f.shape_class = shape_class(s.minimal);
  f.shrunk = s.shrunk;
  f.summary = format_outcome(s.outcome);
  store(pre_key, std::move(f), s.minimal, index);
}

bool FindingStore::claim(const std::string& pre_key) {
  std::lock_guard<std::mutex> lock(mu_);
  PreClass& pc = pre_[pre_key];
  if (pc.state == 2) {
    ++findings_.at(pc.signature).finding.count;
    return false;
  }
  if (pc.state == 1) {
    ++pc.pending;
    return false;
  }
  pc.state = 1;
  return true;
}

FindingStore::Shrunk FindingStore::shrink(const PropertyOutcome& failure, const Case& c,
                                          ThreadBackends& tb, const std::string& pre_key) {
  Shrunk r{c, false, failure};
  if (!(opts_.shrink_time_s > 0) || opts_.shrink_evals <= 0 || stopping_()) return r;
  const bool fault = failure.property == "fault";
  try {
    FaultProbe probe;
    std::function<bool(const Case&)> still_fails;
    if (fault) {
      still_fails = fault_predicate(failure, c, tb, probe);
    } else {
      auto same = same_failure_predicate(failure, tb.ptrs);
      still_fails = [this, same](const Case& k) { return !stopping_() && same(k); };
    }
    if (!still_fails) return r;  // a fault that does not reproduce alone: keep the case
    const ShrinkResult sr =
        shrink_case(c, still_fails, {opts_.shrink_evals, opts_.shrink_time_s}, pool_.envelope());
    if (sr.stopped_by == ShrinkStop::kSeconds) {
      console_.message("\nmlafuzz: shrinking " + pre_key + " hit --shrink-time after " +
                       std::to_string(sr.evaluations) +
                       " evaluations (a result that depends on this machine's speed)\n");
    }
    r.minimal = sr.minimal;
    r.shrunk = sr.steps > 0;
    if (fault) {
      r.outcome.detail = probe.last_fault;
      return r;
    }
    // The finding describes the minimal case.
    const CaseEvaluation ev = evaluate_case(r.minimal, tb.ptrs, {failure.property});
    for (const auto& x : ev.outcomes) {
      if (x.backend == failure.backend && x.property == failure.property && !x.passed) {
        r.outcome = x;
        break;
      }
    }
  } catch (const std::exception& e) {
    console_.message("\nmlafuzz: shrinking " + pre_key + " stopped: " + e.what() + "\n");
  }
  return r;
}

std::function<bool(const Case&)> FindingStore::fault_predicate(const PropertyOutcome& failure,
                                                               const Case& c, ThreadBackends& tb,
                                                               FaultProbe& probe) {
  probe.worker = pool_.fresh_worker(failure.backend, tb);
  probe.last_fault = failure.detail;
  IsolatedBackend* fp = probe.worker.get();
  // Partners stay in the list (mma-vs-simt), the faulting backend is the fresh worker.
  std::vector<Backend*> ptrs = tb.ptrs;
  for (auto*& p : ptrs) {
    if (p->name() == failure.backend) p = fp;
  }
  std::function<bool(const Case&)> still_fails = [this, fp, ptrs, &probe](const Case& k) {
    if (stopping_()) return false;
    fp->take_faults();
    try {
      evaluate_case(k, ptrs, properties_);
    } catch (const std::exception&) {
      return false;
    }
    auto f = fp->take_faults();
    if (f.empty()) return false;
    probe.last_fault = f.front().message;
    return true;
  };
  if (!still_fails(c)) return nullptr;
  return still_fails;
}

void FindingStore::store(const std::string& pre_key, Finding f, const Case& minimal,
                         uint64_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  PreClass& pc = pre_[pre_key];
  pc.state = 2;
  pc.signature = f.signature;
  const int64_t seen = 1 + pc.pending;
  pc.pending = 0;
  auto it = findings_.find(f.signature);
  if (it != findings_.end()) {
    it->second.finding.count += seen;
    return;
  }
  f.count = seen;
  Entry e{std::move(f), minimal, 0};
  save_new(e, index);
  const Finding& n = e.finding;
  console_.message("mlafuzz: new finding " + n.signature + " (case " + std::to_string(index) +
                   (n.shrunk ? ", shrunk" : "") + ")\n  " + n.summary +
                   "\n  saved: " + n.corpus_path + "\n  reproduce: " + n.repro + "\n");
  findings_.emplace(n.signature, std::move(e));
}

void FindingStore::save_new(Entry& e, uint64_t index) {
  Finding& f = e.finding;
  try {
    f.corpus_path = save_corpus_entry(opts_.corpus_dir, e.minimal, f);
    e.saved_count = f.count;
    f.corpus_entries = {f.corpus_path};
    // The names as given, files absolute: the command works from any directory.
    f.repro = repro_command(f.corpus_path, f.backend_source);
  } catch (const std::exception& ex) {
    console_.message("\nmlafuzz: cannot save the finding " + f.signature + ": " + ex.what() + "\n");
    // A fault is the "run" property's failure.
    const std::string property = f.property == "fault" ? "run" : f.property;
    f.repro = replay_command(opts_.seed, index, opts_.profile, f.backend, property);
  }
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

std::vector<Finding> FindingStore::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Finding> out;
  for (const auto& [sig, e] : findings_) out.push_back(e.finding);
  return out;
}

int64_t FindingStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(findings_.size());
}

}  // namespace mlafuzz::campaign
