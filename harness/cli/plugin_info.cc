// `mlafuzz plugin-info PATH`: loads a plugin and prints what it declares, without running it.
#include <iostream>
#include <sstream>
#include <string>

#include "core/command.h"
#include "harness/backends/plugin_backend.h"
#include "harness/backends/python_backend.h"
#include "harness/backends/registry.h"
#include "harness/cli/commands.h"

namespace mlafuzz::cli {
namespace {

// The envelope, one constrained field a line ("accepts anything" when none).
void print_envelope(const std::string& how, const Envelope& e) {
  const std::string text = e.describe();
  if (how.empty() || text.empty()) {
    std::cout << "  envelope:    " << (how.empty() ? "none declared" : "declared")
              << " (accepts every case the generator draws)\n";
    return;
  }
  std::cout << "  envelope:    " << how << " (cases are generated inside it):\n";
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) std::cout << "    " << line << '\n';
}

// How the kernel folds the extra cache in, and which bound that selects.
std::string extra_pipeline_text(ExtraPipeline e) {
  return e == ExtraPipeline::kLseMerged
             ? "lse_merged (each list alone, stored bf16, merged by LSE: the LSE-merged bound)"
             : "joint (one online softmax over both lists)";
}

// The campaign command for `backend`, as pasted from any directory: this mlafuzz as it runs now
// and the backend's file made absolute.
std::string fuzz_command(const std::string& backend) {
  return command_to_run_again() + " fuzz --backends " + shell_word(absolute_backend_name(backend));
}

// `mlafuzz plugin-info python:FILE.py:FUNC`: what a Python kernel declares.
int python_info(const std::string& name) {
  const PythonDescription d = describe_python_backend(name);  // PythonBackendError: exit 2
  std::cout << "python kernel " << name << '\n'
            << "  backend:     " << d.backend << '\n'
            << "  name:        " << d.name << '\n'
            << "  description: " << d.description << '\n'
            << "  device:      " << d.device << '\n'
            << "  precision:   " << precision_name(d.precision) << '\n';
  if (d.precision == Precision::kCustom) {
    std::cout << "  tolerances:  abs " << d.abs_tol << ", rel " << d.rel_tol << '\n';
  }
  std::cout << "  supports():  "
            << (d.has_supports ? "defined (cases outside it are reported as not applicable)"
                               : "not defined (every case is run)")
            << '\n'
            << "  exact:       "
            << (d.inexact_invariants == 0 ? std::string("every invariant (bit for bit)")
                                          : "all but " + describe_invariants(d.inexact_invariants) +
                                                " (checked within the tolerance bound)")
            << '\n'
            << "  extra cache: " << extra_pipeline_text(d.extra_pipeline) << '\n'
            << "  token tile:  "
            << (d.token_tile > 0 ? std::to_string(d.token_tile) + " tokens (declared)"
                                 : std::string("the precision's default"))
            << " (the tolerance bound counts one softmax rescale per tile)\n";
  print_envelope(d.has_envelope ? "declared" : "", d.envelope);
  std::cout << "  interpreter: " << d.python << " (Python " << d.python_version << ", numpy "
            << d.numpy_version << ")\n"
            << "  available:   " << (d.available ? "yes" : "no: " + d.reason) << '\n'
            << "use it as: " << fuzz_command(d.backend) << '\n';
  return kExitOk;
}

int plugin_info(const std::string& path) {
  if (path.rfind(kPythonPrefix, 0) == 0) return python_info(path);
  const PluginDescription d = describe_plugin(path);  // PluginError: exit 2 via main
  const auto backend = load_plugin_backend(path);
  const Availability a = backend->availability();
  std::cout << "plugin " << d.path << '\n'
            << "  backend:     " << backend->name() << '\n'
            << "  description: " << d.description << '\n'
            << "  ABI version: " << d.abi_version << '\n'
            << "  runs on:     "
            << (d.runs_on_device ? "device (CUDA pointers and stream)" : "host") << '\n'
            << "  precision:   " << precision_name(d.precision) << '\n';
  if (d.precision == Precision::kCustom) {
    std::cout << "  tolerances:  abs " << d.abs_tol << ", rel " << d.rel_tol << '\n';
  }
  std::cout << "  supports():  "
            << (d.has_supports ? "exported (cases outside it are reported as not applicable)"
                               : "not exported (every case is run)")
            << '\n'
            << "  exact:       "
            << (d.inexact_invariants == 0 ? std::string("every invariant (bit for bit)")
                                          : "all but " + describe_invariants(d.inexact_invariants) +
                                                " (checked within the tolerance bound)")
            << '\n'
            << "  extra cache: "
            << extra_pipeline_text(d.extra_pipeline == MLAFUZZ_EXTRA_LSE_MERGED
                                       ? ExtraPipeline::kLseMerged
                                       : ExtraPipeline::kJoint)
            << '\n';
  print_envelope(d.has_envelope ? "exported" : "", d.envelope);
  std::cout << "  available:   " << (a.available ? "yes" : "no: " + a.reason) << '\n'
            << "use it as: " << fuzz_command("plugin:" + d.path) << '\n';
  return kExitOk;
}

}  // namespace

void register_plugin_info(CLI::App& app, CommandTable& table) {
  auto* cmd = app.add_subcommand(
      "plugin-info", "Load a kernel plugin (include/mlafuzz/plugin.h) and print what it declares");
  auto path = std::make_shared<std::string>();
  cmd->add_option("path", *path, "the plugin's shared library, or python:FILE.py:FUNC")->required();
  table.push_back({cmd, [path] { return plugin_info(*path); }});
}

}  // namespace mlafuzz::cli
