#include "harness/campaign/findings.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>

#include "harness/backends/ipc_channel.h"
#include "properties/property_table.h"
#include "properties/triage.h"

namespace mlafuzz::campaign {
namespace {

// Shrink evaluations that may end in a hang before a shrink gives up with the case so far: each
// costs a --case-timeout, and a failure whose every step hangs would spend minutes on them.
constexpr int kMaxShrinkHangs = 3;

// The note of a record whose shrink has not ended: what a report written meanwhile, or a corpus
// entry left by a campaign killed meanwhile, says.
constexpr const char* kShrinkingNote = "being shrunk (the case as far as shrinking got)";

// The cause set of a finding whose triage did not end.
constexpr const char* kUntriagedCause = "causes unknown (not shrunk to its canonical case)";

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
  f.raw = first.raw;
  return f;
}

// The raw class of `raw` in the group's list (added, with count 0, when new).
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

// The group of a finding from its triage: kind, causes, signature, properties, locus, inputs.
Finding group_of(const Triage& t) {
  Finding g;
  g.kind = failure_kind_name(t.kind);
  g.causes = t.causes;
  g.signature = t.signature;
  for (const auto& o : t.failures) g.properties.push_back(o.property);
  g.locus = t.locus.outputs;
  if (!t.locus.entries.empty()) g.locus += (g.locus.empty() ? "" : "; ") + t.locus.entries;
  g.inputs = t.locus.inputs;
  return g;
}

// A record whose triage did not end (cut short, shrinking off): its case is not canonical, so
// its features say nothing about the bug. It is grouped by backend and failure kind alone, so
// that one bug whose triages keep being cut short (every step hangs) is one finding, not one
// per shape.
void untriaged(Finding& f) {
  f.causes.clear();
  f.signature = f.backend + " | " + f.kind + " | " + kUntriagedCause;
}

void take_group(Finding& f, const Finding& g) {
  f.kind = g.kind;
  f.causes = g.causes;
  f.signature = g.signature;
  f.properties = g.properties;
  f.locus = g.locus;
  f.inputs = g.inputs;
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
  // Whether the fault predicate also takes a failure without a fault, and the first such
  // failure of its last evaluation (when that one did not fault).
  bool any_failure = false;
  std::optional<PropertyOutcome> wrong;
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
  RawFailure raw;
  raw.property = failure.property;
  raw.shape_class = first.shape_class;
  raw.count = 1;
  raw.seed = opts_.seed;
  raw.case_index = index;
  // A fault is the "run" property's failure.
  raw.repro = replay_command(opts_.seed, index, opts_.profile, o.backend,
                             failure.property == "fault" ? "run" : failure.property);
  first.raw = {raw};
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
      Finding& f = findings_.at(pc.signature).finding;
      ++f.count;
      if (!first.raw.empty()) ++raw_class(f, first.raw.front()).count;
    }
    return false;
  }
  pc.record = {std::move(first), c, 0};
  save(pc.record);
  return true;
}

// One shrink of a failure of the class `pre_key`: what it learns as it goes (the probe), the halt
// test asked before each evaluation, and the hooks and limits that its triages and walks share.
class FindingStore::ShrinkRun {
 public:
  ShrinkRun(FindingStore& store, ThreadBackends& tb, const std::string& pre_key,
            const PropertyOutcome& failure)
      : store_(store),
        tb_(tb),
        pre_key_(pre_key),
        limits_{store.opts_.shrink_evals, store.opts_.shrink_time_s} {
    probe_.last = failure;
    hooks_.on_step = [this](const Case& k) { store_.step(pre_key_, k, probe_.last); };
    hooks_.stop = [this] { return halt(); };
  }
  ShrinkRun(const ShrinkRun&) = delete;
  ShrinkRun& operator=(const ShrinkRun&) = delete;

  // A wrong result: the triage of the case (shrink, walk, causes).
  void shrink_wrong_result(const PropertyOutcome& failure, const Case& c, Shrunk& r) {
    tb_.take_faults();
    const Triage t = triage_failure(c, failure, tb_.ptrs, triage_options(limits_));
    r.minimal = t.minimal;
    r.shrunk = t.steps > 0;
    r.evaluations = t.evaluations;
    r.note = store_.stop_note(t.stopped_by, t.evaluations, probe_.hangs, pre_key_);
    // A triage cut short (the campaign stopping, hangs) keeps the case so far, grouped as it
    // stands: its failure is the one it was found with.
    if (!take_group(t, r) && r.note.empty()) {
      r.note = store_.stop_note(ShrinkStop::kStopped, t.evaluations, probe_.hangs, pre_key_);
    }
  }

