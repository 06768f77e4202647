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

// The precision line, and the tolerances of a custom one.
void print_pipeline(const BackendTraits& t) {
  std::cout << "  precision:   " << precision_name(t.precision) << '\n';
  if (t.precision == Precision::kCustom) {
    std::cout << "  tolerances:  abs " << t.abs_tol << ", rel " << t.rel_tol << '\n';
  }
}

// Which invariants it promises bit for bit, and how it folds in the extra cache.
void print_claims(const BackendTraits& t) {
  std::cout << "  exact:       "
            << (t.inexact_invariants == 0 ? std::string("every invariant (bit for bit)")
                                          : "all but " + describe_invariants(t.inexact_invariants) +
                                                " (checked within the tolerance bound)")
            << '\n'
            << "  extra cache: " << extra_pipeline_text(t.extra_pipeline) << '\n';
}

std::string available_text(const Availability& a) {
  return a.available ? "yes" : "no: " + a.reason;
}

// `mlafuzz plugin-info python:FILE.py:FUNC`: what a Python kernel declares.
int python_info(const std::string& name) {
  const PythonDescription d = describe_python_backend(name);  // PythonBackendError: exit 2
  const BackendTraits& t = d.traits;
  std::cout << "python kernel " << name << '\n'
            << "  backend:     " << t.name << '\n'
            << "  name:        " << d.name << '\n'
            << "  description: " << d.description << '\n'
            << "  device:      " << d.device << '\n';
  print_pipeline(t);
  std::cout << "  supports():  "
            << (d.has_supports ? "defined (cases outside it are reported as not applicable)"
                               : "not defined (every case is run)")
            << '\n';
  print_claims(t);
  std::cout << "  token tile:  "
            << (t.token_tile > 0 ? std::to_string(t.token_tile) + " tokens (declared)"
                                 : std::string("the precision's default"))
            << " (the tolerance bound counts one softmax rescale per tile)\n";
  print_envelope(d.has_envelope ? "declared" : "", t.envelope);
  std::cout << "  interpreter: " << d.python << " (Python " << d.python_version << ", numpy "
            << d.numpy_version << ")\n"
            << "  available:   " << available_text(t.availability) << '\n'
            << "use it as: " << fuzz_command(t.name) << '\n';
  return kExitOk;
}

int plugin_info(const std::string& path) {
  if (path.rfind(kPythonPrefix, 0) == 0) return python_info(path);
  const PluginDescription d = describe_plugin(path);  // PluginError: exit 2 via main
  const BackendTraits& t = d.traits;
  std::cout << "plugin " << d.path << '\n'
            << "  backend:     " << t.name << '\n'
            << "  description: " << d.description << '\n'
            << "  ABI version: " << d.abi_version << '\n'
            << "  runs on:     " << (t.on_device ? "device (CUDA pointers and stream)" : "host")
            << '\n';
  print_pipeline(t);
  std::cout << "  supports():  "
            << (d.has_supports ? "exported (cases outside it are reported as not applicable)"
                               : "not exported (every case is run)")
            << '\n';
  print_claims(t);
  print_envelope(d.has_envelope ? "exported" : "", t.envelope);
  std::cout << "  available:   " << available_text(t.availability) << '\n'
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
