// Plugin loading and the plugin Backend (see plugin_backend.h and include/mlafuzz/plugin.h).
#include "harness/backends/plugin_backend.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "core/envelope.h"
#include "core/settings.h"

#if MLAFUZZ_HAVE_CUDA
#include "kernels/cuda/device_run.h"
#endif

namespace mlafuzz {
namespace {

// Room for a plugin's error or reason message; the plugin truncates to this.
constexpr size_t kMessageLen = 1024;
// Returned to the CUDA staging when the plugin's run fails: cudaErrorUnknown, not a sticky
// fault code, so the result is an error with the plugin's message, not a device fault.
constexpr int kPluginFailed = 999;

// The ABI promises a plugin one call at a time. Backends of the same library may live on several
// evaluation threads (a campaign without worker isolation): every call into any plugin takes
// this lock.
std::mutex& plugin_call_mutex() {
  static std::mutex mu;
  return mu;
}

// Copies a fixed-size char field that the plugin may have left unterminated.
std::string bounded(const char* s, size_t n) { return std::string(s, strnlen(s, n)); }

// The name becomes part of a backend name and of corpus file names: keep it to a safe alphabet.
bool valid_name(const std::string& name) {
  if (name.empty()) return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// Process-wide map "plugin:<name>" -> path of every plugin loaded so far.
std::map<std::string, std::string>& loaded_plugins(std::unique_lock<std::mutex>& lock) {
  static std::mutex mu;
  static std::map<std::string, std::string> paths;
  lock = std::unique_lock<std::mutex>(mu);
  return paths;
}

// A dlopen'ed plugin with its entry points resolved and its declaration checked.
struct LoadedPlugin {
  PluginDescription desc;
  MlafuzzPluginSupportsFn supports = nullptr;
  MlafuzzPluginRunFn run = nullptr;
  // The library stays mapped for the life of the process (RTLD_NODELETE): a device plugin's
  // static CUDA runtime registers exit handlers that must not outlive its code.
};

// Every version this mlafuzz loads: "1 and 2", "1 to 3".
std::string supported_versions() {
  constexpr int lo = MLAFUZZ_PLUGIN_ABI_VERSION_MIN, hi = MLAFUZZ_PLUGIN_ABI_VERSION;
  if (lo == hi) return std::to_string(hi);
  return std::to_string(lo) + (hi == lo + 1 ? " and " : " to ") + std::to_string(hi);
}

// One MlafuzzIntSet -> IntSet, checked.
IntSet set_from_c(const MlafuzzIntSet& s, const std::string& who, const char* field) {
  const std::string where = who + ": envelope." + field;
  if (s.count < 0 || s.count > MLAFUZZ_ENVELOPE_LIST_MAX) {
    throw PluginError(where + ".count " + std::to_string(s.count) + " not in [0, " +
                      std::to_string(MLAFUZZ_ENVELOPE_LIST_MAX) + "]");
  }
  if (s.min < 0 || s.max < 0 || s.multiple_of < 0) {
    throw PluginError(where + ": min, max and multiple_of must be >= 0");
  }
  if (s.min != 0 && s.max != 0 && s.min > s.max) {
    throw PluginError(where + ": min " + std::to_string(s.min) + " > max " + std::to_string(s.max));
  }
  IntSet r;
  for (int i = 0; i < s.count; ++i) {
    if (s.values[i] < 0) throw PluginError(where + ".values: negative value");
    r.values.push_back(s.values[i]);
  }
  r.min = s.min;
  r.max = s.max;
  r.multiple_of = s.multiple_of;
  return r;
}

// A convention mask: bits inside `known`; 0 means `dflt`.
uint32_t mask_from_c(uint32_t m, uint32_t dflt, const std::string& who, const char* field,
                     uint32_t known = 0) {
  if ((m & ~(known != 0 ? known : dflt)) != 0) {
    throw PluginError(who + ": envelope." + field + " has unknown bits " + std::to_string(m));
  }
  return m == 0 ? dflt : m;
}

}  // namespace

Envelope envelope_from_c(const MlafuzzEnvelope& c, const std::string& who) {
  Envelope e;
  e.layouts = mask_from_c(c.layouts, kAllLayouts, who, "layouts");
  e.nope_dim = set_from_c(c.nope_dim, who, "nope_dim");
  e.rope_dim = set_from_c(c.rope_dim, who, "rope_dim");
  e.scale_tile = set_from_c(c.scale_tile, who, "scale_tile");
  e.page_size = set_from_c(c.page_size, who, "page_size");
  if (c.page_stride_multiple < 0) {
    throw PluginError(who + ": envelope.page_stride_multiple must be >= 0");
  }
  e.page_stride_multiple = c.page_stride_multiple;
  e.batch = set_from_c(c.batch, who, "batch");
  e.heads = set_from_c(c.heads, who, "heads");
  e.topk = set_from_c(c.topk, who, "topk");
  e.s_q = set_from_c(c.s_q, who, "s_q");
  e.extra_topk = set_from_c(c.extra_topk, who, "extra_topk");
  e.extra_page_size = set_from_c(c.extra_page_size, who, "extra_page_size");
  // 0: the two sign rules; out_of_range only when the plugin names it.
  e.invalid_index_rules = mask_from_c(c.invalid_index_rules, kBothValues, who,
                                      "invalid_index_rules", kAllInvalidIndexRules);
  e.empty_row_lses = mask_from_c(c.empty_row_lses, kBothValues, who, "empty_row_lses");
  e.sink_in_lse = mask_from_c(c.sink_in_lse, kBothValues, who, "sink_in_lse");
  // A plugin built before v32_scales leaves it 0 (zeroed by mlafuzz): both conventions.
  e.v32_scales = mask_from_c(c.v32_scales, kBothValues, who, "v32_scales");
  if ((c.refuses & ~kFeatureAll) != 0) {
    throw PluginError(who + ": envelope.refuses has unknown bits " + std::to_string(c.refuses));
  }
  e.refuses = c.refuses;
  return e;
}

namespace {

// The version-2 part of MlafuzzPluginInfo: invariance claims and the extra-cache pipeline.
void read_v2_info(const MlafuzzPluginInfo& info, const std::string& who, PluginDescription& d) {
  if ((info.inexact_invariants & ~kInvariantAll) != 0) {
    throw PluginError(who + ": unknown inexact_invariants bits " +
                      std::to_string(info.inexact_invariants) + " (known: MlafuzzInvariance)");
  }
  d.traits.inexact_invariants = info.inexact_invariants;
  if (info.extra_pipeline != MLAFUZZ_EXTRA_JOINT &&
      info.extra_pipeline != MLAFUZZ_EXTRA_LSE_MERGED) {
    throw PluginError(who + ": unknown extra_pipeline " + std::to_string(info.extra_pipeline) +
                      " (0 joint, 1 lse-merged)");
  }
  d.traits.extra_pipeline = info.extra_pipeline == MLAFUZZ_EXTRA_LSE_MERGED
                                ? ExtraPipeline::kLseMerged
                                : ExtraPipeline::kJoint;
}

// Checks that path names a regular file and dlopens it.
void* open_library(const std::string& path, const std::string& who) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    throw PluginError(who + ": cannot open: " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) throw PluginError(who + ": not a regular file");
  // A path without '/' would make dlopen search the library path: always name the file itself.
  const std::string open_path = path.find('/') == std::string::npos ? "./" + path : path;
  void* handle = dlopen(open_path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* e = dlerror();
    throw PluginError(who + ": cannot load: " + (e != nullptr ? e : "unknown dlopen error"));
  }
  return handle;
}

// The plugin's symbol `name`, or nullptr when it lacks an optional one.
void* find_symbol(void* handle, const std::string& who, const char* name, bool required) {
  dlerror();
  void* s = dlsym(handle, name);
  if (s == nullptr && required) throw PluginError(who + ": missing symbol " + name);
  return s;
}

// Calls the plugin's info function with the struct of its ABI version and checks the answer.
MlafuzzPluginInfo query_info(MlafuzzPluginInfoFn info_fn, int version, const std::string& who) {
  // A version-1 plugin gets the version-1 part of the struct, and says so in struct_size.
  MlafuzzPluginInfo info;
  std::memset(&info, 0, sizeof info);
  info.struct_size =
      version == 1 ? static_cast<uint32_t>(MLAFUZZ_PLUGIN_INFO_V1_SIZE) : sizeof info;
  const int rc = info_fn(&info);
  if (rc != 0) {
    throw PluginError(who + ": mlafuzz_plugin_info failed (returned " + std::to_string(rc) + ")");
  }
  if (info.abi_version != static_cast<uint32_t>(version)) {
    throw PluginError(who + ": info declares ABI version " + std::to_string(info.abi_version) +
                      " but mlafuzz_plugin_abi_version() returns " + std::to_string(version));
  }
  return info;
}

void read_runs_on(const MlafuzzPluginInfo& info, const std::string& who, PluginDescription& d) {
  switch (info.runs_on) {
    case MLAFUZZ_RUNS_ON_HOST:
      d.traits.on_device = false;
      break;
    case MLAFUZZ_RUNS_ON_DEVICE:
      d.traits.on_device = true;
      break;
    default:
      throw PluginError(who + ": unknown runs_on " + std::to_string(info.runs_on) +
                        " (0 host, 1 device)");
  }
}

// The precision pipeline the plugin declares, with its tolerances when custom.
void read_precision(const MlafuzzPluginInfo& info, const std::string& who, PluginDescription& d) {
  switch (info.precision) {
    case MLAFUZZ_PRECISION_FP32_SIMT:
      d.traits.precision = Precision::kSimtFp32;
      break;
    case MLAFUZZ_PRECISION_BF16_MMA:
      d.traits.precision = Precision::kMmaBf16;
      break;
    case MLAFUZZ_PRECISION_CUSTOM:
      d.traits.precision = Precision::kCustom;
      // NaN fails both comparisons, so this also rejects NaN tolerances.
      if (!(info.abs_tol >= 0) || !(info.rel_tol >= 0) || info.abs_tol + info.rel_tol <= 0) {
        throw PluginError(who +
                          ": custom precision needs abs_tol >= 0 and rel_tol >= 0, not both"
                          " 0 (got " +
                          std::to_string(info.abs_tol) + ", " + std::to_string(info.rel_tol) + ")");
      }
      d.traits.abs_tol = info.abs_tol;
      d.traits.rel_tol = info.rel_tol;
      break;
    default:
      throw PluginError(who + ": unknown precision " + std::to_string(info.precision) +
                        " (0 fp32-simt, 1 bf16-mma, 2 custom)");
  }
}

// Calls the plugin's optional envelope function (ABI version 2 on) and keeps its envelope.
void read_envelope(MlafuzzPluginEnvelopeFn env_fn, int version, const std::string& who,
                   PluginDescription& d) {
  MlafuzzEnvelope env;
  std::memset(&env, 0, sizeof env);
  env.struct_size = sizeof env;
  const int erc = env_fn(&env);
  if (erc != 0) {
    throw PluginError(who + ": mlafuzz_plugin_envelope failed (returned " + std::to_string(erc) +
                      ")");
  }
  if (env.abi_version != static_cast<uint32_t>(version)) {
    throw PluginError(who + ": envelope declares ABI version " + std::to_string(env.abi_version) +
                      ", the plugin " + std::to_string(version));
  }
  d.traits.envelope = envelope_from_c(env, who);
  d.has_envelope = true;
}

LoadedPlugin load(const std::string& path) {
  const std::string who = "plugin " + path;
  void* handle = open_library(path, who);
  auto symbol = [&](const char* name, bool required) {
    return find_symbol(handle, who, name, required);
  };
  const auto abi =
      reinterpret_cast<MlafuzzPluginAbiVersionFn>(symbol(MLAFUZZ_PLUGIN_SYMBOL_ABI_VERSION, true));
  const auto info_fn =
      reinterpret_cast<MlafuzzPluginInfoFn>(symbol(MLAFUZZ_PLUGIN_SYMBOL_INFO, true));
  LoadedPlugin p;
  p.run = reinterpret_cast<MlafuzzPluginRunFn>(symbol(MLAFUZZ_PLUGIN_SYMBOL_RUN, true));
  p.supports =
      reinterpret_cast<MlafuzzPluginSupportsFn>(symbol(MLAFUZZ_PLUGIN_SYMBOL_SUPPORTS, false));

  // The version is checked before any struct crosses the boundary: layouts may differ.
  const int version = abi();
  if (version < MLAFUZZ_PLUGIN_ABI_VERSION_MIN || version > MLAFUZZ_PLUGIN_ABI_VERSION) {
    throw PluginError(who + ": ABI version " + std::to_string(version) + ", mlafuzz supports " +
                      supported_versions());
  }
  const MlafuzzPluginInfo info = query_info(info_fn, version, who);

  PluginDescription& d = p.desc;
  d.path = path;
  d.abi_version = version;
  d.name = bounded(info.name, sizeof info.name);
  d.description = bounded(info.description, sizeof info.description);
  d.has_supports = p.supports != nullptr;
  if (!valid_name(d.name)) {
    throw PluginError(who + ": invalid name '" + d.name +
                      "' (use letters, digits, '.', '_' and '-')");
  }
  read_runs_on(info, who, d);
  read_precision(info, who, d);
  if (version >= 2) {
    read_v2_info(info, who, d);
    const auto env_fn =
        reinterpret_cast<MlafuzzPluginEnvelopeFn>(symbol(MLAFUZZ_PLUGIN_SYMBOL_ENVELOPE, false));
    if (env_fn != nullptr) read_envelope(env_fn, version, who, d);
  } else {
    // A version-1 plugin takes one query token per row and no extra cache (beyond_version_1),
    // so the generator gives it only such cases.
    d.traits.envelope.s_q = intersect(d.traits.envelope.s_q, IntSet{{1}, 0, 0, 0});
    d.traits.envelope.refuses |= kFeatureExtraCache | kFeatureExtraTopkLength;
  }
  d.traits.name = kPluginPrefix + d.name;
  // Foreign code that can crash or hang: isolated in a worker whether it runs on the host or on
  // the device.
  d.traits.needs_worker = true;
  {
    std::unique_lock<std::mutex> lock;
    loaded_plugins(lock)[d.traits.name] = path;
  }
  return p;
}

std::string message_or(const std::array<char, kMessageLen>& buf, const std::string& fallback) {
  const std::string s = bounded(buf.data(), buf.size());
  return s.empty() ? fallback : s;
}

// A device plugin is available where the device is.
Availability plugin_availability(const PluginDescription& d) {
  if (!d.traits.on_device) return {};
#if MLAFUZZ_HAVE_CUDA
  return cuda_detail::device_availability();
#else
  return {false, "device plugins need a CUDA build (this mlafuzz was built without nvcc)"};
#endif
}

// Described by what the plugin declares (PluginDescription::traits), its availability that of
// the device it runs on (plugin_availability).
class PluginBackend final : public TraitsBackend<Backend> {
 public:
  explicit PluginBackend(LoadedPlugin p) : TraitsBackend(p.desc.traits), p_(std::move(p)) {
    traits_.availability = plugin_availability(p_.desc);
  }