  // A fault: the case shrunk through a fresh worker of the backend, keeping it failing with a
  // fault or without; then triaged as the failure the minimal case shows when it does not
  // fault, else grouped as a fault with the entries it needs.
  void shrink_fault(const PropertyOutcome& failure, const Case& c, Shrunk& r) {
    const std::function<bool(const Case&)> still_fails =
        store_.fault_predicate(failure, c, tb_, probe_);
    if (!still_fails) {
      r.note = "the fault did not happen again on a fresh worker: the case as found";
      return;
    }
    hooks_.stop = [this] { return probe_.hangs >= kMaxShrinkHangs || !store_.stopping_().empty(); };
    // The walk keeps the backend failing, with a fault or without: a wrong read faults or not by
    // where it lands (an entry far past the cache), and the canonical case decides the kind.
    probe_.any_failure = true;
    const ShrinkResult sr =
        shrink_canonical(c, still_fails, still_fails, limits_, store_.pool_.envelope(), hooks_);
    r.minimal = sr.minimal;
    r.shrunk = sr.steps > 0;
    r.outcome = probe_.last;
    r.evaluations = sr.evaluations;
    r.note = store_.stop_note(sr.stopped_by, sr.evaluations, probe_.hangs, pre_key_);
    if (sr.budget_exhausted()) return;
    probe_.wrong.reset();
    ++r.evaluations;
    if (still_fails(sr.minimal) && probe_.wrong) {
      triage_wrong_minimal(sr.minimal, r);
    } else {
      group_fault(sr, still_fails, r);
    }
  }

 private:
  // Asked before each evaluation: the hangs met since the last one counted.
  bool halt() {
    for (const auto& [backend, message] : tb_.take_faults()) {
      if (ipc::is_hang(message)) {
        ++probe_.hangs;
        break;
      }
    }
    return probe_.hangs >= kMaxShrinkHangs || !store_.stopping_().empty();
  }

  TriageOptions triage_options(const ShrinkLimits& l) {
    TriageOptions to;
    to.properties = store_.properties_;
    to.limits = l;
    to.envelope = store_.pool_.envelope();
    to.stopping = [this] { return halt(); };
    to.hooks = hooks_;
    return to;
  }

  // The group of a triage that ended (not cut short by the campaign stopping or hangs): false
  // when it was cut short.
  bool take_group(const Triage& t, Shrunk& r) {
    if (t.stopped_by == ShrinkStop::kStopped || halt()) return false;
    r.outcome = t.primary;
    r.triaged = true;
    r.group = group_of(t);
    return true;
  }

  // No fault on the minimal case: triaged as the failure it shows there, with what is left of
  // the evaluations.
  void triage_wrong_minimal(const Case& minimal, Shrunk& r) {
    tb_.take_faults();
    const ShrinkLimits left{limits_.max_evaluations - r.evaluations, limits_.max_seconds};
    const Triage t = triage_failure(minimal, *probe_.wrong, tb_.ptrs, triage_options(left));
    r.minimal = t.minimal;
    r.evaluations += t.evaluations;
    take_group(t, r);
  }

  // The group of the case the walk ended on, and the entries the fault needs.
  void group_fault(const ShrinkResult& sr, const std::function<bool(const Case&)>& still_fails,
                   Shrunk& r) {
    Finding g = make_finding(probe_.last, sr.minimal, store_.opts_.seed, 0);
    g.properties = {"run"};
    std::vector<int32_t> tokens;
    const int left = limits_.max_evaluations - sr.evaluations;
    if (left > 0) {
      g.locus =
          needed_entries(sr.minimal, still_fails, std::min(left, 16), &r.evaluations, &tokens);
    }
    g.inputs = inline_inputs(sr.minimal, tokens);
    r.triaged = true;
    r.group = std::move(g);
  }

  FindingStore& store_;
  ThreadBackends& tb_;
  const std::string& pre_key_;
  const ShrinkLimits limits_;
  ShrinkProbe probe_;
  ShrinkHooks hooks_;
};

FindingStore::Shrunk FindingStore::shrink(const PropertyOutcome& failure, const Case& c,
                                          ThreadBackends& tb, const std::string& pre_key) {
  Shrunk r;
  r.minimal = c;
  r.outcome = failure;
  if (!(opts_.shrink_time_s > 0) || opts_.shrink_evals <= 0) {
    r.note = "shrinking is off (--shrink-time 0 or --shrink-evals 0)";
    return r;
  }
  if (const std::string why = stopping_(); !why.empty()) {
    r.note = why + " before shrinking";
    return r;
  }
  ShrinkRun run(*this, tb, pre_key, failure);
  try {
    if (failure.property == "fault") {
      run.shrink_fault(failure, c, r);
    } else {
      run.shrink_wrong_result(failure, c, r);
    }
  } catch (const std::exception& e) {
    console_.message("\nmlafuzz: shrinking " + pre_key + " stopped: " + e.what() + "\n");
    r.note = std::string("shrinking stopped: ") + e.what();
  }
  return r;
}

