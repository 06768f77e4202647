// mlafuzz: differential testing and fuzzing of sparse MLA decode kernels.
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

#include "core/case.h"
#include "core/settings.h"
#include "harness/cli/commands.h"

int main(int argc, char** argv) {
  using namespace mlafuzz::cli;
  CLI::App app{
      "mlafuzz: differential testing and fuzzing of sparse-decode MLA kernels (FP8 paged KV "
      "cache, top-k indices) against a float64 oracle"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "mlafuzz 0.1.0");
  // python: backends (harness/backends/python_backend.h): the interpreter, given before or after
  // the subcommand.
  app.fallthrough();
  app.add_option_function<std::string>(
      "--python", [](const std::string& path) { ::setenv("MLAFUZZ_PYTHON", path.c_str(), 1); },
      "Python interpreter for python: backends (default: MLAFUZZ_PYTHON, else python3 on PATH)");
  app.add_flag_callback(
      "--help-env",
      [] {
        std::cout << mlafuzz::settings::help_env_text();
        throw CLI::Success();
      },
      "Print every MLAFUZZ_* environment variable (name, type, default, what it does) and exit");
  CommandTable table;
  register_run(app, table);
  register_repro(app, table);
  register_list_backends(app, table);
  register_fuzz(app, table);
  register_report(app, table);
  register_nights(app, table);
  register_worker(app, table);
  register_plugin_info(app, table);
#if MLAFUZZ_HAVE_MUTATION
  register_mutants(app, table);
#else
  // Listed, and answered before parsing: otherwise its options would be reported as unexpected
  // arguments and a -DMLAFUZZ_MUTANTS=OFF build would answer "A subcommand is required".
  app.add_subcommand("mutants",
                     "Mutation score: not in this build (configured with -DMLAFUZZ_MUTANTS=OFF)");
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--python") {
      ++i;  // its value
    } else if (arg == "mutants") {
      std::cerr << "mlafuzz: mutants is not in this build: it was configured with "
                   "-DMLAFUZZ_MUTANTS=OFF; reconfigure with -DMLAFUZZ_MUTANTS=ON (the default) "
                   "to score planted bugs\n";
      return kExitBadInput;
    } else if (arg.empty() || arg[0] != '-') {
      break;  // another subcommand
    }
  }
#endif

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitBadInput;
  }
  try {
    for (const auto& cmd : table) {
      if (cmd.app->parsed()) return cmd.run();
    }
  } catch (const mlafuzz::CaseError& e) {
    std::cerr << "mlafuzz: invalid case: " << e.what() << '\n';
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "mlafuzz: " << e.what() << '\n';
    return kExitBadInput;
  }
  return kExitBadInput;
}
