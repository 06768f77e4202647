// `mlafuzz plugin-info PATH`: loads a plugin and prints what it declares, without running it.
#include <iostream>
#include <string>

#include "harness/backends/plugin_backend.h"
#include "harness/cli/commands.h"

namespace mlafuzz::cli {
namespace {

int plugin_info(const std::string& path) {
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
            << "  available:   " << (a.available ? "yes" : "no: " + a.reason) << '\n'
            << "use it as: mlafuzz fuzz --backends plugin:" << d.path << '\n';
  return kExitOk;
}

}  // namespace

void register_plugin_info(CLI::App& app, CommandTable& table) {
  auto* cmd = app.add_subcommand(
      "plugin-info", "Load a kernel plugin (include/mlafuzz/plugin.h) and print what it declares");
  auto path = std::make_shared<std::string>();
  cmd->add_option("path", *path, "the plugin's shared library")->required();
  table.push_back({cmd, [path] { return plugin_info(*path); }});
}

}  // namespace mlafuzz::cli