  std::optional<std::string> unsupported(const MaterializedCase& m) const override {
    if (p_.desc.abi_version < 2) {
      if (auto why = beyond_version_1(m)) return traits_.name + ": " + *why;
    }
    if (p_.supports == nullptr) return std::nullopt;
    // Sizes only: the pointers are null, as the ABI documents.
    mla::DecodeParams sizes = m.host_params();
    sizes.q = nullptr;
    sizes.kv_cache = nullptr;
    sizes.indices = nullptr;
    sizes.topk_length = nullptr;
    sizes.sink = nullptr;
    sizes.extra_kv_cache = nullptr;
    sizes.extra_indices = nullptr;
    sizes.extra_topk_length = nullptr;
    const MlafuzzDecodeCall call = make_plugin_call(
        sizes, p_.desc.traits.on_device ? MLAFUZZ_RUNS_ON_DEVICE : MLAFUZZ_RUNS_ON_HOST, nullptr,
        p_.desc.abi_version);
    std::array<char, kMessageLen> reason{};
    int supported = 0;
    {
      const std::lock_guard<std::mutex> lock(plugin_call_mutex());
      supported = p_.supports(&call, reason.data(), reason.size());
    }
    if (supported != 0) return std::nullopt;
    return traits_.name + ": " + message_or(reason, "unsupported (no reason given)");
  }

