// The campaign's findings, one per bug: failures are grouped by the signature of their canonical
// minimal case (backend | failure kind | cause set; properties/triage.h), never by the property
// or the random shape that found them.
//
// A raw failure is first classed by a cheap pre-key (property | backend | shape class of the
// failing case as generated). The first failure of a class has a record from the moment it is
// seen: saved to the corpus at once with the case as found, rewritten as each step of its
// triage (shrink, canonical walk) is accepted, and announced when the triage ends with its group
// (one corpus entry per group, named by its signature, listing the raw classes it folds). Later
// failures of the class only count in that group. Whatever stops the campaign, every failure
// seen is a finding: settle_in_flight() makes the records of triages still running findings as
// they stand. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "harness/campaign/plan.h"
#include "harness/campaign/progress.h"
#include "properties/corpus.h"
#include "properties/evaluate.h"
#include "properties/shrink.h"

namespace mlafuzz::campaign {

class FindingStore {
 public:
  // `stopping` says why the campaign is stopping ("the time budget ended"), empty while it runs:
  // shrinks stop at their next step once it says something.
  FindingStore(const CampaignOptions& opts, const BackendPool& pool,
               const std::vector<std::string>& properties, Console& console,
               std::function<std::string()> stopping)
      : opts_(opts),
        pool_(pool),
        properties_(properties),
        console_(console),
        stopping_(std::move(stopping)) {}

  // A failed outcome of case `index`, evaluated on `tb` (whose workers reported `faults`). A
  // failed run that met a worker fault is a "fault" failure, whichever run of the case it was.
  void add(const PropertyOutcome& o, const Case& c, uint64_t index, const Faults& faults,
           ThreadBackends& tb);
  // Makes the records of the shrinks still running findings as they stand (the case so far,
  // the note saying that `cause` ended the shrink); their threads change nothing afterwards.
  void settle_in_flight(const std::string& cause);
  // Rewrites the corpus entries whose count grew since they were saved.
  void save_final_counts();
  // The findings of an earlier run of this campaign (--resume): findings again, each with the
  // case of its corpus entry; later failures of the class it was first seen in count under it.
  // `first_case` regenerates a finding's first case (Finding::case_index) to name that class.
  void restore(const std::vector<Finding>& earlier,
               const std::function<Case(uint64_t index)>& first_case);

  // The findings and the records of the shrinks still running, merged by signature; sorted by
  // signature.
  std::vector<Finding> records() const;
  int64_t size() const;

 private:
  struct Entry {
    Finding finding;
    Case minimal;
    int64_t saved_count = 0;  // the count in the corpus entry
  };
  // A failure class before shrinking: property | backend | shape class of the failing case.
  struct PreClass {
    bool shrinking = true;  // false: settled, counted under `signature`
    Entry record;           // while shrinking: the first failure's record, the case so far
    std::string signature;
    int64_t pending = 0;  // failures seen while shrinking
  };
  struct Shrunk {
    Case minimal;
    bool shrunk = false;
    PropertyOutcome outcome;  // of the minimal case (a fault: its last message)
    std::string note;         // Finding::shrink_note
    // A triage that ended: the group's kind, causes, signature, properties, locus and inputs
    // (the other fields unused); otherwise those of the case as it stands.
    bool triaged = false;
    Finding group;
    int evaluations = 0;  // of the shrink, the walk and the locus
  };
  struct ShrinkProbe;
  class ShrinkRun;  // one shrink: its probe, hooks and limits

  // A new record for the first failure of `pre_key`, saved at once; false when the class is
  // known (the failure is counted).
  bool claim(const std::string& pre_key, Finding first, const Case& c);
  Shrunk shrink(const PropertyOutcome& failure, const Case& c, ThreadBackends& tb,
                const std::string& pre_key);
  // The note of a shrink that stopped (empty at a fixed point).
  std::string stop_note(ShrinkStop stop, int evaluations, int hangs, const std::string& pre_key);
  // Whether a case still makes `failure.backend` fault, through a fresh worker of it; null when
  // the fault does not reproduce alone.
  std::function<bool(const Case&)> fault_predicate(const PropertyOutcome& failure, const Case& c,
                                                   ThreadBackends& tb, ShrinkProbe& probe);
  // An accepted shrink step: the record of `pre_key` now holds case `k` failing as `o`.
  void step(const std::string& pre_key, const Case& k, const PropertyOutcome& o);
  // The end of a shrink: the record of `pre_key` becomes (or counts under) a finding.
  void finish_shrink(const std::string& pre_key, const Shrunk& s);
  // Needs mu_: a shrinking class becomes a finding with `e` (saved, announced) or counts under
  // the finding of its signature.
  // `evaluations`: of the triage, for the announcement.
  void settle(PreClass& pc, Entry e, int evaluations);
  // Needs mu_: writes `e` to the corpus; the file it replaces (another name: another signature
  // or case) is removed unless another record uses it.
  void save(Entry& e);
  bool file_in_use(const std::string& path) const;  // needs mu_

  const CampaignOptions& opts_;
  const BackendPool& pool_;
  const std::vector<std::string>& properties_;
  Console& console_;
  std::function<std::string()> stopping_;
  mutable std::mutex mu_;  // guards the maps and the corpus files they name
  std::map<std::string, PreClass> pre_;
  std::map<std::string, Entry> findings_;  // by signature
};

}  // namespace mlafuzz::campaign
