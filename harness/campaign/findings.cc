#include "harness/campaign/findings.h"

#include <algorithm>
#include <memory>

#include "properties/canonical.h"
#include "properties/property_table.h"
#include "properties/triage.h"

namespace mlafuzz::campaign {
namespace {

// The raw class of `raw` in the group's list (added when new).
RawFailure& raw_class(Finding& f, const RawFailure& raw) {
  for (RawFailure& r : f.raw) {
    if (r.property == raw.property && r.shape_class == raw.shape_class) return r;
  }
  RawFailure added = raw;
  added.count = 0;
  return f.raw.emplace_back(std::move(added));
}

// Properties in table order, each once.
void add_properties(std::vector<std::string>& to, const std::vector<std::string>& from) {
  for (const auto& p : from) {
    if (std::find(to.begin(), to.end(), p) == to.end()) to.push_back(p);
  }
  sort_properties(to);
}

std::string properties_text(const std::vector<std::string>& props) {
  std::string s;
  for (const auto& p : props) s += (s.empty() ? "" : ", ") + p;
  return s;
}

}  // namespace

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
  RawFailure raw;
  raw.property = failure.property;
  raw.shape_class = shape_class(c);
  raw.count = 1;
  raw.seed = opts_.seed;
  raw.case_index = index;
  // A fault is the "run" property's failure.
  raw.repro = replay_command(opts_.seed, index, opts_.profile, o.backend,
                             failure.property == "fault" ? "run" : failure.property);
  const std::string pre_key = failure.property + "|" + o.backend + "|" + raw.shape_class;
  if (!claim(pre_key)) return;
  Triaged t = failure.property == "fault" ? triage_fault(failure, c, index, tb, pre_key)
                                          : triage(failure, c, index, tb, pre_key);
  t.finding.backend_source = pool_.backend_source(o.backend, tb);
  pool_.fill_gpu(t.finding, o.backend, tb);
  store(pre_key, std::move(raw), std::move(t), index);
}

bool FindingStore::claim(const std::string& pre_key) {
  std::lock_guard<std::mutex> lock(mu_);
  PreClass& pc = pre_[pre_key];
  if (pc.state == 2) {
    Finding& f = findings_.at(pc.signature).finding;
    ++f.count;
    const size_t bar = pre_key.find('|');
    const std::string shape = pre_key.substr(pre_key.find('|', bar + 1) + 1);
    for (RawFailure& r : f.raw) {
      if (r.property == pre_key.substr(0, bar) && r.shape_class == shape) ++r.count;
    }
    return false;
  }
  if (pc.state == 1) {
    ++pc.pending;
    return false;
  }
  pc.state = 1;
  return true;
}

FindingStore::Triaged FindingStore::triage(const PropertyOutcome& failure, const Case& c,
                                           uint64_t index, ThreadBackends& tb,
                                           const std::string& pre_key) {
  Triaged r{make_finding(failure, c, opts_.seed, index), with_explicit_indices(c)};
  r.finding.summary = format_outcome(failure);
  if (!(opts_.shrink_time_s > 0) || opts_.shrink_evals <= 0 || stopping_()) return r;
  try {
    TriageOptions to;
    to.properties = properties_;
    to.limits = {opts_.shrink_evals, opts_.shrink_time_s};
    to.envelope = pool_.envelope();
    to.stopping = stopping_;
    const Triage t = triage_failure(c, failure, tb.ptrs, to);
    if (t.stopped_by == ShrinkStop::kSeconds) {
      console_.message("\nmlafuzz: shrinking " + pre_key + " hit --shrink-time after " +
                       std::to_string(t.evaluations) +
                       " evaluations (a result that depends on this machine's speed)\n");
    }
    // A triage cut short by the end of the campaign is not a result: keep the case as found.
    if (stopping_()) return r;
    Finding f = make_finding(t.primary, t.minimal, opts_.seed, index);
    f.kind = failure_kind_name(t.kind);
    f.causes = t.causes;
    f.signature = t.signature;
    f.properties.clear();
    for (const auto& o : t.failures) f.properties.push_back(o.property);
    f.locus = t.locus.outputs;
    if (!t.locus.entries.empty()) f.locus += (f.locus.empty() ? "" : "; ") + t.locus.entries;
    f.inputs = t.locus.inputs;
    f.shrunk = t.steps > 0;
    f.summary = format_outcome(t.primary);
    r = {std::move(f), t.minimal, t.evaluations};
  } catch (const std::exception& e) {
    console_.message("\nmlafuzz: shrinking " + pre_key + " stopped: " + e.what() + "\n");
  }
  return r;
}