 protected:
  // A case that unsupported() accepted (run_batch asks it first).
  RunResult run_case(const MaterializedCase& m) override {
    return p_.desc.traits.on_device ? run_device(m) : run_host(m);
  }

 private:
  RunResult call_failed(int rc, const std::array<char, kMessageLen>& err) const {
    RunResult r;
    r.status = RunStatus::kError;
    r.message = traits_.name + ": mlafuzz_plugin_run returned " + std::to_string(rc) + ": " +
                message_or(err, "(no message)");
    return r;
  }

  RunResult run_host(const MaterializedCase& m) {
    OutputBuffers bufs(m);
    mla::DecodeParams p = m.host_params();
    bufs.attach(p);
    const MlafuzzDecodeCall call =
        make_plugin_call(p, MLAFUZZ_RUNS_ON_HOST, nullptr, p_.desc.abi_version);
    std::array<char, kMessageLen> err{};
    const std::lock_guard<std::mutex> lock(plugin_call_mutex());
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = p_.run(&call, err.data(), err.size());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rc != 0) return call_failed(rc, err);
    RunResult r = collect_outputs(m, bufs);
    r.seconds = seconds;
    return r;
  }

  RunResult run_device(const MaterializedCase& m) {
#if MLAFUZZ_HAVE_CUDA
    // The CUDA backends' staging (device copies of the inputs, canary-filled device outputs,
    // synchronize, sticky faults as kFault) around the plugin's entry point, on the default
    // stream. The plugin's own error message replaces the CUDA error name.
    std::string plugin_error;
    const auto staged = cuda_detail::make_kernel_backend(
        traits_.name, traits_.precision, "", [](const mla::DecodeParams&) { return std::nullopt; },
        [&](const mla::DecodeParams& p) {
          const MlafuzzDecodeCall call =
              make_plugin_call(p, MLAFUZZ_RUNS_ON_DEVICE, nullptr, p_.desc.abi_version);
          std::array<char, kMessageLen> err{};
          const int rc = p_.run(&call, err.data(), err.size());
          if (rc != 0) plugin_error = call_failed(rc, err).message;
          return rc == 0 ? 0 : kPluginFailed;
        });
    RunResult r;
    {
      RunOptions raw;  // the raw outputs, converted by this backend's run_batch
      raw.raw_outputs = true;
      const std::lock_guard<std::mutex> lock(plugin_call_mutex());
      r = staged->run(m, raw);
    }
    if (!plugin_error.empty()) {
      r.status = RunStatus::kError;
      r.message = plugin_error;
    }
    return r;
#else
    (void)m;
    RunResult r;
    r.status = RunStatus::kError;
    r.message =
        traits_.name + ": device plugins need a CUDA build (this mlafuzz was built without nvcc)";
    return r;
#endif
  }

