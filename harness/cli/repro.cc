// `mlafuzz repro FILE`: replays one corpus entry (or a plain case file) through the properties.
//
// A finding (expect "fail") is evaluated for its own property on its own backend(s); the exit
// status is 1 while the failure persists and 0 once it is fixed. A fault finding (a worker that
// crashed, exited or hung in any run of the case) is evaluated for every property, in workers
// started for it, and persists while a worker faults. A regression entry or plain case
// (expect "pass") is evaluated for every property on every listed backend (default: every
// available one) and exits 0 only when all pass. --backends and --properties override both.
#include <algorithm>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/backend.h"
#include "harness/backends/registry.h"
#include "harness/campaign/isolation.h"
#include "harness/cli/commands.h"
#include "properties/corpus.h"
#include "properties/evaluate.h"

namespace mlafuzz::cli {
namespace {

struct ReproOptions {
  std::string file;
  std::string backends;
  std::string properties;
  IsolationFlags isolation;
};

std::vector<std::string> split_list(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

// Backends: the option, else the finding's (a|b for pairs), else every available one.
std::vector<std::string> repro_backend_names(const ReproOptions& opt, const CorpusEntry& e) {
  const bool finding = e.f.expect == "fail";
  if (!opt.backends.empty()) return parse_backend_list(opt.backends);
  if (finding && !e.f.backend_source.empty()) {
    return split_list(e.f.backend_source, ',');  // as given, files absolute: any directory
  }
  if (finding && !e.f.backend.empty()) return split_list(e.f.backend, '|');
  return parse_backend_list("available");
}

// Properties: the option, else every property a finding's group fails on its minimal case
// (version-1 entries: their one; "run" for "fault"), else none (every property).
std::vector<std::string> repro_properties(const ReproOptions& opt, const CorpusEntry& e) {
  if (!opt.properties.empty()) return split_list(opt.properties, ',');
  std::vector<std::string> props;
  if (e.f.expect == "fail" && !e.f.property.empty() && e.f.property != "fault") {
    for (const std::string& p :
         e.f.properties.empty() ? std::vector<std::string>{e.f.property} : e.f.properties) {
      const std::string name = p == "fault" ? std::string("run") : p;
      if (std::find(props.begin(), props.end(), name) == props.end()) props.push_back(name);
    }
  }
  return props;
}

// The entry's path, its finding as recorded (group, failing properties, locus, inputs, detail)
// and its case's shape.
void print_entry(const CorpusEntry& e) {
  std::cout << "entry " << e.path << "\n";
  if (!e.f.property.empty()) {
    std::cout << "finding: " << e.f.property << " on " << e.f.backend << " (expect " << e.f.expect
              << ", " << e.f.count << " raw failure(s), found " << e.f.found_at << " at commit "
              << e.f.commit << (e.f.gpu_name.empty() ? "" : " on " + e.f.gpu_name) << ")\n";
    if (!e.f.signature.empty() && !e.f.kind.empty()) {
      std::cout << "  group: " << e.f.signature << "\n";
      std::string failing;
      for (const auto& p : e.f.properties) failing += (failing.empty() ? "" : ", ") + p;
      if (!failing.empty()) std::cout << "  fails: " << failing << "\n";
      if (!e.f.locus.empty()) std::cout << "  where: " << e.f.locus << "\n";
      if (!e.f.inputs.empty()) std::cout << "  " << e.f.inputs << "\n";
    }
    if (!e.f.detail.empty()) std::cout << "  recorded: " << e.f.detail << "\n";
  }
  std::cout << "case: " << shape_class(e.c) << " (B=" << e.c.batch << " H=" << e.c.heads
            << " topk=" << e.c.topk << ")\n";
}

// The faults the isolated backends met, each printed; returns how many.
int print_faults(const std::vector<std::unique_ptr<Backend>>& owned) {
  int faults = 0;
  for (const auto& b : owned) {
    auto* iso = dynamic_cast<campaign::IsolatedBackend*>(b.get());
    if (!iso) continue;
    for (const auto& f : iso->take_faults()) {
      std::cout << "  fault: " << f.message << "\n";
      ++faults;
    }
  }
  return faults;
}

int run_repro(const ReproOptions& opt) {
  const CorpusEntry e = load_corpus_entry(opt.file);
  const bool finding = e.f.expect == "fail";
  std::vector<std::string> names = repro_backend_names(opt, e);
  const std::vector<std::string> props = repro_properties(opt, e);
  // A fault (crash, exit, hang) may come from any run of the case (a kernel may fault on the
  // fifth call, or on poisoned padding only): every property runs, as in the campaign. Backends
  // run isolated, so a fault is an outcome instead of the end of mlafuzz.
  const bool fault_finding = finding && e.f.property == "fault" && opt.properties.empty();
  const campaign::IsolationOptions iso = isolation_options(opt.isolation);
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Backend*> backends;
  for (const auto& n : names) {
    // Plugins run in a worker process: a crash or exit() in one is a fault outcome, exit 1.
    owned.push_back(campaign::make_isolated_backend(n, iso));
    backends.push_back(owned.back().get());
  }
  // mma-vs-simt needs the SIMT partner of every MMA backend listed.
  const bool pairs =
      props.empty() || std::find(props.begin(), props.end(), "mma-vs-simt") != props.end();
  for (size_t i = 0, listed = owned.size(); pairs && i < listed; ++i) {
    const std::string partner = owned[i]->traits().simt_partner;
    if (partner.empty() || std::find(names.begin(), names.end(), partner) != names.end()) continue;
    names.push_back(partner);
    owned.push_back(campaign::make_isolated_backend(partner, iso));
    backends.push_back(owned.back().get());
  }

  print_entry(e);
  const CaseEvaluation ev = evaluate_case(e.c, backends, props);
  int failed = 0;
  for (const auto& o : ev.outcomes) {
    if (o.applicable && !o.passed) ++failed;
    std::cout << "  " << format_outcome(o) << "\n";
  }
  std::vector<std::string> absolute_names;  // the command works from any directory
  for (const auto& n : names) absolute_names.push_back(absolute_backend_name(n));
  std::string cmd = repro_command(opt.file, join(absolute_names));
  if (!opt.isolation.case_timeout.empty()) cmd += " --case-timeout " + opt.isolation.case_timeout;
  if (fault_finding) {
    if (const int faults = print_faults(owned); faults > 0) {
      std::cout << faults << " fault(s) (the finding persists)\nreproduce: " << cmd << "\n";
      return kExitFailed;
    }
    std::cout << "fixed: no worker faulted (" << ev.outcomes.size() << " outcomes, " << ev.seconds
              << " s" << (failed ? ", " + std::to_string(failed) + " other failure(s) above" : "")
              << ")\n";
    return kExitOk;
  }
  if (failed > 0) {
    std::cout << failed << " propert" << (failed == 1 ? "y" : "ies") << " failed"
              << (finding ? " (the finding persists)" : "") << "\nreproduce: " << cmd << "\n";
    return kExitFailed;
  }
  const auto applicable = std::find_if(ev.outcomes.begin(), ev.outcomes.end(),
                                       [](const PropertyOutcome& o) { return o.applicable; });
  if (!ev.outcomes.empty() && applicable == ev.outcomes.end()) {
    // Nothing ran: not a pass, not a failure. Say so rather than "fixed".
    std::cout << "not tested: no property applies to this case on these backends ("
              << ev.outcomes.front().detail << ")\n";
    return kExitOk;
  }
  std::cout << (finding ? "fixed: the recorded failure no longer occurs" : "all properties pass")
            << " (" << ev.outcomes.size() << " outcomes, " << ev.seconds << " s)\n";
  return kExitOk;
}

}  // namespace

void register_repro(CLI::App& app, CommandTable& table) {
  auto opt = std::make_shared<ReproOptions>();
  CLI::App* sub = app.add_subcommand(
      "repro",
      "Replay a corpus entry: exit 1 while its failure persists (or, for a regression entry or a "
      "plain case, while any property fails), 0 once fixed");
  sub->add_option("file", opt->file, "corpus entry or case file (.json)")->required();
  sub->add_option("--backends", opt->backends,
                  "comma-separated backends (default: the finding's, else every available one; "
                  "cpu-mma~<mutant> names the planted-bug variants)");
  sub->add_option(
      "--properties", opt->properties,
      "comma-separated properties (default: the finding's, else all): " + join(all_properties()));
  add_isolation_flags(sub, opt->isolation);
  table.push_back({sub, [opt] { return run_repro(*opt); }});
}

}  // namespace mlafuzz::cli