std::string FindingStore::stop_note(ShrinkStop stop, int evaluations, int hangs,
                                    const std::string& pre_key) {
  switch (stop) {
    case ShrinkStop::kFixedPoint:
      return "";
    case ShrinkStop::kEvaluations:
      return "shrinking stopped after --shrink-evals " + std::to_string(opts_.shrink_evals) +
             " evaluations";
    case ShrinkStop::kSeconds:
      console_.message("\nmlafuzz: shrinking " + pre_key + " hit --shrink-time after " +
                       std::to_string(evaluations) +
                       " evaluations (a result that depends on this machine's speed)\n");
      return "shrinking stopped after --shrink-time " + fmt_duration(opts_.shrink_time_s);
    case ShrinkStop::kStopped:
      if (hangs >= kMaxShrinkHangs) {
        return "shrinking stopped after " + std::to_string(hangs) +
               " evaluations that hung (each costs --case-timeout)";
      }
      return stopping_() + " while shrinking";
  }
  return "";
}

std::function<bool(const Case&)> FindingStore::fault_predicate(const PropertyOutcome& failure,
                                                               const Case& c, ThreadBackends& tb,
                                                               ShrinkProbe& probe) {
  probe.worker = pool_.fresh_worker(failure.backend, tb);
  IsolatedBackend* fp = probe.worker.get();
  // Partners stay in the list (mma-vs-simt), the faulting backend is the fresh worker.
  std::vector<Backend*> ptrs = tb.ptrs;
  for (auto*& p : ptrs) {
    if (p->traits().name == failure.backend) p = fp;
  }
  const std::string backend = failure.backend;
  std::function<bool(const Case&)> still_fails = [this, fp, ptrs, backend, &probe](const Case& k) {
    fp->take_faults();
    CaseEvaluation ev;
    try {
      ev = evaluate_case(k, ptrs, properties_);
    } catch (const std::exception&) {
      return false;
    }
    auto f = fp->take_faults();
    if (f.empty()) {
      if (!probe.any_failure) return false;
      for (const PropertyOutcome& o : ev.outcomes) {
        if (o.applicable && !o.passed && o.backend == backend) {
          probe.wrong = o;
          return true;
        }
      }
      return false;
    }
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
  if (s.triaged) {
    take_group(e.finding, s.group);
  } else {
    untriaged(e.finding);
  }
  if (e.finding.properties.empty()) e.finding.properties = {e.finding.property};
  e.finding.shrink_note = s.note;
  e.minimal = s.minimal;
  settle(pc, std::move(e), s.evaluations);
}

void FindingStore::settle_in_flight(const std::string& cause) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, pc] : pre_) {
    if (!pc.shrinking) continue;
    Entry e = pc.record;
    e.finding.shrink_note = cause + " while shrinking";
    untriaged(e.finding);
    if (e.finding.properties.empty()) e.finding.properties = {e.finding.property};
    settle(pc, std::move(e), 0);
  }
}

void FindingStore::settle(PreClass& pc, Entry e, int evaluations) {
  pc.shrinking = false;
  pc.signature = e.finding.signature;
  const int64_t seen = 1 + pc.pending;
  pc.pending = 0;
  for (RawFailure& raw : e.finding.raw) raw.count = seen;
  const std::string record_file = pc.record.finding.corpus_path;
  auto it = findings_.find(e.finding.signature);
  if (it != findings_.end()) {
    Finding& f = it->second.finding;
    f.count += seen;
    for (const RawFailure& raw : e.finding.raw) raw_class(f, raw).count += seen;
    add_properties(f.properties, e.finding.properties);
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
  std::string msg = "mlafuzz: new finding " + n.signature + " (case " +
                    std::to_string(n.case_index) + how +
                    (evaluations > 0 ? " in " + std::to_string(evaluations) + " evaluations" : "") +
                    ")\n  fails " + properties_text(n.properties) + ": " + n.summary;
  if (!n.locus.empty()) msg += "\n  where: " + n.locus;
  if (!n.inputs.empty()) msg += "\n  " + n.inputs;
  msg += "\n  saved: " + n.corpus_path + "\n  reproduce: " + n.repro + "\n";
  console_.message(msg);
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
    for (const RawFailure& raw : f.raw) {
      PreClass& rc = pre_[raw.property + "|" + f.backend + "|" + raw.shape_class];
      rc.shrinking = false;
      rc.signature = f.signature;
    }
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