  LoadedPlugin p_;
};

}  // namespace

std::optional<std::string> beyond_version_1(const MaterializedCase& m) {
  // Version 1 has one query token per row and no extra cache.
  if (m.s_q > 1) {
    return "s_q = " + std::to_string(m.s_q) +
           " > 1: a version-1 plugin cannot express it (query tokens need ABI version 2)";
  }
  if (m.has_extra) {
    return std::string(
        "an extra cache: a version-1 plugin cannot express it (the extra cache needs ABI "
        "version 2)");
  }
  return std::nullopt;
}

MlafuzzDecodeCall make_plugin_call(const mla::DecodeParams& p, MlafuzzRunsOn memory, void* stream,
                                   int abi_version) {
  MlafuzzDecodeCall c;
  std::memset(&c, 0, sizeof c);
  // A version-1 plugin sees the version-1 struct: its size and version (the v2 fields stay 0).
  c.struct_size = abi_version == 1 ? static_cast<uint32_t>(MLAFUZZ_DECODE_CALL_V1_SIZE) : sizeof c;
  c.abi_version = static_cast<uint32_t>(abi_version);
  const mla::CacheGeometry& g = p.geom;
  c.layout = g.layout == mla::Layout::kModel1 ? MLAFUZZ_LAYOUT_MODEL1 : MLAFUZZ_LAYOUT_V32;
  c.nope_dim = g.nope_dim;
  c.rope_dim = g.rope_dim;
  c.scale_tile = g.scale_tile;
  c.page_size = g.page_size;
  c.num_pages = g.num_pages;
  c.page_stride = g.page_stride;
  c.kv_cache_bytes = mla::cache_bytes(g);
  c.token_bytes = mla::token_bytes(g);
  c.d_qk = mla::d_qk(g);
  c.d_v = mla::d_v(g);
  c.invalid_index_rule =
      p.conv.invalid_index == mla::InvalidIndexRule::kMinusOneOnly  ? MLAFUZZ_INVALID_MINUS_ONE_ONLY
      : p.conv.invalid_index == mla::InvalidIndexRule::kAnyNegative ? MLAFUZZ_INVALID_ANY_NEGATIVE
                                                                    : MLAFUZZ_INVALID_OUT_OF_RANGE;
  c.empty_row_lse = p.conv.empty_lse == mla::EmptyRowLse::kPosInf ? MLAFUZZ_EMPTY_LSE_POS_INF
                                                                  : MLAFUZZ_EMPTY_LSE_NEG_INF;
  c.sink_in_lse = p.conv.sink_in_lse ? 1 : 0;
  c.batch = p.batch;
  c.heads = p.heads;
  c.topk = p.topk;
  c.sm_scale = p.sm_scale;
  c.memory = memory;
  c.stream = stream;
  c.q = p.q;
  c.q_head_stride = p.q_head_stride;
  c.q_batch_stride = p.q_batch_stride;
  c.kv_cache = p.kv_cache;
  c.indices = p.indices;
  // Zero strides (hand-built params) mean the contiguous layout of the shapes.
  auto or_default = [](int64_t v, int64_t d) { return v != 0 ? v : d; };
  c.indices_batch_stride = or_default(p.indices_batch_stride, int64_t{p.s_q} * p.topk);
  c.topk_length = p.topk_length;
  c.sink = p.sink;
  c.out = p.out;
  c.out_head_stride = p.out_head_stride;
  c.out_batch_stride = p.out_batch_stride;
  c.lse = p.lse;
  c.lse_batch_stride = or_default(p.lse_batch_stride, int64_t{p.s_q} * p.heads);
  if (abi_version >= 2) {
    // ABI version 2: the production decode's fields (docs/SPEC.md section 8). A version-1 plugin
    // never gets s_q > 1 or an extra cache (beyond_version_1), so its struct needs none.
    c.s_q = p.s_q;
    c.q_token_stride = or_default(p.q_token_stride, p.heads * p.q_head_stride);
    c.indices_token_stride = or_default(p.indices_token_stride, p.topk);
    c.out_token_stride = or_default(p.out_token_stride, p.heads * p.out_head_stride);
    c.lse_token_stride = or_default(p.lse_token_stride, p.heads);
    c.has_extra = p.has_extra ? 1 : 0;
    if (p.has_extra) {
      const mla::CacheGeometry& e = p.extra_geom;
      c.extra_page_size = e.page_size;
      c.extra_num_pages = e.num_pages;
      c.extra_page_stride = e.page_stride;
      c.extra_kv_cache_bytes = mla::cache_bytes(e);
      c.extra_kv_cache = p.extra_kv_cache;
      c.extra_topk = p.extra_topk;
      c.extra_indices = p.extra_indices;
      c.extra_indices_batch_stride =
          or_default(p.extra_indices_batch_stride, int64_t{p.s_q} * p.extra_topk);
      c.extra_indices_token_stride = or_default(p.extra_indices_token_stride, p.extra_topk);
      c.extra_topk_length = p.extra_topk_length;
    }
  }
  return c;
}

