// Kernels written in Python (numpy, PyTorch, Triton, CuPy) as backends: "python:FILE.py:FUNC"
// or "python:package.module:FUNC", a function decorated with @mlafuzz.kernel (python/mlafuzz).
//
// Every python: backend runs in its own worker process, a Python interpreter running
// `python -m mlafuzz._worker` (interpreter: --python PATH, else MLAFUZZ_PYTHON, else python3 on
// PATH), spoken to through ipc_channel.h (framed JSON requests over pipes, the case's buffers in
// shared memory; docs/WORKER_PROTOCOL.md). Creating the backend starts the worker and checks
// the kernel (interpreter, module, function, decorator) and throws PythonBackendError naming
// what is wrong and how to fix it. After that the backend never throws: an exception in the
// kernel is a kError result carrying the traceback; a crash, os._exit, a hang past the timeout
// or a CUDA error is a kFault result, and the next call starts a fresh worker.
//
// on_device() is true, as for plugins: `mlafuzz fuzz` also runs it inside its isolated worker,
// so that its --case-timeout and fault findings apply unchanged.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"

namespace mlafuzz {

// The backend-name prefix that selects a Python kernel.
inline constexpr const char* kPythonPrefix = "python:";

class PythonBackendError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What the kernel declares (mlafuzz plugin-info and list-backends print it).
struct PythonDescription {
  std::string name;           // @mlafuzz.kernel(name=...)
  std::string description;    // description= or the docstring's first line
  std::string device;         // "cpu" or "cuda"
  bool has_supports = false;  // the module defines supports(call)
  std::string python;         // the interpreter, and versions it reports
  std::string python_version, numpy_version;
  bool has_envelope = false;  // @mlafuzz.kernel(envelope=...) given
  // mlafuzz.Envelope(extra_cache=True): the kernel takes an extra cache (nothing changes in
  // what is generated; a kernel that raised on one is not told to declare extra_cache=False).
  bool declares_extra_cache = false;
  // The module's planted bugs (its MUTANTS dict, in declaration order): name -> description.
  // Backend "python:<file>:<func>~<name>" runs the module's mutant_<name> (docs/mutation.md;
  // docs/WORKER_PROTOCOL.md).
  std::vector<std::pair<std::string, std::string>> mutants;
  // The backend's traits: name "python:..." as given; precision, abs_tol and rel_tol (kCustom
  // only), envelope, inexact_invariants (inexact=[...]), extra_pipeline and token_tile as
  // declared; available and why not (device="cuda" without torch or GPU); on_device for
  // device="cuda"; needs_worker always.
  BackendTraits traits;
};

// The scalar fields of the call a python: kernel gets for case m (the RUN request's scalars,
// docs/WORKER_PROTOCOL.md) as a JSON object's text: `mlafuzz run --dump` writes them into
// params.json ("call") so that mlafuzz.replay builds the same call in another process.
std::string python_call_fields(const MaterializedCase& m);

// "python:..." -> a backend backed by a fresh worker. Throws PythonBackendError.
std::unique_ptr<Backend> make_python_backend(const std::string& backend_name);

// Starts a worker, asks what the kernel declares, stops it. Throws PythonBackendError.
PythonDescription describe_python_backend(const std::string& backend_name);

// How many device="cuda" Python workers of this process share one GPU (a campaign runs one per
// evaluation thread and Python backend, all on the same device). Workers started afterwards get
// it as MLAFUZZ_DEVICE_WORKERS, unless the environment already sets it, and keep their device
// caches to their share of the GPU's memory (python/mlafuzz/worker/device_cache.py:
// device_cache_share).
// 0, the default, sends nothing: a worker then counts itself alone.
void set_python_device_workers(int n);

// Where the Python workers started afterwards write their stderr (a kernel's prints, warnings
// and tracebacks): a campaign sets its report folder's workers.log, so that they do not
// interleave with its progress lines. "" , the default: the worker inherits mlafuzz's stderr.
void set_python_worker_log(const std::string& path);

// The interpreter python: backends run: MLAFUZZ_PYTHON (set by --python), else python3, looked
// up on PATH. Throws PythonBackendError when it is not an executable file.
std::string python_interpreter();

// A python: kernel shipped with mlafuzz under a short name (triton-simt, triton-mma,
// triton-mma~<mutant>, whose `func` is "decode~<mutant>", resolved by the worker as any
// python: mutant): `file` is looked up in shipped_python_kernel_dir(). Never throws unless
// `strict`: where the file, the interpreter, torch, triton or a GPU is missing the backend is
// unavailable and says why (list-backends prints it); with `strict` (planted-bug variants, named
// explicitly) a kernel that cannot be loaded throws PythonBackendError as a python: name does.
std::unique_ptr<Backend> make_shipped_python_backend(const std::string& alias,
                                                     const std::string& file,
                                                     const std::string& func, Precision declared,
                                                     const std::string& simt_partner,
                                                     bool strict = false);

// The folder holding the shipped kernels of `kind` ("triton"), or "" when none has them:
// MLAFUZZ_TRITON_DIR, else <executable>/../share/mlafuzz/triton (an installed tree), else this
// source tree's kernels/triton. Never the working directory.
std::string shipped_python_kernel_dir(const std::string& kind, const std::string& file);

// Seconds a call may take before the worker counts as hung: MLAFUZZ_PYTHON_TIMEOUT (`mlafuzz
// fuzz` sets it a little above --case-timeout, so the campaign's own timeout fires first),
// else 60.
double python_call_timeout();

}  // namespace mlafuzz
