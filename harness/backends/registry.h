// The one backend registry: every backend name mlafuzz accepts resolves here.
//   built-ins      oracle, oracle-loop, cpu-simt, cpu-mma, cuda-simt, cuda-mma, cuda-mma-h64,
//                  triton-simt, triton-mma (python: kernels shipped in kernels/triton)
//   plugins        "plugin:/path/libk.so" or "plugin:<declared name>" (plugin_backend.h)
//   mutants        "<base>~<mutant>": cpu-mma~<mutant> (host models), cuda-mma~<mutant> (CUDA),
//                  in builds with MLAFUZZ_MUTANTS (mla/mutants.h lists them);
//                  triton-mma~<mutant> (kernels/triton/triton_mma.py MUTANTS, every build)
// A backend then says what it is itself (Backend::is_reference, simt_partner, on_device,
// needs_worker); nothing above this layer recognises a backend by its name.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"

namespace mlafuzz {

// A resolved backend name: what it is before anything is constructed.
struct BackendSpec {
  std::string name;
  std::string summary;
  // Foreign code (plugins): loading it may already crash, so campaigns, `run` and `repro`
  // construct it only inside a worker process (unless asked to keep it in process).
  bool foreign = false;
  std::function<std::unique_ptr<Backend>()> make;
  // Runs its code in a child process of its own (python: backends): constructed in this
  // process, never put behind another worker (faults come back as RunStatus::kFault).
  bool isolates_itself = false;
};

// Every built-in backend (oracle, oracle-loop, cpu-simt, cpu-mma, cuda-simt, cuda-mma,
// cuda-mma-h64, triton-simt, triton-mma), available or not, in a stable order.
const std::vector<BackendSpec>& builtin_backends();

// Resolves any backend name without constructing it (a plugin's library is found, not loaded).
// Throws std::runtime_error naming the unknown backend or mutant and listing the known ones.
BackendSpec resolve_backend(const std::string& name);

// resolve_backend(name).make().
std::unique_ptr<Backend> make_backend(const std::string& name);

// Splits "a,b,c" and resolves every name; "all" or "available" expands to every available
// built-in backend. Throws std::runtime_error for an empty list or an unknown name.
std::vector<std::string> parse_backend_list(const std::string& list);

// `name` with its file made absolute (against the working directory), so that it names the same
// backend from any directory: "plugin:./libk.so" -> "plugin:/abs/libk.so",
// "python:dir/k.py:decode" -> "python:/abs/dir/k.py:decode". Names without a file path (built-ins,
// plugin:<declared name>, python:package.module:func) come back unchanged.
std::string absolute_backend_name(const std::string& name);

// Names of the planted-bug variants this build can make ("cpu-mma~...", and "cuda-mma~..." in
// CUDA builds when `gpu`); empty without MLAFUZZ_MUTANTS.
std::vector<std::string> mutant_backend_names(bool gpu = false);

// The planted bugs a python: kernel declares (its module's MUTANTS dict, in declaration order:
// name -> description), for `backend` = "python:<file or module>:<func>" or a shipped alias
// ("triton-mma", "triton-simt"). Each is the backend `backend + "~" + name`. Starts the kernel's
// worker once to ask. Throws std::runtime_error when `backend` is not a python: kernel (the
// built-in catalogue is mla/mutants.h), already names a mutant, or cannot be loaded.
std::vector<std::pair<std::string, std::string>> declared_python_mutants(
    const std::string& backend);

}  // namespace mlafuzz
