// What a backend says about itself, in one value: its name, precision pipeline, envelope,
// invariance claims, tolerances and where it runs. Every backend produces one (Backend::traits:
// a C++ backend states it in its constructor, a plugin from what it declares through
// include/mlafuzz/plugin.h, a python: kernel from its worker's INFO reply, a `mlafuzz worker`
// proxy from its worker's kInfo reply), and the consumers (the campaign plan, the worker
// protocol, list-backends, plugin-info) read that one value.
//
// JSON through backend_traits_fields() (core/json_fields.h): the `mlafuzz worker` INFO reply.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/envelope.h"

namespace mlafuzz {

// The precision pipeline a backend implements; selects the error bound (properties/tolerance.h).
enum class Precision {
  kFloat64,   // oracles: exact up to float64 rounding
  kSimtFp32,  // SPEC 4, SIMT: fp32 everywhere, bf16 store
  kMmaBf16,   // SPEC 4, MMA: bf16 q and K, fp32 accumulate, bf16 p for P*V, bf16 store
  kCustom,    // plugin with explicit abs/rel tolerances
};

const char* precision_name(Precision p);  // "float64", "simt-fp32", "mma-bf16", "custom"

// How a backend folds the extra cache into the result (docs/SPEC.md section 8; plugin.h,
// MlafuzzExtraPipeline): one online softmax over both lists (FlashMLA), or each list computed
// alone, stored in bf16 with its LSE and merged (SGLang's Triton path: two bf16 roundings). It
// selects the tolerance model's extra-cache bound (properties/tolerance.h).
enum class ExtraPipeline {
  kJoint = 0,
  kLseMerged = 1,
};

const char* extra_pipeline_name(ExtraPipeline e);  // "joint", "lse_merged"

struct Availability {
  bool available = true;
  std::string reason;  // why not, when unavailable
  friend bool operator==(const Availability&, const Availability&) = default;
};

struct BackendTraits {
  std::string name;  // the backend name a user types ("cpu-mma", "plugin:NAME", "python:F:G")
  Precision precision = Precision::kFloat64;
  Availability availability;
  // What the backend accepts (envelope.h): the generator draws inside the intersection of the
  // selected backends' envelopes; Backend::unsupported stays the final word.
  Envelope envelope;
  // Invariant bits (envelope.h, Invariant) the backend does NOT promise bit for bit: those
  // properties are checked within the tolerance bound instead. 0: every one exact.
  uint32_t inexact_invariants = 0;
  ExtraPipeline extra_pipeline = ExtraPipeline::kJoint;
  double abs_tol = 0, rel_tol = 0;  // explicit tolerances of kCustom backends
  // Runs on a GPU (the campaign isolates those in worker processes).
  bool on_device = false;
  // Must run in a worker process by default: device kernels (a fault poisons the CUDA context)
  // and foreign code (plugins, Python kernels: may crash or hang).
  bool needs_worker = false;
  // The float64 reference the others are checked against (the Eigen oracle): its own tolerance
  // is not checked, and bitwise invariants are off for it by design.
  bool is_reference = false;
  // The SIMT backend an MMA backend is compared with by `mma-vs-simt` ("cpu-simt" for cpu-mma
  // and its planted-bug variants, "cuda-simt" for cuda-mma*), or "" when it has none.
  std::string simt_partner;
  // Cuts a row's token tiles into splits merged by a combine (split-KV) and honours
  // MaterializedCase::split_override: the `split-agree` property reruns such a backend with
  // other split counts (false: not applicable).
  bool splits_kv = false;
  // Tokens per online-softmax tile of the backend's pipeline where it is not its precision's
  // default (properties/tolerance.cc, pipeline_for: 64 for kMmaBf16, 32 for kSimtFp32), or 0
  // for the default. The tolerance model counts the tiles (pipeline_of): cpu-mma-small and
  // cuda-mma-small fold 32-token tiles, and so does cuda-mma on a device that runs its small
  // configuration (sm_120).
  int32_t token_tile = 0;

  bool operator==(const BackendTraits&) const = default;
};

namespace fields {
template <class T>
struct Field;
}  // namespace fields

// The field table (core/json_fields.h, fields::Table<BackendTraits>; declared here without it,
// so that the CUDA sources including core/backend.h do not compile nlohmann/json.hpp):
// precision and extra_pipeline by name, the envelope as envelope_to_json writes it. Reading
// rejects unknown names and negative token tiles.
const std::vector<fields::Field<BackendTraits>>& backend_traits_fields();

}  // namespace mlafuzz
