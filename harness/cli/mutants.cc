// `mlafuzz mutants`: the mutation score. Runs a campaign per planted bug and reports, per
// mutant, killed or survived, the property that killed it, cases and seconds to the first
// failure and the shrunk case's size. Exit 1 if any mutant survives (or a kill is suspect).
// Without --backends, the catalogue of mla/mutants.h on cpu-mma or cuda-mma; with
// --backends, the planted bugs python: kernels declare (their MUTANTS), each in a worker.
#include <fmt/format.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/case.h"
#include "core/fileio.h"
#include "harness/backends/registry.h"
#include "harness/cli/commands.h"
#include "harness/mutation/mutation.h"

namespace mlafuzz::cli {
namespace {

struct MutantsArgs {
  double budget = 60;
  uint64_t max_cases = 100000;
  int shrink_evals = MutationOptions{}.shrink.max_evaluations;
  double shrink = MutationOptions{}.shrink.max_seconds;
  std::string kind = "cpu";
  uint64_t seed = 1;
  std::string json;
  std::vector<std::string> only;
  std::string save_dir;
  double case_timeout = 60;
  std::vector<std::string> backends;
  bool kind_given = false;
};

// The mutants a run will score, for the banner: "9 mutants of cpu-mma".
std::string what_is_scored(const MutationOptions& o) {
  if (o.python_backends.empty()) {
    return fmt::format("{} mutants of {}-mma",
                       o.only.empty() ? all_mutants().size() : o.only.size(),
                       o.kind == MutantKind::kCpu ? "cpu" : "cuda");
  }
  std::string list;
  for (const std::string& b : o.python_backends) list += (list.empty() ? "" : ", ") + b;
  return fmt::format("{} declared mutants of {} (each in a worker process)",
                     o.only_names.empty() ? "the" : "the chosen", list);
}

// The options of a run from the command line's, each checked (std::invalid_argument naming the
// option).
MutationOptions mutation_options(const MutantsArgs& a) {
  MutationOptions o;
  if (a.kind != "cpu" && a.kind != "gpu") {
    throw std::invalid_argument("--backend-kind must be cpu or gpu, not '" + a.kind + "'");
  }
  o.kind = a.kind == "cpu" ? MutantKind::kCpu : MutantKind::kGpu;
  o.seed = a.seed;
  o.budget_seconds = a.budget;
  o.max_cases = a.max_cases;
  if (a.shrink_evals < 0) throw std::invalid_argument("--shrink-evals must be >= 0");
  o.shrink = {a.shrink_evals, a.shrink};
  o.save_dir = a.save_dir;
  o.case_timeout_seconds = a.case_timeout;
  for (const std::string& b : a.backends) {
    if (b.empty()) continue;
    if (b == "all" || b == "available") {
      throw std::invalid_argument("--backends " + b +
                                  ": name the python: kernels whose planted bugs to score");
    }
    (void)resolve_backend(b);  // an unknown name: exit 2 listing the known ones
    o.python_backends.push_back(b);
  }
  if (!a.backends.empty() && o.python_backends.empty()) {
    throw std::invalid_argument("--backends: empty list");
  }
  if (!o.python_backends.empty()) {
    if (a.kind_given) {
      throw std::invalid_argument(
          "--backend-kind/--gpu choose the built-in catalogue; --backends scores the planted bugs "
          "of the kernels it names: give one or the other");
    }
    if (!(a.case_timeout > 0)) throw std::invalid_argument("--case-timeout must be > 0");
    // The python: worker's own hang timeout (python_backend.h reads it).
    ::setenv("MLAFUZZ_PYTHON_TIMEOUT", std::to_string(a.case_timeout).c_str(), 1);
    o.only_names = a.only;  // checked against what each kernel declares when it is loaded
  }
  for (const std::string& name : o.python_backends.empty() ? a.only : std::vector<std::string>{}) {
    const auto m = mutant_from_name(name);
    if (!m) {
      std::string known;
      for (const mla::Mutant k : all_mutants()) known += std::string(" ") + mla::mutant_name(k);
      throw std::invalid_argument("unknown mutant '" + name + "'; known:" + known);
    }
    o.only.push_back(*m);
  }
  return o;
}

// One mutant's line as its run ends: skipped, survived, or killed (by what, shrunk to what).
void print_mutant_result(const MutantResult& r) {
  if (r.status == MutantStatus::kSkipped) {
    std::cout << fmt::format("  {:<24} skipped: {}\n", r.name, r.skip_reason);
  } else if (r.status == MutantStatus::kSurvived) {
    std::cout << fmt::format("  {:<24} SURVIVED {} cases in {:.1f} s\n", r.name, r.cases,
                             r.seconds);
  } else {
    std::cout << fmt::format(
        "  {:<24} killed by {} after {} cases ({:.2f} s); shrunk to "
        "B={} H={} topk={} valid={}{}{}\n",
        r.name, r.first_property, r.cases, r.seconds, r.batch, r.heads, r.topk, r.valid_tokens,
        r.property == r.first_property ? "" : ", which fails " + r.property,
        r.control_passed ? "" : " [SUSPECT: the control fails too]");
  }
  std::cout.flush();
}

// Under the table: each kill's detail, planted bug and shrunk case, and the failures the
// unmutated backend shares.
void print_mutant_details(const std::vector<MutantResult>& results) {
  for (const MutantResult& r : results) {
    if (r.status == MutantStatus::kKilled) {
      std::cout << "\n" << r.name << ": " << r.detail << '\n';
      if (!r.description.empty()) std::cout << "  planted bug: " << r.description << '\n';
      if (!r.saved_path.empty()) std::cout << "  shrunk case: " << r.saved_path << '\n';
    }
    if (r.control_failures > 0) {
      std::cout << "\n"
                << r.name << ": " << r.control_failures
                << " failure(s) the unmutated backend shares (not kills; look at the base "
                   "kernel or the tolerance model), first: "
                << r.control_failure_example << '\n';
    }
  }
}

int mutants_command(const MutantsArgs& a) {
  const MutationOptions o = mutation_options(a);
  std::cout << fmt::format(
      "mlafuzz mutants: {}, seed {}, budget {:g} s / {} cases per mutant, "
      "shrink {} evaluations (at most {:g} s)\n",
      what_is_scored(o), o.seed, o.budget_seconds, o.max_cases, o.shrink.max_evaluations,
      o.shrink.max_seconds);
  std::cout.flush();
  const auto results = run_mutants(o, print_mutant_result);
  std::cout << '\n' << format_mutant_table(results);
  print_mutant_details(results);
  if (!a.json.empty()) {
    write_file_atomic(a.json, json_to_text(mutants_to_json(o, results)));
    std::cout << "\nreport: " << a.json << '\n';
  }
  const MutationSummary s = summarize(results);
  return s.survived == 0 && s.suspect == 0 ? kExitOk : kExitFailed;
}

}  // namespace

void register_mutants(CLI::App& app, CommandTable& table) {
  auto a = std::make_shared<MutantsArgs>();
  auto* cmd = app.add_subcommand(
      "mutants",
      "Mutation score: run a campaign against each planted bug of the MMA kernel (or its host "
      "model) and report which properties kill it; exit 1 if any survives");
  cmd->add_option("--budget", a->budget, "seconds per mutant to the first failure")
      ->capture_default_str();
  cmd->add_option("--max-cases", a->max_cases, "cases per mutant to the first failure")
      ->capture_default_str();
  cmd->add_option("--shrink-evals", a->shrink_evals,
                  "evaluations of shrinking per killed mutant: where a shrink stops, the same on "
                  "any machine")
      ->capture_default_str();
  cmd->add_option("--shrink-budget", a->shrink,
                  "seconds of shrinking per killed mutant at most (a safety net; a shrink it "
                  "stops depends on the machine's speed)")
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--backend-kind",
         [a](const std::string& k) {
           a->kind = k;
           a->kind_given = true;
         },
         "cpu: variants of the cpu-mma host model, in process; gpu: variants of the "
         "CUDA MMA kernel, each in an isolated worker process (needs a CUDA build); default cpu")
      ->type_name("KIND");
  cmd->add_flag_callback(
      "--gpu",
      [a] {
        a->kind = "gpu";
        a->kind_given = true;
      },
      "same as --backend-kind gpu");
  cmd->add_option("--backends", a->backends,
                  "comma-separated python: kernels (python:FILE.py:FUNC, python:module:FUNC) or "
                  "triton-mma/triton-simt: score the planted bugs each declares in its module's "
                  "MUTANTS (backend <kernel>~<name>), each in a worker process, instead of the "
                  "built-in catalogue")
      ->delimiter(',');
  cmd->add_option("--seed", a->seed, "generator seed")->capture_default_str();
  cmd->add_option("--only", a->only,
                  "comma-separated mutant names (default: all; with --backends, names the "
                  "kernels declare)")
      ->delimiter(',');
  cmd->add_option("--json", a->json, "write the versioned JSON report here");
  cmd->add_option("--save-dir", a->save_dir, "save each shrunk case there as <backend>.json");
  cmd->add_option("--case-timeout", a->case_timeout,
                  "gpu and --backends: seconds per case before the worker counts as hung (a "
                  "fault: a kill)")
      ->capture_default_str();
  table.push_back({cmd, [a] { return mutants_command(*a); }});
}

}  // namespace mlafuzz::cli
