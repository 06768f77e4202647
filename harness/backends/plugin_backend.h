// Bring-your-own-kernel plugins: a shared library implementing the C ABI of
// include/mlafuzz/plugin.h, wrapped as a Backend.
//
// Loading checks everything before the plugin's kernel is ever called (file exists, dlopen,
// required symbols, ABI version, the info it declares) and throws PluginError with a message
// naming the plugin and what is wrong, e.g.
//   plugin /x/libk.so: missing symbol mlafuzz_plugin_run
//   plugin /x/libk.so: ABI version 3, mlafuzz supports 1 and 2
// After loading, the backend never throws: a nonzero return of the plugin becomes a kError
// result carrying the plugin's message. Crashes and hangs cannot be caught in-process: every
// plugin backend reports on_device() so that `mlafuzz fuzz` runs it in an isolated worker.
#pragma once

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "core/backend.h"
#include "mlafuzz/plugin.h"

namespace mlafuzz {

// The backend-name prefix that selects a plugin: "plugin:/path/libmykernel.so".
inline constexpr const char* kPluginPrefix = "plugin:";

class PluginError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a plugin declares about itself (mlafuzz plugin-info prints it).
struct PluginDescription {
  std::string path;         // as given
  std::string name;         // info.name; the backend (traits.name) is called "plugin:<name>"
  std::string description;  // info.description
  int abi_version = 0;
  bool has_supports = false;  // exports mlafuzz_plugin_supports
  bool has_envelope = false;  // exports mlafuzz_plugin_envelope (ABI version 2 on)
  // The backend's traits: the declared precision, tolerances (kCustom only), runs_on as
  // on_device, ABI version 2's inexact_invariants and extra_pipeline (a version-1 plugin
  // declares none: all exact, joint) and the envelope it accepts (a version-1 plugin's narrowed
  // to one query token and no extra cache, beyond_version_1); needs_worker is always set.
  BackendTraits traits;
};

// Loads the plugin at `path` and wraps it. Throws PluginError (see above). A device plugin in
// a build without CUDA loads (so plugin-info works) but is unavailable: "device plugins need a
// CUDA build".
std::unique_ptr<Backend> load_plugin_backend(const std::string& path);

// Loads the plugin and returns what it declares, with the availability its backend reports
// (a device plugin's: the device's). Throws PluginError.
PluginDescription describe_plugin(const std::string& path);

// Path of the plugin loaded in this process under backend name "plugin:<name>", or "" if none.
std::string loaded_plugin_path(const std::string& backend_name);

// What follows "plugin:" in a backend name -> the library to load. A path (anything with a '/',
// or an existing file) is returned as is. A declared name, as reports and corpus entries carry
// it ("plugin:cpu-fp32-example"), resolves to the plugin of that name loaded earlier in this
// process, else to the first library declaring that name in MLAFUZZ_PLUGIN_PATH (a ':' list of
// folders, whose *.so files are tried, and files). Throws PluginError saying what was searched.
std::string resolve_plugin(const std::string& path_or_name);

// The call a plugin receives for `p` (pointers and strides from `p`; memory tells where they
// live). Shared by the plugin backend and tests.
// The call a plugin of ABI version `abi_version` receives for `p` (pointers and strides from `p`;
// memory tells where they live): a version-1 plugin gets struct_size
// MLAFUZZ_DECODE_CALL_V1_SIZE and abi_version 1. Shared by the plugin backend and tests.
MlafuzzDecodeCall make_plugin_call(const mla::DecodeParams& p, MlafuzzRunsOn memory, void* stream,
                                   int abi_version = MLAFUZZ_PLUGIN_ABI_VERSION);

// Why a version-1 plugin cannot be given case `m` (s_q > 1, an extra cache: not expressible in
// version 1), or nullopt. The case is then "not applicable" to it with that reason.
std::optional<std::string> beyond_version_1(const MaterializedCase& m);

// The checked C++ form of a plugin's MlafuzzEnvelope (0 masks mean "all"); throws PluginError
// naming `who` and the field for a malformed one.
Envelope envelope_from_c(const MlafuzzEnvelope& c, const std::string& who);

}  // namespace mlafuzz