std::string resolve_plugin(const std::string& path_or_name) {
  struct stat st {};
  if (path_or_name.find('/') != std::string::npos || stat(path_or_name.c_str(), &st) == 0) {
    return path_or_name;
  }
  // A declared name, as reports and corpus entries carry it ("plugin:<name>").
  if (std::string p = loaded_plugin_path(kPluginPrefix + path_or_name); !p.empty()) return p;
  const std::string search = settings::text("MLAFUZZ_PLUGIN_PATH").value_or("");
  std::stringstream entries(search);
  std::string entry;
  while (std::getline(entries, entry, ':')) {
    if (entry.empty()) continue;
    std::error_code ec;
    std::vector<std::string> files;
    if (std::filesystem::is_directory(entry, ec)) {
      for (const auto& f : std::filesystem::directory_iterator(entry, ec)) {
        if (f.path().extension() == ".so") files.push_back(f.path().string());
      }
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(entry);
    }
    for (const std::string& f : files) {
      try {
        if (load(f).desc.name == path_or_name) return f;
      } catch (const PluginError&) {
        // Not a plugin, or a broken one: it cannot be the one asked for.
      }
    }
  }
  throw PluginError("plugin " + path_or_name + ": no such file, and no plugin of that name is " +
                    "loaded or found in MLAFUZZ_PLUGIN_PATH (" +
                    (search.empty() ? "unset" : "'" + search + "'") +
                    "); name the library: plugin:/path/to/lib.so");
}

std::unique_ptr<Backend> load_plugin_backend(const std::string& path) {
  return std::make_unique<PluginBackend>(load(path));
}

PluginDescription describe_plugin(const std::string& path) {
  PluginDescription d = load(path).desc;
  d.traits.availability = plugin_availability(d);
  return d;
}

std::string loaded_plugin_path(const std::string& backend_name) {
  std::unique_lock<std::mutex> lock;
  const auto& paths = loaded_plugins(lock);
  const auto it = paths.find(backend_name);
  return it == paths.end() ? std::string() : it->second;
}

}  // namespace mlafuzz
