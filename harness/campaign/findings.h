// The campaign's findings, one per signature (property | backend | shape class of the shrunk
// case). The first failure of a class is shrunk, saved to the corpus and announced; later
// failures of the class only count. Thread-safe.
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
  // A failure class before shrinking: property | backend | shape class of the failing case.
  struct PreClass {
    int state = 0;  // 0 new, 1 shrinking, 2 done
    std::string signature;
    int64_t pending = 0;  // failures seen while shrinking
  };
  struct Entry {
    Finding finding;
    Case minimal;
    int64_t saved_count = 0;  // the count in the corpus entry
  };
  struct Shrunk {
    Case minimal;
    bool shrunk = false;
    PropertyOutcome outcome;  // of the minimal case (a fault: its last message)
  };

  bool claim(const std::string& pre_key);  // false: the class is known, the failure counted
  Shrunk shrink(const PropertyOutcome& failure, const Case& c, ThreadBackends& tb,
                const std::string& pre_key);
  struct FaultProbe;
  // Whether a case still makes `failure.backend` fault, through a fresh worker of it; null when
  // the fault does not reproduce alone.
  std::function<bool(const Case&)> fault_predicate(const PropertyOutcome& failure, const Case& c,
                                                   ThreadBackends& tb, FaultProbe& probe);
  void store(const std::string& pre_key, Finding f, const Case& minimal, uint64_t index);
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
