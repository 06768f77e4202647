// The Python worker's JSON replies (docs/WORKER_PROTOCOL.md, "Frames"), each read through one
// field table (core/json_fields.h): INFO (what a python: kernel declares, read into a
// PythonDescription), SUPPORTS (its supports() verdict) and RUN (how the call went).
//
// The replies are an external contract: the mlafuzz Python package that sends them may come from
// another install than this executable. Their keys and values are the package's (`fp32_simt`,
// `device`, `inexact` as a list of names), not BackendTraits' JSON. A reply without an optional
// field means what the field's default says (INFO: "accepts anything, every invariant exact,
// joint softmax, the precision's tile"); a field this mlafuzz does not know is ignored (fields
// are added within a protocol version); a field of the wrong type or an unknown value is an
// error naming it ("info.precision: unknown value 'fp16' (known: bf16_mma, fp32_simt, custom)").
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/json_fields.h"
#include "harness/backends/python_backend.h"

namespace mlafuzz {

// ---- INFO ----

struct PythonInfo {
  int protocol = 0;  // checked by the caller before the rest is read
  int64_t pid = 0;   // the worker's process id (not used)
  PythonDescription description;
};

// Keys: protocol, name, precision (required); description, abs_tol, rel_tol, device,
// has_supports, available, reason, pid, python, python_version, numpy, envelope (null: none
// declared), inexact, extra_pipeline, token_tile, extra_cache (true, false or null), mutants
// (null or {name: description}, in the reply's order).
const fields::Table<PythonInfo>& python_info_fields();

// Reads an INFO reply of backend `backend` ("python:..."), served by `interpreter` (the
// default of `python`). Throws fields::FieldError or std::invalid_argument naming the field
// ("info.<key>").
PythonInfo read_python_info(const fields::Json& reply, const std::string& backend,
                            const std::string& interpreter);

// ---- SUPPORTS ----

struct PythonSupportsReply {
  std::optional<std::string> reason;  // why the kernel does not take the call; none: it does
  std::string error;                  // supports() raised: its traceback (the call is taken)
};

// Keys: reason (required: a string or null), error (optional). Throws fields::FieldError naming
// the field ("supports.<key>").
PythonSupportsReply read_python_supports_reply(const fields::Json& reply);

// ---- RUN ----

struct PythonRunReply {
  enum class Status { kOk, kError, kFault };
  Status status = Status::kOk;  // "ok"; "error": the kernel raised; "fault": a CUDA error
  std::string message;          // the traceback or what faulted
  double seconds = 0;           // the kernel's own time, measured in the worker
};

// Keys: status (required: "ok", "error" or "fault"), message, seconds. Throws
// fields::FieldError naming the field ("run.<key>").
PythonRunReply read_python_run_reply(const fields::Json& reply);

}  // namespace mlafuzz
