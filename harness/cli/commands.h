// Subcommands of the mlafuzz executable. Each lives in its own file and registers itself here.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "harness/campaign/isolation.h"

namespace mlafuzz::cli {

// Process exit codes, the same for every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;    // a property or comparison failed
inline constexpr int kExitBadInput = 2;  // bad usage or bad input

// Where `run` and `repro` run plugins (harness/campaign/isolation.h): in a worker process unless
// --in-process; --case-timeout bounds each call of a plugin or python: kernel.
struct IsolationFlags {
  bool in_process = false;
  std::string case_timeout;  // "": MLAFUZZ_PYTHON_TIMEOUT seconds, else 60 s
};
void add_isolation_flags(CLI::App* sub, IsolationFlags& f);
// The options the flags say (sets MLAFUZZ_PYTHON_TIMEOUT for python: kernels). Throws
// std::invalid_argument for a bad duration.
campaign::IsolationOptions isolation_options(const IsolationFlags& f);

struct Command {
  CLI::App* app;
  std::function<int()> run;
};
using CommandTable = std::vector<Command>;

void register_run(CLI::App& app, CommandTable& table);    // run, list-backends
void register_repro(CLI::App& app, CommandTable& table);  // repro (properties/corpus.h)
void register_list_backends(CLI::App& app, CommandTable& table);
void register_fuzz(CLI::App& app, CommandTable& table);         // campaigns (harness/campaign)
void register_report(CLI::App& app, CommandTable& table);       // report summary/merge/compare/html
void register_nights(CLI::App& app, CommandTable& table);       // finding states across nights
void register_worker(CLI::App& app, CommandTable& table);       // internal: isolated backend worker
void register_plugin_info(CLI::App& app, CommandTable& table);  // plugin-info (plugins)
void register_mutants(CLI::App& app, CommandTable& table);      // mutation score (MLAFUZZ_MUTANTS)

}  // namespace mlafuzz::cli