FindingStore::Triaged FindingStore::triage_fault(const PropertyOutcome& failure, const Case& c,
                                                 uint64_t index, ThreadBackends& tb,
                                                 const std::string& pre_key) {
  Triaged r{make_finding(failure, c, opts_.seed, index), with_explicit_indices(c)};
  r.finding.properties = {"run"};
  r.finding.summary = format_outcome(failure);
  if (!(opts_.shrink_time_s > 0) || opts_.shrink_evals <= 0 || stopping_()) return r;
  try {
    FaultProbe probe;
    const std::function<bool(const Case&)> still_fails = fault_predicate(failure, c, tb, probe);
    if (!still_fails) return r;  // a fault that does not reproduce alone: keep the case
    const ShrinkLimits limits{opts_.shrink_evals, opts_.shrink_time_s};
    const ShrinkResult sr = shrink_canonical(c, still_fails, still_fails, limits, pool_.envelope());
    if (sr.stopped_by == ShrinkStop::kSeconds) {
      console_.message("\nmlafuzz: shrinking " + pre_key + " hit --shrink-time after " +
                       std::to_string(sr.evaluations) +
                       " evaluations (a result that depends on this machine's speed)\n");
    }
    if (stopping_()) return r;
    PropertyOutcome o = failure;
    o.detail = probe.last_fault;
    Finding f = make_finding(o, sr.minimal, opts_.seed, index);
    f.properties = {"run"};
    f.shrunk = sr.steps > 0;
    f.summary = format_outcome(o);
    int evaluations = sr.evaluations;
    std::vector<int32_t> tokens;
    const int left = limits.max_evaluations - evaluations;
    if (left > 0 && !sr.budget_exhausted()) {
      f.locus = needed_entries(sr.minimal, still_fails, std::min(left, 16), &evaluations, &tokens);
    }
    f.inputs = inline_inputs(sr.minimal, tokens);
    r = {std::move(f), sr.minimal, evaluations};
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

void FindingStore::store(const std::string& pre_key, RawFailure raw, Triaged t, uint64_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  PreClass& pc = pre_[pre_key];
  pc.state = 2;
  pc.signature = t.finding.signature;
  const int64_t seen = 1 + pc.pending;
  pc.pending = 0;
  raw.count = seen;
  auto it = findings_.find(t.finding.signature);
  if (it != findings_.end()) {
    Finding& f = it->second.finding;
    f.count += seen;
    raw_class(f, raw).count += seen;
    add_properties(f.properties, t.finding.properties);
    return;
  }
  t.finding.count = seen;
  t.finding.raw = {raw};
  const int evaluations = t.evaluations;
  Entry e{std::move(t.finding), std::move(t.minimal), 0};
  save_new(e, index);
  const Finding& n = e.finding;
  std::string msg = "mlafuzz: new finding " + n.signature + " (case " + std::to_string(index) +
                    (n.shrunk ? ", shrunk" : "") +
                    (evaluations > 0 ? " in " + std::to_string(evaluations) + " evaluations" : "") +
                    ")\n  fails " + properties_text(n.properties);
  if (!n.locus.empty()) msg += "\n  where: " + n.locus;
  if (!n.inputs.empty()) msg += "\n  " + n.inputs;
  msg += "\n  saved: " + n.corpus_path + "\n  reproduce: " + n.repro + "\n";
  console_.message(msg);
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
      // Same signature: the same file.
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
