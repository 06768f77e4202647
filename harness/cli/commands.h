// Subcommands of the mlafuzz executable. Each lives in its own file and registers itself here.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace mlafuzz::cli {

// Process exit codes, the same for every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;    // a property or comparison failed
inline constexpr int kExitBadInput = 2;  // bad usage or bad input

struct Command {
  CLI::App* app;
  std::function<int()> run;
};
using CommandTable = std::vector<Command>;

void register_run(CLI::App& app, CommandTable& table);            // run, list-backends
void register_repro(CLI::App& app, CommandTable& table);  // repro (properties/evaluate.h)
void register_list_backends(CLI::App& app, CommandTable& table);
void register_fuzz(CLI::App& app, CommandTable& table);    // campaigns (harness/campaign)
void register_report(CLI::App& app, CommandTable& table);  // report summary/merge/compare/html
void register_worker(CLI::App& app, CommandTable& table);  // internal: isolated backend worker
void register_plugin_info(CLI::App& app, CommandTable& table);  // plugin-info (plugins)
void register_mutants(CLI::App& app, CommandTable& table);  // mutation score (MLAFUZZ_MUTANTS)

}  // namespace mlafuzz::cli
