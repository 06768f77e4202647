// The campaign's findings, one per bug: failures are grouped by the signature of their canonical
// minimal case (backend | failure kind | cause set; properties/triage.h), never by the property
// or the random shape that found them.
//
// A raw failure is first classed by a cheap pre-key (property | backend | shape class of the
// failing case as generated): the first failure of a class is triaged (shrunk, walked to the
// canonical case, located) and stored in its group, later failures of the class only count in
// that group. A group is saved to the corpus once (one entry per group, named by its signature),
// announced, and lists the raw classes it folds. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "harness/campaign/plan.h"
#include "harness/campaign/progress.h"
#include "properties/evaluate.h"

namespace mlafuzz::campaign {

class FindingStore {
 public:
  FindingStore(const CampaignOptions& opts, const BackendPool& pool,
               const std::vector<std::string>& properties, Console& console,
               std::function<bool()> stopping)
      : opts_(opts),
        pool_(pool),
        properties_(properties),
        console_(console),
        stopping_(std::move(stopping)) {}

  // A failed outcome of case `index`, evaluated on `tb` (whose workers reported `faults`).
  void add(const PropertyOutcome& o, const Case& c, uint64_t index, const Faults& faults,
           ThreadBackends& tb);
  // Rewrites the corpus entries whose count grew since they were saved.
  void save_final_counts();

  std::vector<Finding> records() const;  // sorted by signature
  int64_t size() const;

 private:
  // A raw failure class (the pre-key): property | backend | shape class of the failing case.
  struct PreClass {
    int state = 0;  // 0 new, 1 triaging, 2 done
    std::string signature;
    int64_t pending = 0;  // failures seen while triaging
  };
  struct Entry {
    Finding finding;
    Case minimal;
    int64_t saved_count = 0;  // the count in the corpus entry
  };
  struct Triaged {
    Finding finding;  // the group's record (no corpus path yet)
    Case minimal;
    int evaluations = 0;  // of the shrink, the walk and the locus
  };

  bool claim(const std::string& pre_key);  // false: the class is known, the failure counted
  Triaged triage(const PropertyOutcome& failure, const Case& c, uint64_t index, ThreadBackends& tb,
                 const std::string& pre_key);
  // A fault's group: shrunk and walked while the backend still faults through a fresh worker.
  Triaged triage_fault(const PropertyOutcome& failure, const Case& c, uint64_t index,
                       ThreadBackends& tb, const std::string& pre_key);
  struct FaultProbe;
  // Whether a case still makes `failure.backend` fault, through a fresh worker of it; null when
  // the fault does not reproduce alone.
  std::function<bool(const Case&)> fault_predicate(const PropertyOutcome& failure, const Case& c,
                                                   ThreadBackends& tb, FaultProbe& probe);
  void store(const std::string& pre_key, RawFailure raw, Triaged t, uint64_t index);
  void save_new(Entry& e, uint64_t index);

  const CampaignOptions& opts_;
  const BackendPool& pool_;
  const std::vector<std::string>& properties_;
  Console& console_;
  std::function<bool()> stopping_;
  mutable std::mutex mu_;  // guards the maps
  std::map<std::string, PreClass> pre_;
  std::map<std::string, Entry> findings_;  // by signature
};

}  // namespace mlafuzz::campaign
